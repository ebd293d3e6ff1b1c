package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// eachDeadlineMode runs test on a client that ignores context deadlines
// and on one that honours them (ContextTimeoutEnabled): the two ways a
// client bounds its I/O.
func eachDeadlineMode(t *testing.T, test func(t *testing.T, cte bool)) {
	for _, cte := range []bool{false, true} {
		name := "context deadlines ignored"
		if cte {
			name = "ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) { test(t, cte) })
	}
}

// Against a Redis that refuses connections, every Limiter call fails
// within its WithTimeout with an error that names the cause (go-redis
// itself reports only the end of the call's context), whichever way the
// client bounds its I/O; and the calls after the first fail at once.
func TestUnreachableRedisNamesTheCause(t *testing.T) {
	// Not in parallel: its bounds are on how long calls take, and the
	// package's parallel tests beside it made a CPU hog of their own.
	const timeout = time.Second // a loaded machine took over 500 ms to answer a decision, or to see a refused dial
	eachDeadlineMode(t, func(t *testing.T, cte bool) {
		addr := redistest.ClosedAddr(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: cte})
		t.Cleanup(func() { _ = rdb.Close() })
		lim := throttle.NewLimiter(rdb, quietLog, throttle.WithTimeout(timeout))
		ctx := context.Background()
		var failed error
		mwLim := throttle.NewLimiter(rdb, throttle.WithTimeout(timeout), throttle.WithFailOpen(), quietLog)
		mwLim.OnEvent(func(ev throttle.Event) {
			if ev.Outcome == throttle.Failed {
				failed = ev.Err
			}
		})
		mw := mwLim.Middleware()
		calls := []struct {
			name string
			call func() error
		}{
			{"SetLimits", func() error { return lim.SetLimits(ctx, "slack", throttle.PerSecond(1)) }},
			{"Take", func() error { _, err := lim.Take(ctx, "slack"); return err }},
			{"Reserve", func() error {
				_, err := throttle.Reserve(lim, ctx, "slack", "t1", time.Minute, time.Second)
				return err
			}},
			{"Inspect", func() error { _, err := lim.Inspect(ctx, "slack"); return err }},
			{"Limits", func() error { _, err := throttle.Limits(lim, ctx, "slack"); return err }},
			{"Suspend", func() error { return lim.Suspend(ctx, "slack", time.Second) }},
			{"Resume", func() error { _, err := lim.Resume(ctx, "slack"); return err }},
			{"Adjust", func() error { return throttle.Surcharge(lim, ctx, "slack", 1) }},
			{"Delete", func() error { return lim.Delete(ctx, "slack") }},
			{"Keys", func() error { _, err := lim.Keys(ctx); return err }},
			{"middleware (fail open)", func() error {
				failed = nil
				_ = runTask(mw, asynq.NewTask("slack:sync", nil), func() error { return nil })
				return failed
			}},
		}
		for round := range 2 {
			for _, c := range calls {
				// (A loaded machine wakes a goroutine late: the bounds
				// allow for the lag seen during the call.)
				lag := redistest.StartLagMeter()
				start := time.Now()
				err := c.call()
				took := time.Since(start)
				lagged := lag.End()
				require.Error(t, err, "%s (round %d)", c.name, round)
				assert.Contains(t, err.Error(), "cannot reach Redis at "+addr, "%s (round %d)", c.name, round)
				assert.Contains(t, err.Error(), "connection refused", "%s (round %d)", c.name, round)
				assert.LessOrEqual(t, took, timeout+100*time.Millisecond+2*lagged, "%s (round %d), process lag %v: %v", c.name, round, lagged, err)
				if round == 1 {
					assert.Less(t, took, timeout/2+2*lagged, "%s after Redis was found down, process lag %v: %v", c.name, lagged, err)
				}
			}
		}
	})
}

// A Redis that goes away once the Limiter used it: decisions (lone, on
// the caller's goroutine, or waiting for a flight) name the cause too, and
// decide again once Redis is back.
func TestRedisGoneNamesTheCause(t *testing.T) {
	// Not in parallel: its bounds are on how long calls take, and the
	// package's parallel tests beside it made a CPU hog of their own.
	const timeout = time.Second // a loaded machine took over 500 ms to answer a decision, or to see a refused dial
	eachDeadlineMode(t, func(t *testing.T, cte bool) {
		ctx := context.Background()
		s := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: cte})
		t.Cleanup(func() { _ = rdb.Close() })
		lim := throttle.NewLimiter(rdb, quietLog, throttle.WithTimeout(timeout), throttle.WithDefaultLimits(throttle.PerSecond(1000)))
		_, err := lim.Take(ctx, "slack")
		require.NoError(t, err)
		s.Stop()
		for i := range 3 {
			lag := redistest.StartLagMeter()
			start := time.Now()
			_, err := lim.Take(ctx, "slack")
			took := time.Since(start)
			lagged := lag.End()
			require.Error(t, err, "Take %d", i)
			assert.Contains(t, err.Error(), "cannot reach Redis at "+s.Addr, "Take %d", i)
			assert.Contains(t, err.Error(), "connection refused", "Take %d", i)
			assert.LessOrEqual(t, took, timeout+100*time.Millisecond+2*lagged, "Take %d, process lag %v: %v", i, lagged, err)
			_, err = lim.Inspect(ctx, "slack")
			require.Error(t, err, "Inspect %d", i)
			assert.Contains(t, err.Error(), "cannot reach Redis at "+s.Addr, "Inspect %d", i)
		}
		s.Restart(t)
		start := time.Now()
		require.Eventually(t, func() bool {
			_, err := lim.Take(ctx, "slack")
			return err == nil
		}, 5*time.Second, 20*time.Millisecond, "decisions once Redis is back")
		t.Logf("deciding again %v after the restart", time.Since(start).Round(time.Millisecond))
	})
}
