package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A backlog on Window(n, w) that comes back exactly when told gets n calls
// in every aligned window of w, as a provider's fixed windows count them.
// (Regression: a window freed its calls at the end of their sub-window
// (w/20) plus w, so the backlog's batches came every 1.05 s, drifted a
// sub-window later in each provider window, and every 20th provider window
// got no call at all.) No headroom, no asynq: the drift was the window's.
func TestWindowBacklogKeepsPhase(t *testing.T) {
	const n, windows = 60, 40
	w := time.Second
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	lim := throttle.NewLimiter(rdb)
	ctx := context.Background()
	epoch := time.Unix(1_700_000_000, 0)
	now := epoch
	mr.SetTime(now)
	require.NoError(t, lim.SetLimits(ctx, "p", throttle.Window(n, w)))

	perWindow := make([]int, windows)
	var batches []time.Duration
	for now.Sub(epoch) < windows*w {
		d, err := lim.Take(ctx, "p")
		require.NoError(t, err)
		if d.Allowed {
			i := int(now.Sub(epoch) / w)
			if len(batches) == 0 || batches[len(batches)-1] != now.Sub(epoch) {
				batches = append(batches, now.Sub(epoch))
			}
			perWindow[i]++
			continue
		}
		require.Positive(t, d.RetryAfter)
		now = now.Add(d.RetryAfter)
		mr.SetTime(now)
		mr.FastForward(d.RetryAfter)
	}
	t.Logf("batches at %v", batches)
	for i, got := range perWindow {
		if got != n {
			t.Errorf("aligned window %d [%v, %v): %d calls, want %d", i, time.Duration(i)*w, time.Duration(i+1)*w, got, n)
		}
	}
}

// A backlog on FixedWindow(n, w) whose callers come back late (100 ms after
// the instant they were told: a batch spread over a fleet, asynq's
// forwarder) still gets n calls in every aligned window of w: the window
// opens on the clock, not a period after the last batch. (On Window(n, w)
// the same backlog drifts by the lateness every window and loses one
// provider window in about ten: bench scenario E.)
func TestFixedWindowBacklogGetsEveryWindowThoughLate(t *testing.T) {
	const n, windows = 60, 40
	const late = 100 * time.Millisecond
	w := time.Second
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	lim := throttle.NewLimiter(rdb)
	ctx := context.Background()
	epoch := time.Unix(1_700_000_000, 0)
	now := epoch.Add(300 * time.Millisecond)
	mr.SetTime(now)
	require.NoError(t, lim.SetLimits(ctx, "p", throttle.FixedWindow(n, w)))

	perWindow := make([]int, windows+1)
	for now.Sub(epoch) < windows*w {
		d, err := lim.Take(ctx, "p")
		require.NoError(t, err)
		if d.Allowed {
			perWindow[int(now.Sub(epoch)/w)]++
			continue
		}
		require.Positive(t, d.RetryAfter)
		now = now.Add(d.RetryAfter + late)
		mr.SetTime(now)
		mr.FastForward(d.RetryAfter + late)
	}
	for i, got := range perWindow[:windows] {
		if got != n {
			t.Errorf("aligned window %d [%v, %v): %d calls, want %d", i, time.Duration(i)*w, time.Duration(i+1)*w, got, n)
		}
	}
}
