package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// hammer runs procs limiters (each on its own client, as separate processes
// would be) with goroutines each, taking from key for d. It returns how many
// were admitted, the elapsed time and the errors seen.
func hammer(t *testing.T, clients []redis.UniversalClient, goroutines int, key string, d time.Duration) (admitted int64, elapsed time.Duration, errs []error) {
	t.Helper()
	var (
		n    atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		ctx  = context.Background()
		stop = make(chan struct{})
	)
	start := time.Now()
	for _, c := range clients {
		l := throttle.NewLimiter(c)
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					dec, err := l.Take(ctx, key)
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						continue
					}
					if dec.Allowed {
						n.Add(1)
					}
				}
			}()
		}
	}
	time.AfterFunc(d, func() { close(stop) })
	wg.Wait()
	return n.Load(), time.Since(start), errs
}

func clientsOf(t *testing.T, s *redistest.Server, n int) []redis.UniversalClient {
	out := make([]redis.UniversalClient, n)
	for i := range out {
		out[i] = redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 16})
		t.Cleanup(func() { out[i].Close() })
	}
	return out
}

// The fleet-wide bound: 4 limiters x 8 goroutines at 100/s burst 20 never
// admit more than burst + rate x elapsed, and admit nearly that many.
func TestIntegrationFleetHoldsTheBound(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	clients := clientsOf(t, s, 4)
	ctx := context.Background()
	limit := throttle.PerSecond(100).WithBurst(20)
	require.NoError(t, throttle.NewLimiter(clients[0]).SetLimits(ctx, "api", limit))

	admitted, elapsed, errs := hammer(t, clients, 8, "api", 3*time.Second)
	require.Empty(t, errs)
	bound := 20 + 100*elapsed.Seconds()
	t.Logf("admitted %d in %v (bound %.1f)", admitted, elapsed, bound)
	assert.LessOrEqual(t, float64(admitted), bound+1, "admitted more than burst + rate x elapsed")
	assert.GreaterOrEqual(t, float64(admitted), 0.95*bound, "admitted far less than the limit allows")
}

// NOSCRIPT after SCRIPT FLUSH is reloaded transparently: no caller sees it.
func TestIntegrationScriptFlushIsReloadedUnseen(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	clients := clientsOf(t, s, 4)
	ctx := context.Background()
	require.NoError(t, throttle.NewLimiter(clients[0]).SetLimits(ctx, "api", throttle.PerSecond(100).WithBurst(20)))

	flusher := s.Client(t)
	done := make(chan struct{})
	var flushes atomic.Int64
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if flusher.ScriptFlush(ctx).Err() == nil {
					flushes.Add(1)
				}
			}
		}
	}()
	admitted, elapsed, errs := hammer(t, clients, 8, "api", 3*time.Second)
	close(done)
	require.Empty(t, errs, "an error reached a caller")
	require.Greater(t, flushes.Load(), int64(20))
	bound := 20 + 100*elapsed.Seconds()
	assert.LessOrEqual(t, float64(admitted), bound+1)
	assert.GreaterOrEqual(t, float64(admitted), 0.9*bound)
}

// A Redis restart loses the script cache (and, without persistence, the
// data): the next call reloads the script and works.
func TestIntegrationRestartReloadsTheScript(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := context.Background()
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(5)))
	d, err := l.Take(ctx, "api")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	s.Restart(t)
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
	d, err = l.Take(ctx, "api")
	require.NoError(t, err, "Take after restart")
	assert.True(t, d.Allowed)
}

// A lone decision flies on a connection the Limiter keeps. When Redis
// closes it (CLIENT KILL here; a restart, an idle timeout or a proxy alike),
// the decision runs again on the pool instead of failing, as the pool's own
// health check would have spared it.
func TestIntegrationKilledKeptConnectionRetriesOnThePool(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	admin := s.Client(t)
	ctx := context.Background()
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(1000)))
	for i := range 5 {
		d, err := l.Take(ctx, "api")
		require.NoError(t, err, "Take %d", i)
		require.True(t, d.Allowed)
		n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result()
		require.NoError(t, err)
		require.Positive(t, n, "no connection to kill: the decision kept none")
	}
	d, err := l.Take(ctx, "api")
	require.NoError(t, err, "Take after the last kill")
	assert.True(t, d.Allowed)
}

// With Redis gone, a decision fails within its deadline instead of hanging.
func TestIntegrationRedisDownFailsWithinTheDeadline(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(5)), throttle.WithTimeout(300*time.Millisecond))
	s.Stop()
	start := time.Now()
	_, err := l.Take(context.Background(), "api")
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second, "Take did not honour its deadline")
	assert.Contains(t, err.Error(), `throttle: key "api"`)
}

// A Redis that hangs (SIGSTOP: sockets open, no answer) costs a decision its
// WithTimeout, not the client's read timeout, and decisions work again once
// it answers.
func TestIntegrationHungRedisCostsOnlyTheTimeout(t *testing.T) {
	for _, opts := range []redis.Options{
		{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}, // decisions fly on their own goroutine
		{ContextTimeoutEnabled: true},                                   // a lone decision flies on its caller's
	} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", opts.ContextTimeoutEnabled), func(t *testing.T) {
			redisHangs(t, opts)
		})
	}
}

func redisHangs(t *testing.T, opts redis.Options) {
	s := redistest.Start(t)
	opts.Addr = s.Addr
	rdb := redis.NewClient(&opts)
	t.Cleanup(func() { rdb.Close() })
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(1000)), throttle.WithTimeout(300*time.Millisecond))
	ctx := context.Background()
	_, err := l.Take(ctx, "api")
	require.NoError(t, err)

	s.Pause(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	took := make([]time.Duration, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = l.Take(ctx, "api")
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range errs {
		assert.ErrorIs(t, errs[i], context.DeadlineExceeded, "Take %d while Redis hangs", i)
		assert.Less(t, took[i], 3*time.Second, "Take %d waited for the client's 10 s read timeout", i)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = l.Take(cctx, "api")
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline")

	s.Resume(t)
	require.Eventually(t, func() bool {
		d, err := l.Take(ctx, "api")
		return err == nil && d.Allowed
	}, 15*time.Second, 50*time.Millisecond, "decisions after Redis answers again")
}

// Every script runs on a 3-master Redis Cluster: all keys of one limiter key
// share a hash tag, and keys spread over the masters stay independent.
func TestIntegrationEveryScriptRunsOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	rdb := c.Client(t)
	ctx := context.Background()
	l := throttle.NewLimiter(rdb)

	for i := range 12 {
		key := fmt.Sprintf("provider-%d", i)
		require.NoError(t, l.SetLimits(ctx, key, throttle.PerMinute(3), throttle.PerHour(100)), key)
		for j := range 4 {
			d, err := l.Take(ctx, key)
			require.NoError(t, err, key)
			assert.Equal(t, j < 3, d.Allowed, "%s take %d", key, j)
		}
		d, err := throttle.Reserve(l, ctx, key, "task-1", time.Hour, time.Second)
		require.NoError(t, err)
		assert.True(t, throttle.Reserved(d), "%s: reservation on a cluster", key)
		require.NoError(t, l.Suspend(ctx, key, time.Minute))
		st, err := l.Inspect(ctx, key)
		require.NoError(t, err)
		assert.Greater(t, st.SuspendedFor, 50*time.Second)
		assert.Equal(t, 1, st.Reservations)
		require.NoError(t, resumed(l.Resume(ctx, key)))
	}

	// The bound holds on a cluster too.
	require.NoError(t, l.SetLimits(ctx, "api", throttle.PerSecond(100).WithBurst(20)))
	admitted, elapsed, errs := hammer(t, []redis.UniversalClient{rdb, c.Client(t)}, 8, "api", 2*time.Second)
	require.Empty(t, errs)
	bound := 20 + 100*elapsed.Seconds()
	assert.LessOrEqual(t, float64(admitted), bound+1)
	assert.GreaterOrEqual(t, float64(admitted), 0.9*bound)
}

// The kept connection goes back to the pool every renewal period and the
// next lone decision takes one again: go-redis trusts a connection's health
// only for a few seconds after it was last put back, and peeks the socket
// before every command after that. Between renewals, lone decisions take
// nothing from the pool; no connection leaks across renewals.
func TestIntegrationKeptConnectionIsRenewed(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 8, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	l := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(100_000)))
	const renew = 500 * time.Millisecond
	throttle.SetKeptConnRenewal(l, renew)
	gets := func() uint32 { st := rdb.PoolStats(); return st.Hits + st.Misses }
	take := func() {
		t.Helper()
		d, err := l.Take(ctx, "api")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}

	take()
	throttle.FlushIndex(l) // (the key's first decision records it, in the background)
	g0, conns := gets(), rdb.PoolStats().TotalConns
	for range 20 {
		take()
	}
	assert.Equal(t, g0, gets(), "lone decisions within the renewal period took connections from the pool")

	time.Sleep(renew + 100*time.Millisecond)
	take()
	assert.Equal(t, g0+1, gets(), "after the renewal period the next decision takes a fresh connection, once")
	assert.Equal(t, conns, rdb.PoolStats().TotalConns, "the renewed connection went back to the pool, not lost")
	take()
	assert.Equal(t, g0+1, gets())
}
