package throttle_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Acme, a provider Observe does not know, states its quota as
// "Acme-Quota: 120/min" and, when it turns a call away, answers 200 with
// "Acme-Wait-Ms: 1500". WithDialect teaches Observe to read both: the
// quota lowers the key's limits (10x too high here) fleet-wide, the wait
// suspends the key.
func ExampleWithDialect() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()

	acme := func(resp *http.Response) (throttle.Limit, time.Duration) {
		var quota throttle.Limit
		if n, per, ok := strings.Cut(resp.Header.Get("Acme-Quota"), "/"); ok && per == "min" {
			if v, err := strconv.Atoi(n); err == nil {
				quota = throttle.PerMinute(v)
			}
		}
		ms, _ := strconv.Atoi(resp.Header.Get("Acme-Wait-Ms"))
		return quota, time.Duration(ms) * time.Millisecond
	}
	lim := throttle.NewLimiter(rdb, throttle.WithDialect("acme", acme))
	if err := lim.SetLimits(ctx, "acme:eu", throttle.PerMinute(1200)); err != nil {
		fmt.Println(err)
		return
	}
	answers := []map[string]string{
		{"Acme-Quota": "120/min"},
		{"Acme-Quota": "120/min", "Acme-Wait-Ms": "1500"},
	}
	for _, answer := range answers {
		h := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			// The provider's answer; a real handler gets it from http.Client.Do.
			rec := httptest.NewRecorder()
			for k, v := range answer {
				rec.Header().Set(k, v)
			}
			resp := rec.Result()
			defer resp.Body.Close()
			err := throttle.Observe(ctx, resp)
			fmt.Println("handler:", err)
			return err
		}))
		task, err := throttle.NewTask("acme:sync", nil, throttle.Key("acme:eu"))
		if err != nil {
			fmt.Println(err)
			return
		}
		_ = h.ProcessTask(ctx, task)
		st, _ := lim.Inspect(ctx, "acme:eu")
		fmt.Println("in force:", st.InForce, "suspended for", st.SuspendedFor)
	}
	// Output:
	// handler: <nil>
	// in force: [120/1m0s burst 120] suspended for 0s
	// handler: throttle: rate limited by provider, retry after 1.5s
	// in force: [120/1m0s burst 120] suspended for 1.5s
}
