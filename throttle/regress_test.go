package throttle_test

// Regressions at the Limiter and middleware level, each against a real
// redis-server: leases, a 429 on every path, and the Limiter's connection.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

var quietLog = throttle.WithLogger(slog.New(slog.DiscardHandler))

// runTask runs task through mw outside an asynq server (a plain server's
// context: deferrals re-enqueue copies), with h as the handler.
func runTask(mw asynq.MiddlewareFunc, task *asynq.Task, h func() error) error {
	return mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return h() })).ProcessTask(context.Background(), task)
}

// scheduled returns the tasks waiting in asynq's scheduled set of the
// default queue.
func scheduled(t *testing.T, rdb redis.UniversalClient) []*asynq.TaskInfo {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	infos, err := insp.ListScheduledTasks("default")
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return nil
	}
	require.NoError(t, err)
	return infos
}

// A change this process makes to a key (SetLimits, Suspend) drops the
// tokens it leased: they must not run under limits that no longer allow them.
func TestLeasedTokensDroppedByAChangeInThisProcess(t *testing.T) {
	changes := []struct {
		name   string
		change func(ctx context.Context, l *throttle.Limiter) error
		runs   int // tasks of the 5 after the change that may run
	}{
		{"SetLimits lowers the limit", func(ctx context.Context, l *throttle.Limiter) error {
			return l.SetLimits(ctx, "k", throttle.PerHour(1))
		}, 1},
		{"Suspend", func(ctx context.Context, l *throttle.Limiter) error {
			return l.Suspend(ctx, "k", time.Minute)
		}, 0},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := redistest.Start(t).Client(t)
			lim := throttle.NewLimiter(rdb, throttle.WithLease(8, time.Minute), quietLog)
			require.NoError(t, lim.SetLimits(ctx, "k", throttle.PerHour(1000)))
			mw := lim.Middleware()
			var ran atomic.Int64
			h := func() error { ran.Add(1); return nil }
			require.NoError(t, runTask(mw, asynq.NewTask("k:sync", nil), h))
			st, err := lim.Inspect(ctx, "k")
			require.NoError(t, err)
			require.InDelta(t, 992.0, st.Tokens[0], 0.5, "the first decision took 1 token and leased 7")

			require.NoError(t, c.change(ctx, lim))
			for range 5 {
				require.NoError(t, runTask(mw, asynq.NewTask("k:sync", nil), h))
			}
			assert.Equal(t, int64(1+c.runs), ran.Load(), "tasks run: the first, then what the new limits allow")
		})
	}
}

// A handler's 429 suspends its key fleet-wide and defers the task on every
// path that ran it: a key without limits, and a decision Redis could not
// make under FailOpen (there the suspension is this process's own, and
// WithMaxSuspension still caps a provider's absurd Retry-After).
func TestRateLimitedSuspendsOnEveryPath(t *testing.T) {
	ctx := context.Background()
	t.Run("key without limits", func(t *testing.T) {
		rdb := redistest.Start(t).Client(t)
		lim := throttle.NewLimiter(rdb, quietLog)
		mw := lim.Middleware()
		var ran atomic.Int64
		err := runTask(mw, asynq.NewTask("crm:sync", []byte("a")), func() error { ran.Add(1); return throttle.RateLimited(30 * time.Second) })
		require.NoError(t, err, "the task is deferred (by copy here), not failed")
		st, err := lim.Inspect(ctx, "crm")
		require.NoError(t, err)
		assert.Greater(t, st.SuspendedFor, 25*time.Second, "the key is suspended fleet-wide in Redis")
		copies := scheduled(t, rdb)
		require.Len(t, copies, 1, "the task waits as a copy")
		assert.Greater(t, time.Until(copies[0].NextProcessAt), 25*time.Second, "deferred past the suspension")

		require.NoError(t, runTask(mw, asynq.NewTask("crm:sync", []byte("b")), func() error { ran.Add(1); return nil }))
		assert.Equal(t, int64(1), ran.Load(), "the next task of the suspended key ran")
	})
	t.Run("fail open while Redis is down", func(t *testing.T) {
		tasks := redistest.Start(t).Client(t)
		down := redistest.Start(t)
		limits := redis.NewClient(&redis.Options{Addr: down.Addr, MaxRetries: -1})
		t.Cleanup(func() { _ = limits.Close() })
		down.Stop()
		var delays []time.Duration
		var mu sync.Mutex
		lim := throttle.NewLimiter(limits, quietLog, throttle.WithFailOpen(),
			throttle.WithTimeout(300*time.Millisecond), throttle.WithDefaultLimits(throttle.PerSecond(10)),
			throttle.WithMaxSuspension(time.Minute), throttle.WithTaskRedis(tasks))
		lim.OnEvent(func(ev throttle.Event) {
			if ev.Outcome == throttle.Suspended || ev.Outcome == throttle.Deferred {
				mu.Lock()
				delays = append(delays, ev.Delay)
				mu.Unlock()
			}
		})
		mw := lim.Middleware()
		var ran atomic.Int64
		err := runTask(mw, asynq.NewTask("crm:sync", []byte("a")), func() error { ran.Add(1); return throttle.RateLimited(1e9 * time.Second) })
		require.NoError(t, err, "the task is deferred (by copy here), not failed")
		copies := scheduled(t, tasks)
		require.Len(t, copies, 1, "the task waits as a copy")
		maxWait := time.Minute + 10*time.Second // WithMaxSuspension and jitter's maximum
		assert.Less(t, time.Until(copies[0].NextProcessAt), maxWait, "deferred beyond WithMaxSuspension")

		require.NoError(t, runTask(mw, asynq.NewTask("crm:sync", []byte("b")), func() error { ran.Add(1); return nil }))
		assert.Equal(t, int64(1), ran.Load(), "this process called the provider again right after its 429")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, delays, 2)
		for _, d := range delays {
			assert.LessOrEqual(t, d, maxWait, "a deferral after a 429 of 1e9 s")
		}
	})
}

// Limiters made and dropped (one per call, against the advice) hold no
// connection the application needs: the client's own commands still get one
// at once. Close gives the kept connection back immediately.
func TestShortLivedLimitersHoldNoConnection(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 8, PoolTimeout: 500 * time.Millisecond, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	for range 8 {
		d, err := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100))).Take(ctx, "api")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	assert.NoError(t, rdb.Ping(ctx).Err(), "PING after eight short-lived Limiters")

	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100)))
	_, err := l.Take(ctx, "api")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	// (background work, the index and the persistence check, borrows
	// connections for a moment too: every one is idle shortly, well before
	// the kept connection would go back by itself, 250 ms unused)
	assert.Eventually(t, func() bool {
		st := rdb.PoolStats()
		return st.TotalConns > 0 && st.IdleConns == st.TotalConns
	}, 100*time.Millisecond, time.Millisecond, "Close gave the kept connection back: %+v", rdb.PoolStats())
	d, err := l.Take(ctx, "api")
	require.NoError(t, err, "Take after Close (through the pool)")
	assert.True(t, d.Allowed)
}

// A decision ends within WithTimeout whatever it waits on: a pool with no
// free connection, or a Redis that refuses connections while the client
// redials (with the client settings docs/wiring.md recommends), called with a
// plain context or with a handler's (cancellable, with asynq's far
// deadline); and a handler's context canceled during the wait ends it then.
func TestDecisionEndsWithinItsTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	handler, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	contexts := []struct {
		name string
		ctx  context.Context
	}{{"plain context", context.Background()}, {"handler context", handler}}
	// exhausted returns a Limiter whose client's only connection is taken.
	exhausted := func(t *testing.T) *throttle.Limiter {
		s := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100)), throttle.WithTimeout(timeout))
		_, err := l.Take(context.Background(), "api")
		require.NoError(t, err)
		// The only connection blocks on BLPOP for 5 s.
		go func() { _ = rdb.BLPop(context.Background(), 5*time.Second, "nothing").Err() }()
		require.Eventually(t, func() bool { return rdb.PoolStats().IdleConns == 0 }, time.Second, 5*time.Millisecond)
		return l
	}
	for _, c := range contexts {
		t.Run("no free pool connection, "+c.name, func(t *testing.T) {
			l := exhausted(t)
			start := time.Now()
			_, err := l.Take(c.ctx, "api")
			took := time.Since(start)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, took, 3*timeout, "Take waited for a pool connection past WithTimeout (%v)", timeout)
		})
		t.Run("Redis refusing connections, "+c.name, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
			t.Cleanup(func() { _ = rdb.Close() })
			l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100)), throttle.WithTimeout(timeout))
			_, err := l.Take(c.ctx, "api")
			require.NoError(t, err)
			s.Stop()
			for range 3 {
				start := time.Now()
				_, err = l.Take(c.ctx, "api")
				took := time.Since(start)
				assert.Error(t, err)
				assert.Less(t, took, 3*timeout, "Take against a Redis refusing connections took %v (WithTimeout %v)", took, timeout)
			}
		})
	}
	t.Run("handler context canceled while waiting for a pool connection", func(t *testing.T) {
		l := exhausted(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := l.Take(ctx, "api")
		took := time.Since(start)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, took, 150*time.Millisecond, "a caller canceled after 50ms waited on (WithTimeout %v)", timeout)
	})
}

// After a failover behind a proxy (or a DNS name), the connection the
// Limiter keeps still talks to the old master, now a replica, and gets
// READONLY: it is dropped at once and the decision runs on a fresh
// connection, which reaches the new master.
func TestReadOnlyDropsTheKeptConnection(t *testing.T) {
	ctx := context.Background()
	oldMaster, newMaster := redistest.Start(t), redistest.Start(t)
	proxy := redistest.StartProxy(t, oldMaster.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 8, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(10_000)))
	for range 3 {
		_, err := l.Take(ctx, "api")
		require.NoError(t, err)
	}

	// The failover: the old master follows the new one, and the proxy sends
	// new connections to the new master.
	require.NoError(t, oldMaster.Client(t).Do(ctx, "REPLICAOF", "127.0.0.1", portOf(t, newMaster.Addr)).Err())
	proxy.SetTarget(newMaster.Addr)
	failed := 0
	for range 20 {
		if _, err := l.Take(ctx, "api"); err != nil {
			failed++
			assert.Contains(t, err.Error(), "READONLY")
		}
	}
	assert.Zero(t, failed, "decisions failed on the kept connection to the old master after the failover")
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	t.Fatalf("no port in %q", addr)
	return ""
}

// On a Cluster whose scripts and functions were flushed, a decision whose
// key lives on a reachable master is made even while another master is
// down: loading the library there fails, and the call falls back to EVAL.
func TestClusterMissingScriptFallsBackToEvalWithANodeDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.StartCluster(t)
	rdb := c.Client(t)
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(1000)))
	const key = "api"
	_, err := l.Take(ctx, key)
	require.NoError(t, err)
	master, err := rdb.MasterForKey(ctx, "throttle:{"+key+"}:b")
	require.NoError(t, err)
	var other string
	for _, addr := range c.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		require.NoError(t, n.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err())
		require.NoError(t, n.FunctionFlush(ctx).Err())
		require.NoError(t, n.ScriptFlush(ctx).Err())
		_ = n.Close()
		if addr != master.Options().Addr {
			other = addr
		}
	}
	c.StopNode(t, other)
	for i := range 5 {
		d, err := l.Take(ctx, key)
		require.NoError(t, err, "Take %d with the library gone and master %s down", i, other)
		assert.True(t, d.Allowed)
	}
}

// A task's Cost takes that many tokens of every tier; Used in its handler
// settles the actual cost; TakeN does the same for direct callers, and a
// cost no tier can ever hold is refused with ErrCostTooHigh.
func TestCostTakesTokensAndUsedSettlesIt(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "gql", throttle.PerHour(10)))
	mw := lim.Middleware()
	var ran atomic.Int64
	run := func(cost int, h func(ctx context.Context) error) error {
		task := newTask(t, "gql:query", nil, throttle.Key("gql"), throttle.Cost(cost))
		return mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			ran.Add(1)
			return h(ctx)
		})).ProcessTask(ctx, task)
	}
	tokens := func() float64 {
		t.Helper()
		st, err := lim.Inspect(ctx, "gql")
		require.NoError(t, err)
		return st.Tokens[0]
	}
	require.NoError(t, run(4, func(context.Context) error { return nil }))
	assert.InDelta(t, 6, tokens(), 0.01, "a task of cost 4")
	require.NoError(t, run(2, func(ctx context.Context) error { return throttle.Used(ctx, "requests", 5) }))
	assert.InDelta(t, 1, tokens(), 0.01, "a task of cost 2 that cost 5")
	require.NoError(t, run(2, func(context.Context) error { return nil }), "deferred by copy")
	assert.Equal(t, int64(2), ran.Load(), "a task of cost 2 with 1 token left ran")
	assert.Error(t, throttle.Used(ctx, "requests", 1), "Used outside a handler")

	d, err := lim.Take(ctx, "gql", throttle.Cost(1))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	_, err = lim.Take(ctx, "gql", throttle.Cost(11))
	assert.ErrorIs(t, err, throttle.ErrCostTooHigh)
	require.NoError(t, throttle.Surcharge(lim, ctx, "gql", -3))
	assert.InDelta(t, 0, tokens(), 0.01, "Adjust gives nothing back: no call is known to refund")

	// Used below the cost gives back what the call did not use, to a
	// bucket and to the window's sub-window that counted it.
	require.NoError(t, lim.SetLimits(ctx, "gql2", throttle.PerHour(10), throttle.Window(10, time.Hour)))
	task := newTask(t, "gql:query", nil, throttle.Key("gql2"), throttle.Cost(4))
	require.NoError(t, mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Used(ctx, "requests", 1)
	})).ProcessTask(ctx, task))
	st, err := lim.Inspect(ctx, "gql2")
	require.NoError(t, err)
	bucket0, window0 := 10.0, 10.0
	assert.InDelta(t, bucket0-1, st.Tokens[0], 0.01, "the bucket got 3 of the 4 back")
	assert.InDelta(t, window0-1, st.Tokens[1], 0.01, "the window got 3 of the 4 back")

	// Through the middleware, a cost no tier can ever hold fails the task
	// for good (asynq archives it) instead of retrying it forever.
	before := ran.Load()
	err = run(11, func(context.Context) error { return nil })
	assert.ErrorIs(t, err, throttle.ErrCostTooHigh)
	assert.ErrorIs(t, err, asynq.SkipRetry, "archived at once, not retried")
	assert.Equal(t, before, ran.Load(), "the handler did not run")
}

// Observe in a handler learns from the provider's response: a published
// quota lowers the tier of its period, fleet-wide in Redis, under the
// configured ceiling; remaining 0 with a reset suspends the key; a 429
// comes back as RateLimited. Outside the middleware Observe only returns the error.
func TestObserveInAHandlerLearnsFromTheResponse(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "gh", throttle.PerMinute(100), throttle.PerSecond(20)))
	mw := lim.Middleware()
	respond := func(status int, h map[string]string) *http.Response {
		rec := httptest.NewRecorder()
		for k, v := range h {
			rec.Header().Set(k, v)
		}
		rec.WriteHeader(status)
		return rec.Result()
	}
	run := func(resp *http.Response) error {
		task := newTask(t, "gh:sync", nil, throttle.Key("gh"))
		var got error
		err := mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			got = throttle.Observe(ctx, resp)
			return got
		})).ProcessTask(ctx, task)
		if got == nil {
			return err
		}
		return got
	}

	require.NoError(t, run(respond(200, map[string]string{
		"RateLimit-Policy": `"burst";q=10;w=1, "hour";q=60;w=60`,
		"RateLimit":        `"hour";r=5;t=30`,
	})))
	st, err := lim.Inspect(ctx, "gh")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(100).WithBurst(100), throttle.PerSecond(20).WithBurst(20)}, st.Limits, "configured")
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(60).WithBurst(60), throttle.PerSecond(10).WithBurst(10)}, st.InForce, "learned")
	assert.InDelta(t, 5, st.Tokens[0], 0.5, "remaining 5 of the hour policy (window 60 s): below what the decision left")
	assert.InDelta(t, 9, st.Tokens[1], 0.5, "the other tier keeps its tokens (10 learned, one taken)")

	// A higher published quota never raises a tier above the configured
	// one. (A raise may wait a moment after the last quota sent: only a
	// lower one goes to Redis at once.)
	// One task, whose handler sees the same response again and again.
	require.NoError(t, mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		require.Eventually(t, func() bool {
			require.NoError(t, throttle.Observe(ctx, respond(200, map[string]string{"RateLimit-Policy": `"burst";q=500;w=1`})))
			st, err = lim.Inspect(ctx, "gh")
			require.NoError(t, err)
			return st.InForce[1] == throttle.PerSecond(20).WithBurst(20)
		}, 5*time.Second, 100*time.Millisecond, "back to the ceiling")
		return nil
	})).ProcessTask(ctx, newTask(t, "gh:sync", nil, throttle.Key("gh"))))

	// A 429: a *RateLimitedError.
	err = run(respond(429, map[string]string{"Retry-After": "7"}))
	var rl *throttle.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Equal(t, 7*time.Second, rl.RetryAfter)
	require.NoError(t, resumed(lim.Resume(ctx, "gh")))

	// Out of quota until the reset: the key is suspended fleet-wide.
	require.NoError(t, run(respond(200, map[string]string{
		"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset": fmt.Sprint(time.Now().Add(40 * time.Second).Unix()),
	})))
	st, err = lim.Inspect(ctx, "gh")
	require.NoError(t, err)
	assert.InDelta(t, 40, st.SuspendedFor.Seconds(), 2, "suspended until the provider's reset")
	require.NoError(t, resumed(lim.Resume(ctx, "gh")))

	// Outside the middleware: the error, nothing learned.
	before, err := lim.Inspect(ctx, "gh")
	require.NoError(t, err)
	assert.NoError(t, throttle.Observe(ctx, respond(200, map[string]string{"RateLimit-Policy": `q=5;w=60`})))
	st, err = lim.Inspect(ctx, "gh")
	require.NoError(t, err)
	assert.Equal(t, before.InForce, st.InForce, "nothing learned without the middleware's context")
}

// A handler that reports a rate limit so short that it is over by the
// follow-up decision leaks nothing: the admission that decision makes is
// given back, slot in flight and tokens. (Regression: with InFlight(2) and
// RateLimited(1µs), one slot stayed held with no handler running for the
// whole slot lease.)
func TestRateLimitedTooShortToLastLeaksNoSlot(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithLease(0, 0), throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerHour(100), throttle.InFlight(2)))
	mw := lim.Middleware()
	task := newTask(t, "crm:sync", nil, throttle.Key("crm"))
	err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return throttle.RateLimited(time.Microsecond)
	})).ProcessTask(ctx, task)
	require.NoError(t, err, "the task is deferred by copy (no asynq server here)")
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Zero(t, st.InFlight, "slots in flight with no handler running")
	assert.InDelta(t, 99, st.Tokens[0], 0.01, "tokens: the task's call, not the follow-up decision's")
}

// Limiter.Enqueue of a task under an ID another task holds a reservation
// with fails (asynq refuses the ID) and leaves that reservation, the tokens
// and the slots in flight as they were. (Regression: the failed enqueue
// removed the live task's reservation, or, when it was due, admitted it:
// tokens 1 -> 0 and a slot in flight held with no handler.)
func TestEnqueueOfAnIDInUseChangesNothing(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	client := asynq.NewClientFromRedisClient(rdb)
	for _, tc := range []struct {
		name string
		take bool // the token taken first: the reservation is ahead, else due now
	}{{"reservation ahead", true}, {"reservation due", false}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "crm-" + strings.ReplaceAll(tc.name, " ", "-")
			require.NoError(t, lim.SetLimits(ctx, key, throttle.PerSecond(1), throttle.InFlight(2)))
			if tc.take {
				d, err := lim.Take(ctx, key)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.NoError(t, lim.Release(ctx, key, d.Slot))
			}
			id := "t1-" + key
			_, err := lim.Enqueue(ctx, client, newTask(t, "crm:sync", []byte("first"), throttle.Key(key)), asynq.TaskID(id))
			require.NoError(t, err)
			slot, ok, err := throttle.Reservation(lim, ctx, key, id)
			require.NoError(t, err)
			require.True(t, ok, "the first task holds a reservation")
			before, err := lim.Inspect(ctx, key)
			require.NoError(t, err)

			_, err = lim.Enqueue(ctx, client, newTask(t, "crm:sync", []byte("second"), throttle.Key(key)), asynq.TaskID(id))
			require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
			after, err := lim.Inspect(ctx, key)
			require.NoError(t, err)
			got, ok, err := throttle.Reservation(lim, ctx, key, id)
			require.NoError(t, err)
			assert.True(t, ok, "the first task's reservation is kept")
			assert.Equal(t, slot, got, "the first task's slot")
			assert.Zero(t, after.InFlight, "slots in flight")
			assert.InDelta(t, before.Tokens[0], after.Tokens[0], 0.05, "tokens")
			assert.Equal(t, before.Reservations, after.Reservations, "reservations")
		})
	}
}

// Delete keeps the slots in flight of handlers still running: limits set
// again with an InFlight count them. (Regression: under InFlight(1), a
// second task was admitted while the first ran.)
func TestDeleteKeepsTheSlotsOfRunningHandlers(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(10), throttle.InFlight(1)))
	running, err := lim.Take(ctx, "crm")
	require.NoError(t, err)
	require.True(t, running.Allowed)
	require.NoError(t, lim.Delete(ctx, "crm"))
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Nil(t, st.Limits, "the limits are gone")
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(10), throttle.InFlight(1)))
	d, err := lim.Take(ctx, "crm")
	require.NoError(t, err)
	assert.False(t, d.Allowed, "a second task while the first still holds the only slot")
	assert.Equal(t, throttle.RefusedBySlots, d.Reason)
	require.NoError(t, lim.Release(ctx, "crm", running.Slot))
	d, err = lim.Take(ctx, "crm")
	require.NoError(t, err)
	assert.True(t, d.Allowed, "once the first gave its slot back")
}
