package lua

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// BenchmarkFairTenants measures, on a real Redis, what fair shares cost
// with many tenants waiting on one key: the decision's time (a fresh task
// of a random tenant booked behind the others) and the key's memory, per
// active tenant (its record in the hash and its member of the active set)
// and per fair reservation (its member of the reservations and of the
// start tags). docs/tenants.md quotes it:
//
//	go test -run '^$' -bench FairTenants ./internal/lua/
func BenchmarkFairTenants(b *testing.B) {
	for _, n := range []int{2, 100, 10000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			ctx := context.Background()
			rdb := redistest.Start(b).Client(b)
			run := NewRunner(rdb)
			k := Keys{Bucket: "p:{k}:b", Reservations: "p:{k}:r", Slots: "p:{k}:f", Tenants: "p:{k}:a", Tags: "p:{k}:t", Config: "p:{k}:c"}
			if _, err := SetLimits(ctx, run, k, []Tier{{Rate: 1_000_000, PerMS: 3_600_000, Burst: 1}}, nil); err != nil {
				b.Fatal(err)
			}
			args := func(tenant, id string) DecideArgs {
				return DecideArgs{Fair: true, Tenant: tenant, TaskID: id, Horizon: time.Hour, Lapse: time.Hour}
			}
			// Every tenant books one task: all n are active.
			for i := range n {
				if _, err := Decide(ctx, run, k, args(fmt.Sprintf("tenant-%05d", i), fmt.Sprintf("seed-%d", i))); err != nil {
					b.Fatal(err)
				}
			}
			mem := func(key string) int64 { return rdb.MemoryUsage(ctx, key, 0).Val() }
			tenantBytes := float64(mem(k.Bucket)+mem(k.Tenants)) / float64(n)
			resvBytes := float64(mem(k.Reservations)+mem(k.Tags)) / float64(n)
			b.ResetTimer()
			for i := range b.N {
				if _, err := Decide(ctx, run, k, args(fmt.Sprintf("tenant-%05d", i%n), fmt.Sprintf("task-%d", i))); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(tenantBytes, "B/tenant")
			b.ReportMetric(resvBytes, "B/reservation")
		})
	}
}
