package metrics_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/metrics"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// One Limiter serves the middleware and the collector: the collector counts
// the middleware's decisions in this process, and reads the keys' limits
// and state from Redis on every scrape.
func ExampleNew() {
	mr, err := miniredis.Run() // real code passes its own Redis client
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerMinute(50)); err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(lim))

	// mux.Use(lim.Middleware()) in a worker; one task run by hand here.
	h := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	task, err := throttle.NewTask("slack:sync", nil, throttle.Key("slack"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = h.ProcessTask(ctx, task)

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mf := range families {
		switch mf.GetName() {
		case "asynq_throttle_decisions_total", "asynq_throttle_limit_rate", "asynq_throttle_limit_period_seconds":
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				fmt.Printf("%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), v)
			}
		}
	}
	// Output:
	// asynq_throttle_decisions_total{key="slack",outcome="ran"} 1
	// asynq_throttle_limit_period_seconds{key="slack",kind="bucket",tier="1",unit="requests"} 60
	// asynq_throttle_limit_rate{key="slack",kind="bucket",tier="1",unit="requests"} 50
}
