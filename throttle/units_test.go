package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// llmLimits are the example: 500 requests and 30,000 tokens a
// minute, 16 in flight.
func llmLimits() []throttle.Limit {
	return []throttle.Limit{throttle.PerMinute(500), throttle.PerMinute(30000).In("tokens"), throttle.InFlight(16)}
}

// slowLLMLimits are llmLimits' first two tiers refilling per hour: tests
// that read exact token counts between calls then see a token refill in
// 120 ms at least, not in 2 ms, however busy the machine.
func slowLLMLimits() []throttle.Limit {
	return []throttle.Limit{throttle.PerHour(500), throttle.PerHour(30000).In("tokens")}
}

// SetLimits keeps each tier's unit, reads it back, and refuses a bad one
// naming the field.
func TestLimitsInAUnit(t *testing.T) {
	r := newRig(t)
	r.setLimits("llm", llmLimits()...)
	st := r.inspect("llm")
	want := []throttle.Limit{throttle.PerMinute(500).WithBurst(500), throttle.PerMinute(30000).WithBurst(30000).In("tokens"), throttle.InFlight(16)}
	assert.Equal(t, want, st.Limits, "the limits as set, units and all")
	assert.Equal(t, "30000/1m0s burst 30000 in tokens", st.Limits[1].String())
	assert.Equal(t, throttle.PerMinute(5), throttle.PerMinute(5).In("requests"), "requests is the default unit")

	for _, tc := range []struct {
		name  string
		l     []throttle.Limit
		field string
	}{
		{"uppercase", []throttle.Limit{throttle.PerSecond(1).In("Tokens")}, "limits[0].Unit"},
		{"too long", []throttle.Limit{throttle.PerSecond(1).In("t123456789012345678901234567890123")}, "limits[0].Unit"},
		{"on an in-flight limit", []throttle.Limit{throttle.PerSecond(1), throttle.InFlight(2).In("tokens")}, "limits[1].Unit"},
		{"same kind, period and unit", []throttle.Limit{throttle.PerSecond(1).In("tokens"), throttle.PerSecond(2).In("tokens")}, "limits[1].Per"},
	} {
		err := r.lim.SetLimits(r.ctx, "bad", tc.l...)
		require.ErrorIs(t, err, throttle.ErrInvalidLimit, tc.name)
		assert.Contains(t, err.Error(), tc.field, tc.name)
	}
	require.NoError(t, r.lim.SetLimits(r.ctx, "two", throttle.PerSecond(1), throttle.PerSecond(1).In("tokens")), "one period in two units: two tiers")
}

// NewTask carries Uses in the task's headers and refuses a bad unit, a
// count out of range and a unit given twice, naming the option.
func TestUsesGoesThroughNewTask(t *testing.T) {
	task, err := throttle.NewTask("llm:call", nil, throttle.Key("llm"), throttle.Uses("tokens", 1200), throttle.Uses("input-tokens", 300), throttle.Uses("requests", 2))
	require.NoError(t, err)
	assert.Equal(t, "input-tokens=300,tokens=1200", task.Headers()["throttle-uses"])
	assert.Equal(t, "2", task.Headers()["throttle-cost"], `Uses("requests", n) is Cost(n)`)
	for _, tc := range []struct {
		opt  []asynq.Option
		want string
	}{
		{[]asynq.Option{throttle.Uses("Tokens", 1)}, `unit "Tokens"`},
		{[]asynq.Option{throttle.Uses("tokens", -1)}, "from 0 to"},
		{[]asynq.Option{throttle.Uses("tokens", 1), throttle.Uses("tokens", 2)}, `a second Uses of unit "tokens"`},
		{[]asynq.Option{throttle.Uses("requests", 0)}, "the cost must be from 1"},
	} {
		_, err := throttle.NewTask("llm:call", nil, tc.opt...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// Take takes units as a task does, all or nothing, and refuses options it
// does not take.
func TestTakeTakesUnits(t *testing.T) {
	r := newRig(t)
	r.setLimits("llm", llmLimits()[:2]...)
	d, err := r.lim.Take(r.ctx, "llm", throttle.Uses("tokens", 29000))
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = r.lim.Take(r.ctx, "llm", throttle.Uses("tokens", 2000))
	require.NoError(t, err)
	require.False(t, d.Allowed, "1,000 tokens left")
	assert.Equal(t, 2, d.Tier, "refused by the tokens tier")
	assert.Equal(t, 2*time.Second, d.RetryAfter, "1,000 more tokens at 500 a second")
	st := r.inspect("llm")
	assert.Equal(t, []float64{499, 1000}, st.Tokens, "the refused call took no request")

	_, err = r.lim.Take(r.ctx, "llm", throttle.Uses("tokens", 30001))
	require.ErrorIs(t, err, throttle.ErrCostTooHigh)
	assert.Contains(t, err.Error(), "30001 tokens")
	_, err = r.lim.Take(r.ctx, "llm", asynq.ProcessIn(time.Second))
	require.Error(t, err, "an asynq option is not Take's")
	assert.Contains(t, err.Error(), "Take takes Cost, Uses, Tenant and Key (further keys) only")
}

// A handler settles each unit with Used: a generous estimate is given back
// at once, a surcharge taken, requests settled alone; outside a handler,
// or with a bad unit, Used is an error.
func TestUsedSettlesEachUnitInTheHandler(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "llm", slowLLMLimits()...))
	run := func(h func(ctx context.Context) error, opts ...asynq.Option) {
		t.Helper()
		opts = append([]asynq.Option{throttle.Key("llm")}, opts...)
		err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return h(ctx) })).
			ProcessTask(ctx, newTask(t, "llm:call", nil, opts...))
		require.NoError(t, err)
	}
	tokens := func() []float64 {
		t.Helper()
		st, err := lim.Inspect(ctx, "llm")
		require.NoError(t, err)
		return st.Tokens
	}
	run(func(ctx context.Context) error {
		assert.InDeltaSlice(t, []float64{499, 10000}, tokens(), 5, "the estimate taken: 20,000 tokens")
		return throttle.Used(ctx, "tokens", 1500)
	}, throttle.Uses("tokens", 20000))
	assert.InDeltaSlice(t, []float64{499, 28500}, tokens(), 5, "an estimate of 20,000 settled at 1,500")

	run(func(ctx context.Context) error {
		require.NoError(t, throttle.Used(ctx, "tokens", 3000))
		require.NoError(t, throttle.Used(ctx, "tokens", 3500), "a second Used replaces the first")
		return throttle.Used(ctx, "requests", 3)
	})
	assert.InDeltaSlice(t, []float64{496, 25000}, tokens(), 5, "3,500 tokens said by a task that estimated none; 3 requests")

	assert.ErrorContains(t, throttle.Used(ctx, "tokens", 1), "Used needs the context of a handler")
	run(func(ctx context.Context) error {
		err := throttle.Used(ctx, "Tokens", 1)
		assert.ErrorContains(t, err, `unit "Tokens"`)
		err = throttle.Used(ctx, "tokens", -1)
		assert.ErrorContains(t, err, "from 0 to")
		return nil
	})
}

// A task the middleware cannot run takes nothing of any unit: a malformed
// uses header fails it for good, naming the header.
func TestAMalformedUsesHeaderIsRejected(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "llm", llmLimits()[:2]...))
	task := asynq.NewTaskWithHeaders("llm:call", nil, map[string]string{"throttle-key": "llm", "throttle-uses": "tokens=lots"})
	err := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Fatal("ran a task with a malformed uses header")
		return nil
	})).ProcessTask(ctx, task)
	require.Error(t, err)
	assert.True(t, errors.Is(err, asynq.SkipRetry), "failed for good: %v", err)
	assert.Contains(t, err.Error(), "throttle-uses")
}

// On a busy key with units, Used below the estimate gives back the unused
// tokens even after the bucket refilled them: the bucket owed more than the
// refund all the time since the call (lib.lua's M), so no refill was lost
// to a full bucket. Without M (a key of requests alone), a bucket gives
// back only what has not refilled since the call: here nothing. (bench L:
// at 33,333 tokens/s a 2,000-token estimate refills in 60 ms, so an
// estimate well above the usage was charged in full.)
func TestUsedGivesBackOnABusyKeyWithUnits(t *testing.T) {
	for _, tc := range []struct {
		name, unit string
		want       float64
	}{
		{"tokens tier (units)", "tokens", 2010 + 1500},
		{"requests alone (no M)", "requests", 2010},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, quietLog, throttle.WithHeadroom(0), throttle.WithLease(0, 0))
			l := throttle.Limit{N: 10000, Per: time.Second, Burst: 10000}
			limits := []throttle.Limit{l.In(tc.unit)}
			if tc.unit != "requests" {
				limits = append(limits, throttle.PerSecond(1000000)) // a request tier beside
			}
			r.setLimits("llm", limits...)
			d, err := r.lim.Take(r.ctx, "llm", throttle.Uses(tc.unit, 8000)) // the key is busy
			require.NoError(t, err)
			require.True(t, d.Allowed)
			r.advance(time.Millisecond)
			err = r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				r.advance(200 * time.Millisecond) // the call: its 2,000 tokens refill meanwhile
				return throttle.Used(ctx, tc.unit, 500)
			})).ProcessTask(r.ctx, newTask(t, "llm:call", nil, throttle.Key("llm"), throttle.Uses(tc.unit, 2000)))
			require.NoError(t, err)
			assert.InDelta(t, tc.want, r.inspect("llm").Tokens[0], 0.5, "tokens after Used(500) of an estimate of 2,000")
		})
	}
}

// A handler run with nothing taken (its key had no limits, or Redis could
// not decide under WithFailOpen) has Used take all it says: limits set
// while it ran count its usage in full, not its usage less an estimate
// never taken.
func TestUsedTakesAllWhenNothingWasTaken(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	var outcome throttle.Outcome
	lim.OnEvent(func(ev throttle.Event) { outcome = ev.Outcome })
	err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		require.NoError(t, lim.SetLimits(ctx, "llm", slowLLMLimits()...)) // mid-flight
		return throttle.Used(ctx, "tokens", 500)
	})).ProcessTask(ctx, newTask(t, "llm:call", nil, throttle.Key("llm"), throttle.Uses("tokens", 1000)))
	require.NoError(t, err)
	assert.Equal(t, throttle.Unthrottled, outcome, "run with no limits")
	st, err := lim.Inspect(ctx, "llm")
	require.NoError(t, err)
	assert.InDelta(t, 30000-500, st.Tokens[1], 5, "the 500 used, taken in full")
}
