package throttle

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// A Limiter forgets the keys it stopped using: whatever it kept per key
// (commands, leases, caches) is released once they are idle.
func TestKeyStatesReleasedWhenIdle(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := NewLimiter(rdb, WithDefaultLimits(PerSecond(10)))
	ctx := context.Background()
	for i := range 200 {
		_, err := l.Take(ctx, fmt.Sprintf("tenant-%d", i))
		require.NoError(t, err)
	}
	require.Equal(t, 200, l.keys.size())
	// (300 ms: a loaded machine can hold one Take of the busy key below
	// back 100 ms. Set once: the sweeper reads it.)
	l.keys.idle = 300 * time.Millisecond
	require.Eventually(t, func() bool { l.keys.run(); return l.keys.size() == 0 }, 5*time.Second, 20*time.Millisecond,
		"per-key state of idle keys still held")

	// A key in use stays, for several idle periods.
	_, err := l.Take(ctx, "busy")
	require.NoError(t, err)
	first := l.keys.peek("busy")
	stop := time.After(time.Second)
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
			_, err := l.Take(ctx, "busy")
			require.NoError(t, err)
			time.Sleep(10 * time.Millisecond)
		}
	}
	assert.Equal(t, 1, l.keys.size(), "the key in use")
	ks := l.keys.peek("busy")
	require.NotNil(t, ks)
	assert.Same(t, first, ks, "the busy key's state is the one it started with (not dropped and remade)")
}

// BenchmarkIdleKeysRetained makes one decision on each of 100,000 keys (one
// per tenant, say) through a Limiter on a real Redis, lets them go idle, and
// reports the heap the Limiter still holds for them, per key: B/key-live
// right after the decisions, B/key-idle once they are idle. Run it with
//
//	go test -run '^$' -bench IdleKeysRetained -benchtime 1x ./throttle/
func BenchmarkIdleKeysRetained(b *testing.B) {
	const keys = 100_000
	rdb := redistest.Start(b).Client(b)
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for range b.N {
		l := NewLimiter(rdb, WithDefaultLimits(PerSecond(10)))
		l.keys.idle = time.Hour
		run := func(n int, key func(i int) string) {
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < n; i += 16 {
						if _, err := l.Take(ctx, key(i)); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		// Warm up on one key, so that the connection pool and buffers the
		// load needs are there before the baseline.
		run(2000, func(int) string { return "warm-up" })
		base := heap()
		run(keys, func(i int) string { return fmt.Sprintf("tenant-%d", i) })
		live := heap()
		l.keys.idle = 500 * time.Millisecond
		l.keys.run()
		deadline := time.Now().Add(30 * time.Second)
		for l.keys.size() > 1 && time.Now().Before(deadline) { // the warm-up key may stay
			time.Sleep(50 * time.Millisecond)
			l.keys.run()
		}
		idle := heap()
		perKey := func(h uint64) float64 {
			if h < base {
				return 0
			}
			return float64(h-base) / keys
		}
		b.ReportMetric(perKey(live), "B/key-live")
		b.ReportMetric(perKey(idle), "B/key-idle")
		b.ReportMetric(float64(max(idle, base)-base)/1e6, "MB-idle-total")
		runtime.KeepAlive(l)
	}
}

// A Limiter keeps state for at most maxKeyStates keys: a producer that names
// a new key in every task (100,000 forged keys cost a worker 90 MB) makes it
// hold no more; keys past the cap are decided all the same, and a key it
// already held keeps its state (issue 35, item 10).
func TestKeyStatesAreBounded(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := NewLimiter(rdb, WithDefaultLimits(PerSecond(1000)))
	require.Equal(t, int64(maxKeyStates), l.keys.max)
	l.keys.max = 100
	ctx := context.Background()
	_, err := l.Take(ctx, "slack")
	require.NoError(t, err)
	slack := l.keys.peek("slack")
	require.NotNil(t, slack)
	for i := range 1000 {
		d, err := l.Take(ctx, fmt.Sprintf("forged-%d", i))
		require.NoError(t, err)
		assert.True(t, d.Allowed, "a key past the cap is decided")
	}
	assert.Equal(t, 100, l.keys.size(), "states kept")
	assert.Nil(t, l.keys.peek("forged-999"))
	_, err = l.Take(ctx, "slack")
	require.NoError(t, err)
	assert.Same(t, slack, l.keys.peek("slack"), "a key held before keeps its state")
	transient := l.keys.get("forged-999")
	assert.True(t, transient.transient)
	assert.NotSame(t, transient, l.keys.get("forged-999"), "made for each call")
}
