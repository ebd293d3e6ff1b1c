package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// benchRate is far above what one Redis can decide per second, so the limit
// never binds and every call takes the full path: refill, take, write back.
const benchRate = 1_000_000

// BenchmarkTake compares Limiter.Take with go-redis/redis_rate Allow on the
// same redis-server, the same client options and the same goroutine counts.
// Sub-benchmarks are named mode/implementation so that each pair prints
// side by side; the parent prints the ratio ours/redis_rate of each mode.
//
//	go test -run '^$' -bench Take -benchtime 3s ./throttle/
func BenchmarkTake(b *testing.B) {
	srv := redistest.Start(b)
	// ContextTimeoutEnabled, as production clients should set, lets a lone
	// decision fly on its caller's goroutine; redis_rate gets the same client.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	// A handler's context: cancellable, with asynq's deadline.
	hctx, cancel := context.WithTimeout(ctx, time.Hour)
	b.Cleanup(cancel)

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "bench", throttle.PerSecond(benchRate)); err != nil {
		b.Fatalf("SetLimits: %v", err)
	}
	rr := redis_rate.NewLimiter(rdb)
	rrLimit := redis_rate.PerSecond(benchRate)

	impls := []struct {
		name string
		op   func() (allowed bool, err error)
	}{
		{"ours", func() (bool, error) {
			d, err := lim.Take(ctx, "bench")
			return d.Allowed, err
		}},
		{"redis_rate", func() (bool, error) {
			r, err := rr.Allow(ctx, "bench", rrLimit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}},
		{"ours-handler-ctx", func() (bool, error) {
			d, err := lim.Take(hctx, "bench")
			return d.Allowed, err
		}},
	}
	modes := []struct {
		name       string
		goroutines int // 0: serial, on the benchmark goroutine
	}{
		{"serial", 0},
		{"parallel-1", 1},
		{"parallel-32", 32},
	}
	for _, m := range modes {
		rates := make(map[string]float64, len(impls))
		for _, im := range impls {
			b.Run(m.name+"/"+im.name, func(b *testing.B) {
				b.ReportAllocs()
				runDecisions(b, m.goroutines, im.op)
				// The last run of a sub-benchmark is the one reported.
				rates[im.name] = float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rates[im.name], "decisions/s")
			})
		}
		if rates["redis_rate"] > 0 {
			// Printed, not logged: a parent benchmark's log shows only with -v.
			fmt.Printf("# BenchmarkTake/%s: ratio ours/redis_rate %.2fx (%.0f vs %.0f decisions/s)\n",
				m.name, rates["ours"]/rates["redis_rate"], rates["ours"], rates["redis_rate"])
		}
	}
}

// runDecisions runs op b.N times: on the benchmark goroutine when goroutines
// is 0, else spread over exactly that many goroutines (b.RunParallel would
// multiply by GOMAXPROCS).
func runDecisions(b *testing.B, goroutines int, op func() (bool, error)) {
	check := func(allowed bool, err error) bool {
		if err != nil {
			b.Errorf("decision: %v", err)
			return false
		}
		if !allowed {
			b.Errorf("decision refused under a limit that should never bind")
			return false
		}
		return true
	}
	// Warm the connection pool and the script cache outside the timer.
	if !check(op()) {
		return
	}
	b.ResetTimer()
	if goroutines == 0 {
		for range b.N {
			if !check(op()) {
				return
			}
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if !check(op()) {
					return
				}
			}
		})
	}
	wg.Wait()
}
