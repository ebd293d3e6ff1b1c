package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/metrics"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

var eventMetrics = []string{
	"asynq_throttle_decisions_total", "asynq_throttle_deferrals_total", "asynq_throttle_deferral_copies_total",
	"asynq_throttle_rate_limited_total", "asynq_throttle_leased_total", "asynq_throttle_failure_policy_total",
	"asynq_throttle_redis_errors_total", "asynq_throttle_keys_folded_total", "asynq_throttle_settlements_failed_total",
}

// A scripted sequence of events gives exact counters; keys past the cap are
// folded into "{other}" and counted.
func TestScriptedEventsGiveExactCounters(t *testing.T) {
	c := metrics.New(nil, metrics.WithMaxKeys(2))
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, ev := range []throttle.Event{
		{Key: "slack", Outcome: throttle.Ran, HandlerRan: true, Latency: time.Millisecond},
		{Key: "slack", Outcome: throttle.Ran, HandlerRan: true, Leased: true},
		{Key: "slack", Outcome: throttle.Deferred, Reason: throttle.RefusedByTier, Reserved: true, Latency: time.Millisecond},
		{Key: "slack", Outcome: throttle.Deferred, Reason: throttle.RefusedReserved, Reserved: true, Copied: true, Latency: time.Millisecond},
		{Key: "github", Outcome: throttle.Suspended, Reason: throttle.RefusedBySuspension, Latency: time.Millisecond},
		{Key: "github", Outcome: throttle.Deferred, Reason: throttle.RefusedBySuspension},
		{Key: "github", Outcome: throttle.Failed, Err: fmt.Errorf("decide: %w", context.DeadlineExceeded), Latency: time.Second},
		{Key: "github", Outcome: throttle.Failed, HandlerRan: true, Err: refused, Latency: time.Millisecond},
		{Key: "", Outcome: throttle.Unthrottled, HandlerRan: true},
		{Key: "crm", Outcome: throttle.Ran, HandlerRan: true, Latency: time.Millisecond},
		{Key: "zendesk", Outcome: throttle.Deferred, Reason: throttle.RefusedByQueue, Latency: time.Millisecond},
		{Key: "slack", Outcome: throttle.Deferred, Reason: throttle.RefusedBySlots, Latency: time.Millisecond},
		{Key: "slack", Outcome: throttle.Deferred, Reason: throttle.RefusedBySlots, Copied: true, Latency: time.Millisecond},
		{Key: "slack", Outcome: throttle.Unsettled, HandlerRan: true, Err: refused},
	} {
		c.Observe(ev)
	}
	want := `
# HELP asynq_throttle_decisions_total Middleware decisions by key and outcome (ran, deferred, suspended, unthrottled, failed, rejected).
# TYPE asynq_throttle_decisions_total counter
asynq_throttle_decisions_total{key="{none}",outcome="unthrottled"} 1
asynq_throttle_decisions_total{key="{other}",outcome="deferred"} 1
asynq_throttle_decisions_total{key="{other}",outcome="ran"} 1
asynq_throttle_decisions_total{key="github",outcome="deferred"} 1
asynq_throttle_decisions_total{key="github",outcome="failed"} 2
asynq_throttle_decisions_total{key="github",outcome="suspended"} 1
asynq_throttle_decisions_total{key="slack",outcome="deferred"} 4
asynq_throttle_decisions_total{key="slack",outcome="ran"} 2
# HELP asynq_throttle_deferrals_total Tasks deferred by key, reason (tier, in_flight, suspended, queued, reserved, provider, failure_policy) and whether they hold a reservation.
# TYPE asynq_throttle_deferrals_total counter
asynq_throttle_deferrals_total{key="{other}",reason="queued",reserved="false"} 1
asynq_throttle_deferrals_total{key="github",reason="failure_policy",reserved="false"} 1
asynq_throttle_deferrals_total{key="github",reason="suspended",reserved="false"} 2
asynq_throttle_deferrals_total{key="slack",reason="reserved",reserved="true"} 1
asynq_throttle_deferrals_total{key="slack",reason="in_flight",reserved="false"} 2
asynq_throttle_deferrals_total{key="slack",reason="tier",reserved="true"} 1
# HELP asynq_throttle_deferral_copies_total Deferrals that re-enqueued a copy of the task (plain asynq.Server, or a task's last attempt).
# TYPE asynq_throttle_deferral_copies_total counter
asynq_throttle_deferral_copies_total{key="slack"} 2
# HELP asynq_throttle_rate_limited_total Handlers that reported a rate limit (429 or RateLimited); each suspends the key fleet-wide.
# TYPE asynq_throttle_rate_limited_total counter
asynq_throttle_rate_limited_total{key="github"} 1
# HELP asynq_throttle_leased_total Tasks that ran on a token leased by their process, without a Redis call.
# TYPE asynq_throttle_leased_total counter
asynq_throttle_leased_total{key="slack"} 1
# HELP asynq_throttle_failure_policy_total Decisions Redis could not make, by the failure policy that decided instead (fail_open ran the task, fail_closed deferred it).
# TYPE asynq_throttle_failure_policy_total counter
asynq_throttle_failure_policy_total{key="github",policy="fail_closed"} 1
asynq_throttle_failure_policy_total{key="github",policy="fail_open"} 1
# HELP asynq_throttle_redis_errors_total Failed decisions by error class (timeout, connection, reply, bad_config, other).
# TYPE asynq_throttle_redis_errors_total counter
asynq_throttle_redis_errors_total{class="other",key="github"} 1
asynq_throttle_redis_errors_total{class="timeout",key="github"} 1
# HELP asynq_throttle_keys_folded_total Events counted under key="{other}" because WithMaxKeys distinct keys were already exported.
# TYPE asynq_throttle_keys_folded_total counter
asynq_throttle_keys_folded_total 2
# HELP asynq_throttle_settlements_failed_total Settlements (throttle.Used) Redis could not record: the task's result stands, and the key counts its estimate instead of what it used.
# TYPE asynq_throttle_settlements_failed_total counter
asynq_throttle_settlements_failed_total{key="slack"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), eventMetrics...))

	h := histogram(t, c)
	assert.Equal(t, uint64(9), h.GetSampleCount(), "decisions with a Redis call, the Suspended event not again")
	assert.InDelta(t, 1.008, h.GetSampleSum(), 1e-9)

	counts := c.Counts()
	assert.Equal(t, metrics.KeyCounts{Decisions: map[string]uint64{"ran": 2, "deferred": 4}}, counts["slack"])
	assert.Equal(t, uint64(1), counts["github"].RateLimited)
	assert.Equal(t, uint64(1), counts[metrics.OtherKey].Decisions["ran"])
}

func histogram(t *testing.T, c prometheus.Collector) *dto.Histogram {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "asynq_throttle_decision_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatal("no asynq_throttle_decision_duration_seconds")
	return nil
}

// runTask runs one task through mw the way an asynq server would (without
// a task ID, so no reservation) and returns the handler's error.
func runTask(mw asynq.MiddlewareFunc, task *asynq.Task, h func() error) error {
	return mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return h() })).ProcessTask(context.Background(), task)
}

// The real middleware feeds the collector: a scripted sequence of tasks
// against a real Redis gives exact counters.
func TestMiddlewareFeedsTheCollector(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := metrics.New(nil)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.Limit{N: 2, Per: time.Hour}))
	require.NoError(t, lim.SetLimits(ctx, "github", throttle.PerSecond(1000)))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	quiet := throttle.WithLogger(slog.New(slog.DiscardHandler))
	// No headroom: the scripted takes below count whole tokens.
	mwLim := throttle.NewLimiter(rdb, quiet, throttle.WithHeadroom(0))
	mwLim.OnEvent(c.Observe)
	mw := mwLim.Middleware()
	ok := func() error { return nil }

	// slack: two tokens, then a refusal by its tier (no task ID: no slot; a
	// plain call: deferred by copy).
	for range 3 {
		require.NoError(t, runTask(mw, asynq.NewTask("slack:sync", nil), ok))
	}
	// github: a decision that leases, a task on the lease, a 429 (on a leased
	// token), then a refusal by suspension, then the cached suspension.
	require.NoError(t, runTask(mw, asynq.NewTask("github:sync", nil), ok))
	require.NoError(t, runTask(mw, asynq.NewTask("github:sync", nil), ok))
	require.NoError(t, runTask(mw, asynq.NewTask("github:sync", nil), func() error { return throttle.RateLimited(time.Minute) }))
	require.NoError(t, runTask(mw, asynq.NewTask("github:sync", nil), ok))
	require.NoError(t, runTask(mw, asynq.NewTask("github:sync", nil), ok))
	// No key, and a key without limits.
	require.NoError(t, runTask(mw, asynq.NewTask("cleanup", nil), ok))
	require.NoError(t, runTask(mw, asynq.NewTask("crm:sync", nil), ok))
	// A Redis that refuses connections: fail closed, deferred by copy.
	dead := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { dead.Close() })
	deadLim := throttle.NewLimiter(dead, quiet, throttle.WithTaskRedis(rdb))
	deadLim.OnEvent(c.Observe)
	deadMW := deadLim.Middleware()
	require.NoError(t, runTask(deadMW, asynq.NewTask("slack:sync", nil), ok))

	want := `
# HELP asynq_throttle_decisions_total Middleware decisions by key and outcome (ran, deferred, suspended, unthrottled, failed, rejected).
# TYPE asynq_throttle_decisions_total counter
asynq_throttle_decisions_total{key="{none}",outcome="unthrottled"} 1
asynq_throttle_decisions_total{key="crm",outcome="unthrottled"} 1
asynq_throttle_decisions_total{key="github",outcome="deferred"} 2
asynq_throttle_decisions_total{key="github",outcome="ran"} 3
asynq_throttle_decisions_total{key="github",outcome="suspended"} 1
asynq_throttle_decisions_total{key="slack",outcome="deferred"} 1
asynq_throttle_decisions_total{key="slack",outcome="failed"} 1
asynq_throttle_decisions_total{key="slack",outcome="ran"} 2
# HELP asynq_throttle_deferrals_total Tasks deferred by key, reason (tier, in_flight, suspended, queued, reserved, provider, failure_policy) and whether they hold a reservation.
# TYPE asynq_throttle_deferrals_total counter
asynq_throttle_deferrals_total{key="github",reason="suspended",reserved="false"} 3
asynq_throttle_deferrals_total{key="slack",reason="failure_policy",reserved="false"} 1
asynq_throttle_deferrals_total{key="slack",reason="tier",reserved="false"} 1
# HELP asynq_throttle_deferral_copies_total Deferrals that re-enqueued a copy of the task (plain asynq.Server, or a task's last attempt).
# TYPE asynq_throttle_deferral_copies_total counter
asynq_throttle_deferral_copies_total{key="github"} 3
asynq_throttle_deferral_copies_total{key="slack"} 2
# HELP asynq_throttle_rate_limited_total Handlers that reported a rate limit (429 or RateLimited); each suspends the key fleet-wide.
# TYPE asynq_throttle_rate_limited_total counter
asynq_throttle_rate_limited_total{key="github"} 1
# HELP asynq_throttle_leased_total Tasks that ran on a token leased by their process, without a Redis call.
# TYPE asynq_throttle_leased_total counter
asynq_throttle_leased_total{key="github"} 2
# HELP asynq_throttle_failure_policy_total Decisions Redis could not make, by the failure policy that decided instead (fail_open ran the task, fail_closed deferred it).
# TYPE asynq_throttle_failure_policy_total counter
asynq_throttle_failure_policy_total{key="slack",policy="fail_closed"} 1
# HELP asynq_throttle_redis_errors_total Failed decisions by error class (timeout, connection, reply, bad_config, other).
# TYPE asynq_throttle_redis_errors_total counter
asynq_throttle_redis_errors_total{class="connection",key="slack"} 1
# HELP asynq_throttle_keys_folded_total Events counted under key="{other}" because WithMaxKeys distinct keys were already exported.
# TYPE asynq_throttle_keys_folded_total counter
asynq_throttle_keys_folded_total 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), eventMetrics...))
	// Decisions in Redis: slack 3, github 1 (the first; after the 429 the
	// process defers the key's tasks from its own cached suspension), crm 1,
	// the failed one 1.
	assert.Equal(t, uint64(6), histogram(t, c).GetSampleCount())
}

func TestErrorClassSortsRedisErrors(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	replyErr := rdb.Do(ctx, "NOSUCHCOMMAND").Err()
	require.Error(t, replyErr)
	dead := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer dead.Close()
	refused := dead.Ping(ctx).Err()
	require.Error(t, refused)
	closed := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	closed.Close()
	short, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-short.Done()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"reply", fmt.Errorf("throttle: key %q: decide: %w", "k", replyErr), metrics.ClassReply},
		{"refused", fmt.Errorf("decide: %w", refused), metrics.ClassConnection},
		{"client closed", closed.Ping(ctx).Err(), metrics.ClassConnection},
		{"deadline", fmt.Errorf("decide: %w", rdb.Ping(short).Err()), metrics.ClassTimeout},
		{"bad config", &throttle.ConfigError{Key: "k", Field: "rate:1", Reason: "NaN"}, metrics.ClassBadConfig},
		{"other", errors.New("something else"), metrics.ClassOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, metrics.ErrorClass(tc.err), "ErrorClass(%v)", tc.err)
		})
	}
}

// gauges scrapes c and returns every gauge as "name{l=v,...}" -> value.
func gauges(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_GAUGE {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// On scrape, the state of every key comes from a real Redis.
func TestScrapeReadsEveryKeysStateFromRedis(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5).WithBurst(8), throttle.PerMinute(100)))
	require.NoError(t, lim.SetLimits(ctx, "github", throttle.Limit{N: 1, Per: time.Hour}))
	_, err := lim.Take(ctx, "github")
	require.NoError(t, err)
	for i := range 3 {
		reserve(t, rdb, "github", fmt.Sprint("task-", i))
	}
	require.NoError(t, lim.Suspend(ctx, "slack", time.Minute))
	// stripe: a window and an in-flight limit, set twice; two calls hold
	// slots (one of them costs 3 calls of the window).
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.InFlight(2)))
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.Window(100, time.Minute), throttle.InFlight(4)))
	_, err = lim.Take(ctx, "stripe", throttle.Cost(3))
	require.NoError(t, err)
	_, err = lim.Take(ctx, "stripe")
	require.NoError(t, err)
	// zendesk: adaptive, halved by a suspension.
	require.NoError(t, lim.SetLimits(ctx, "zendesk", throttle.PerSecond(20), throttle.Adaptive(time.Minute)))
	require.NoError(t, lim.Suspend(ctx, "zendesk", time.Millisecond))

	g := gauges(t, metrics.New(lim))
	assert.Equal(t, 1.0, g["asynq_throttle_state_up{}"])
	assert.Equal(t, 4.0, g["asynq_throttle_state_keys{}"])
	assert.Equal(t, 0.0, g["asynq_throttle_state_key_errors{}"])
	for name, want := range map[string]float64{
		"limit_rate{key=slack,kind=bucket,tier=1,unit=requests}":            5,
		"limit_rate_in_force{key=slack,kind=bucket,tier=1,unit=requests}":   5,
		"limit_rate{key=zendesk,kind=bucket,tier=1,unit=requests}":          20,
		"limit_rate_in_force{key=zendesk,kind=bucket,tier=1,unit=requests}": 10,
		"limit_burst{key=slack,kind=bucket,tier=1,unit=requests}":           8,
		"limit_period_seconds{key=slack,kind=bucket,tier=1,unit=requests}":  1,
		"limit_rate{key=slack,kind=bucket,tier=2,unit=requests}":            100,
		"limit_burst{key=slack,kind=bucket,tier=2,unit=requests}":           100,
		"limit_period_seconds{key=slack,kind=bucket,tier=2,unit=requests}":  60,
		"tokens{key=slack,kind=bucket,tier=1,unit=requests}":                8,
		"tokens{key=slack,kind=bucket,tier=2,unit=requests}":                100,
		"reservations{key=slack}":                                           0,
		"queued_seconds{key=slack}":                                         0,
		"limit_rate{key=github,kind=bucket,tier=1,unit=requests}":           1,
		"limit_period_seconds{key=github,kind=bucket,tier=1,unit=requests}": 3600,
		"reservations{key=github}":                                          3,
		"suspended_seconds{key=github}":                                     0,
		"limits_generation{key=github}":                                     1,
		"limit_rate{key=stripe,kind=window,tier=1,unit=requests}":           100,
		"limit_period_seconds{key=stripe,kind=window,tier=1,unit=requests}": 60,
		"limit_burst{key=stripe,kind=window,tier=1,unit=requests}":          100,
		"tokens{key=stripe,kind=window,tier=1,unit=requests}":               96,
		"in_flight{key=stripe}":                                             2,
		"in_flight_limit{key=stripe}":                                       4,
		"limits_generation{key=stripe}":                                     2,
	} {
		assert.Equal(t, want, g["asynq_throttle_"+name], name)
	}
	assert.InDelta(t, 60, g["asynq_throttle_suspended_seconds{key=slack}"], 2)
	// Three slots an hour apart: the last is about 3 h away.
	assert.InDelta(t, 3*3600, g["asynq_throttle_queued_seconds{key=github}"], 10)
	assert.Less(t, g["asynq_throttle_tokens{key=github,kind=bucket,tier=1,unit=requests}"], 0.01)
	assert.NotContains(t, g, "asynq_throttle_in_flight{key=slack}", "only keys with an in-flight limit")
	assert.Empty(t, withPrefix(g, "asynq_throttle_limit_rate{key=stripe,kind=inflight"), "an in-flight limit is not a tier")
	assert.Empty(t, withPrefix(g, "asynq_throttle_limit_rate{key=zendesk,kind=adaptive"), "nor is an adaptive one")

	// WithMaxKeys bounds the keys whose state is read.
	g = gauges(t, metrics.New(lim, metrics.WithMaxKeys(1)))
	assert.Equal(t, 4.0, g["asynq_throttle_state_keys{}"])
	assert.Contains(t, g, "asynq_throttle_reservations{key=github}")
	assert.NotContains(t, g, "asynq_throttle_reservations{key=slack}")
	assert.NotContains(t, g, "asynq_throttle_in_flight{key=stripe}")

}

// withPrefix returns the names in g that start with prefix, sorted.
func withPrefix(g map[string]float64, prefix string) []string {
	var out []string
	for name := range g {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Each tier's gauges say what it counts: unit="requests", or the unit its
// limit is in (Limit.In); the in-flight limit has no tier series.
func TestScrapeLabelsEachTierWithItsUnit(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "openai", throttle.PerMinute(500), throttle.PerMinute(30000).In("tokens"),
		throttle.Window(1000000, 24*time.Hour).In("tokens"), throttle.FixedWindow(40000, time.Hour).In("input-tokens"), throttle.InFlight(16)))
	_, err := lim.Take(ctx, "openai", throttle.Uses("tokens", 12000), throttle.Uses("input-tokens", 300))
	require.NoError(t, err)

	g := gauges(t, metrics.New(lim))
	assert.Equal(t, []string{
		"asynq_throttle_tokens{key=openai,kind=bucket,tier=1,unit=requests}",
		"asynq_throttle_tokens{key=openai,kind=bucket,tier=2,unit=tokens}",
		"asynq_throttle_tokens{key=openai,kind=fixed,tier=4,unit=input-tokens}",
		"asynq_throttle_tokens{key=openai,kind=window,tier=3,unit=tokens}",
	}, withPrefix(g, "asynq_throttle_tokens{key=openai,"))
	for name, want := range map[string]float64{
		"limit_rate{key=openai,kind=bucket,tier=1,unit=requests}":              500,
		"limit_rate{key=openai,kind=bucket,tier=2,unit=tokens}":                30000,
		"limit_rate_in_force{key=openai,kind=bucket,tier=2,unit=tokens}":       30000,
		"limit_burst{key=openai,kind=bucket,tier=2,unit=tokens}":               30000,
		"limit_period_seconds{key=openai,kind=bucket,tier=2,unit=tokens}":      60,
		"limit_rate{key=openai,kind=window,tier=3,unit=tokens}":                1000000,
		"tokens{key=openai,kind=window,tier=3,unit=tokens}":                    1000000 - 12000,
		"limit_rate{key=openai,kind=fixed,tier=4,unit=input-tokens}":           40000,
		"limit_period_seconds{key=openai,kind=fixed,tier=4,unit=input-tokens}": 3600,
		"in_flight_limit{key=openai}":                                          16,
		"in_flight{key=openai}":                                                1,
	} {
		assert.Equal(t, want, g["asynq_throttle_"+name], name)
	}
	// The bucket of tokens: 30000 less the 12000 taken, refilling at 500 a
	// second; the fixed hour: 40000 less 300, unless the hour turned.
	assert.InDelta(t, 18000, g["asynq_throttle_tokens{key=openai,kind=bucket,tier=2,unit=tokens}"], 5000)
	assert.Contains(t, []float64{39700, 40000}, g["asynq_throttle_tokens{key=openai,kind=fixed,tier=4,unit=input-tokens}"])
	assert.Empty(t, withPrefix(g, "asynq_throttle_limit_rate{key=openai,kind=inflight"), "an in-flight limit is not a tier")
}

// A Redis that is down makes the scrape report state_up 0 and no state.
func TestScrapeWithRedisDownReportsStateUp0(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer dead.Close()
	g := gauges(t, metrics.New(throttle.NewLimiter(dead), metrics.WithScrapeTimeout(time.Second)))
	assert.Equal(t, 0.0, g["asynq_throttle_state_up{}"])
	assert.NotContains(t, g, "asynq_throttle_state_keys{}")
}

// A task refused by slots (its key's one slot in flight is held by a
// running task) is counted as deferred with reason in_flight, and the
// scrape shows the slot held, then given back.
func TestTaskRefusedBySlotsCountsAsAnInFlightDeferral(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(slog.DiscardHandler)))
	c := metrics.New(lim)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(100), throttle.InFlight(1)))
	mw := lim.Middleware()

	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- runTask(mw, asynq.NewTask("crm:sync", nil), func() error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	assert.Equal(t, 1.0, gauges(t, c)["asynq_throttle_in_flight{key=crm}"], "the running task holds the slot")
	ran := false
	require.NoError(t, runTask(mw, asynq.NewTask("crm:sync", nil), func() error { ran = true; return nil }))
	assert.False(t, ran, "the second task ran beside the first: InFlight(1) not obeyed")
	close(release)
	require.NoError(t, <-first)

	want := `
# HELP asynq_throttle_decisions_total Middleware decisions by key and outcome (ran, deferred, suspended, unthrottled, failed, rejected).
# TYPE asynq_throttle_decisions_total counter
asynq_throttle_decisions_total{key="crm",outcome="deferred"} 1
asynq_throttle_decisions_total{key="crm",outcome="ran"} 1
# HELP asynq_throttle_deferrals_total Tasks deferred by key, reason (tier, in_flight, suspended, queued, reserved, provider, failure_policy) and whether they hold a reservation.
# TYPE asynq_throttle_deferrals_total counter
asynq_throttle_deferrals_total{key="crm",reason="in_flight",reserved="false"} 1
# HELP asynq_throttle_deferral_copies_total Deferrals that re-enqueued a copy of the task (plain asynq.Server, or a task's last attempt).
# TYPE asynq_throttle_deferral_copies_total counter
asynq_throttle_deferral_copies_total{key="crm"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"asynq_throttle_decisions_total", "asynq_throttle_deferrals_total", "asynq_throttle_deferral_copies_total"))
	g := gauges(t, c)
	assert.Equal(t, 0.0, g["asynq_throttle_in_flight{key=crm}"], "the slot is given back when the handler returns")
	assert.Equal(t, 1.0, g["asynq_throttle_in_flight_limit{key=crm}"])
}

// reserve reserves a run time within a day for task id under key, as the
// middleware does when it refuses a task.
func reserve(t testing.TB, rdb redis.UniversalClient, key, id string) {
	t.Helper()
	keys, err := keyspace.RedisKeys(keyspace.DefaultPrefix, key)
	require.NoError(t, err)
	r, err := lua.Decide(context.Background(), lua.NewRunner(rdb), keys, lua.DecideArgs{
		TaskID: id, Horizon: 24 * time.Hour, Granule: time.Second, Lapse: 5 * time.Minute, SlotExpiry: 30 * time.Second})
	require.NoError(t, err)
	require.False(t, r.Reserved.IsZero(), "a reservation for %s under %s: %+v", id, key, r)
}

// enqueueFor books n tasks of key for tenant ("" the default tenant) with
// the library's Enqueue.
func enqueueFor(t *testing.T, lim *throttle.Limiter, client *asynq.Client, key, tenant string, n int) {
	t.Helper()
	opts := []asynq.Option{throttle.Key(key)}
	if tenant != "" {
		opts = append(opts, throttle.Tenant(tenant))
	}
	for range n {
		task, err := throttle.NewTask(key+":call", nil, opts...)
		require.NoError(t, err)
		_, err = lim.Enqueue(context.Background(), client, task)
		require.NoError(t, err)
	}
}

// On scrape, each tenant with work booked on a key has its share, backlog
// and work admitted; the default tenant is tenant="{default}"; a tenant
// with only a weight set has no series, nor has a key without tenants.
func TestScrapeShowsTheTenantsWithWorkBooked(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, lim.SetLimits(ctx, "llm", throttle.PerMinute(30)))
	require.NoError(t, lim.SetWeights(ctx, "llm", map[string]int{"gold": 3, "silver": 2}))
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	for _, tenant := range []string{"gold", "plain", ""} {
		enqueueFor(t, lim, client, "llm", tenant, 4)
	}

	g := gauges(t, metrics.New(lim))
	for tenant, share := range map[string]float64{"gold": 0.6, "plain": 0.2, "{default}": 0.2} {
		s := "{key=llm,tenant=" + tenant + "}"
		assert.InDelta(t, share, g["asynq_throttle_tenant_share"+s], 1e-9, tenant)
		assert.Greater(t, g["asynq_throttle_tenant_backlog"+s], 0.0, tenant)
		assert.LessOrEqual(t, g["asynq_throttle_tenant_backlog"+s], 5.0, "%s: about its 4 tasks", tenant)
		assert.Contains(t, g, "asynq_throttle_tenant_admitted"+s, tenant)
	}
	n := 0
	for name := range g {
		if strings.HasPrefix(name, "asynq_throttle_tenant_") {
			n++
		}
	}
	assert.Equal(t, 9, n, "three gauges for each of the three tenants with work booked: not silver (a weight only), nothing for slack")
}

// The tenant label is bounded: a key with more than 100 tenants with work
// booked exports the 100 that Inspect reads.
func TestScrapeExportsAtMost100TenantsPerKey(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerMinute(600)))
	for i := range 110 {
		enqueueFor(t, lim, client, "crm", fmt.Sprint("customer-", i), 1)
	}
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	require.Len(t, st.Tenants, 100, "Inspect reads the 100 next in line")

	g := gauges(t, metrics.New(lim))
	n := 0
	for name := range g {
		if strings.HasPrefix(name, "asynq_throttle_tenant_share{") {
			n++
		}
	}
	assert.Equal(t, 100, n)
}

// The key label's cap keeps the keys with limits of their own first
// (issue 35, item 10): 3,000 keys a producer made up, seen before "slack",
// fill the cap, and once a scrape has found slack's limits in Redis its
// events get a series of their own; the made-up key that gave its label
// up counts under key="{other}", nothing lost. Their state, on default
// limits, goes after slack's too.
func TestTheKeyCapKeepsConfiguredKeysFirst(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	op := throttle.NewLimiter(rdb)
	require.NoError(t, op.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	// A worker with default limits: made-up keys get state in Redis.
	lim := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100)))
	for i := range 3 {
		_, err := lim.Take(ctx, fmt.Sprintf("aaa-forged-%d", i))
		require.NoError(t, err)
	}
	require.NoError(t, lim.Close())
	c := metrics.New(lim, metrics.WithMaxKeys(100))
	for i := range 3000 {
		c.Observe(throttle.Event{Key: fmt.Sprintf("forged-%04d", i), Outcome: throttle.Ran, HandlerRan: true})
	}
	c.Observe(throttle.Event{Key: "slack", Outcome: throttle.Ran, HandlerRan: true})
	counts := c.Counts()
	require.NotContains(t, counts, "slack", "before a scrape, first come first served")

	g := gauges(t, c) // the scrape finds slack's limits
	assert.Contains(t, g, "asynq_throttle_tokens{key=slack,kind=bucket,tier=1,unit=requests}", "slack's state first")
	c2 := metrics.New(lim, metrics.WithMaxKeys(1))
	g2 := gauges(t, c2)
	assert.Contains(t, g2, "asynq_throttle_tokens{key=slack,kind=bucket,tier=1,unit=requests}", "slack's state before the made-up keys', on a cap of 1")
	assert.Equal(t, 4.0, g2["asynq_throttle_state_keys{}"])

	c.Observe(throttle.Event{Key: "slack", Outcome: throttle.Deferred, Reason: throttle.RefusedByTier})
	counts = c.Counts()
	require.Contains(t, counts, "slack", "slack has a series of its own after the scrape")
	assert.Equal(t, uint64(1), counts["slack"].Decisions["deferred"])
	total := uint64(0)
	for _, kc := range counts {
		total += kc.Decisions["ran"] + kc.Decisions["deferred"]
	}
	assert.Equal(t, uint64(3002), total, "every event counted once, under some label")
	assert.Len(t, counts, 101, "100 keys and {other}")
	for key := range counts {
		assert.NotEqual(t, "_other", key)
	}
	assert.Contains(t, counts, "{other}")
}

// One key Redis cannot read (a key of the wrong type under the prefix)
// is counted as an error, and every other key's state is exported
// (issue 35, item 9).
func TestScrapeSkipsABrokenKeyAndReadsTheRest(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	require.NoError(t, lim.SetLimits(ctx, "zendesk", throttle.PerSecond(7)))
	require.NoError(t, rdb.Set(ctx, "throttle:{broken}:b", "x", 0).Err())
	g := gauges(t, metrics.New(lim))
	assert.Equal(t, 1.0, g["asynq_throttle_state_up{}"])
	assert.Equal(t, 3.0, g["asynq_throttle_state_keys{}"])
	assert.Equal(t, 1.0, g["asynq_throttle_state_key_errors{}"])
	assert.Equal(t, 5.0, g["asynq_throttle_limit_rate{key=slack,kind=bucket,tier=1,unit=requests}"])
	assert.Equal(t, 7.0, g["asynq_throttle_limit_rate{key=zendesk,kind=bucket,tier=1,unit=requests}"])
}
