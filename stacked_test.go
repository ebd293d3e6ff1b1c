package throttle_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Stacked limits on a real fleet (issue 30): tasks of two workspaces, each
// carrying its workspace's key and the app's, throttle.Key(workspace, app).
// stackedFleet starts a fleet of 3 servers x 8 with the three keys' limits;
// the handler is the caller's (nil: succeed).
func stackedFleet(t *testing.T, handler func(ctx context.Context, task *asynq.Task) error) *fleet {
	f := startFleet(t, fleetConfig{servers: 3, concurrency: 8, handler: handler})
	f.setLimits("slack:T1", throttle.PerSecond(10))
	f.setLimits("slack:T2", throttle.PerSecond(10))
	f.setLimits("slack", throttle.PerSecond(20))
	return f
}

// enqueueStacked enqueues n jobs per workspace, interleaved, each of the
// workspace's key and the app's.
func (f *fleet) enqueueStacked(n int) {
	f.t.Helper()
	for i := range n {
		for _, ws := range []string{"slack:T1", "slack:T2"} {
			job := fmt.Sprintf("%s-%d", ws, i)
			info, err := f.client.Enqueue(newTask(f.t, "sync:"+ws, []byte(job), throttle.Key(ws, "slack"), asynq.Retention(time.Hour)))
			require.NoError(f.t, err)
			f.jobOfID.Store(info.ID, job)
		}
	}
}

// stacked429 runs 40 tasks per workspace, the first T1 task to run
// answering a 429 made by limited, and returns how many runs of T1 and of
// T2 fell within the suspension (less the 429's own instant and asynq's
// one-second granule at its end), after auditing that every task ran once.
func stacked429(t *testing.T, pause time.Duration, limited func() error) (t1, t2 int, window time.Duration) {
	const perWS = 40
	var limitedAt atomic.Int64 // UnixNano of T1's 429
	f := stackedFleet(t, func(ctx context.Context, task *asynq.Task) error {
		if task.Type() == "sync:slack:T1" && limitedAt.Load() == 0 && limitedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			return limited()
		}
		return nil
	})
	f.enqueueStacked(perWS)
	f.waitDone(2*perWS, 40*time.Second)
	f.audit(2 * perWS)
	require.NotZero(t, limitedAt.Load(), "T1's first task ran")
	at := time.Unix(0, limitedAt.Load())
	from, to := at.Add(100*time.Millisecond), at.Add(pause-100*time.Millisecond)
	return countIn(f.rec.times("slack:T1"), from, to), countIn(f.rec.times("slack:T2"), from, to), to.Sub(from)
}

// A 429 on one workspace's key (the handler returns RateLimited, which
// suspends the task's first key) stops that workspace's tasks until the
// suspension ends; the other workspace's tasks keep running meanwhile, at
// their rate, and every task still runs exactly once.
func TestE2EA429OnAWorkspaceKeyStopsOnlyThatWorkspace(t *testing.T) {
	t.Parallel()
	const pause = 3 * time.Second
	t1, t2, window := stacked429(t, pause, func() error { return throttle.RateLimited(pause) })
	assert.Zero(t, t1, "T1 runs while T1 is suspended")
	assert.GreaterOrEqual(t, t2, 15, "T2 runs while T1 is suspended (10/s over %v; the app's 20/s leaves it room)", window)
}

// A 429 the handler attributes to the app's key (RateLimitedError.Key)
// stops both workspaces' tasks until the suspension ends, and every task
// still runs exactly once.
func TestE2EA429OnTheAppKeyStopsBothWorkspaces(t *testing.T) {
	t.Parallel()
	const pause = 3 * time.Second
	t1, t2, _ := stacked429(t, pause, func() error { return &throttle.RateLimitedError{RetryAfter: pause, Key: "slack"} })
	assert.Zero(t, t1, "T1 runs while the app is suspended")
	assert.Zero(t, t2, "T2 runs while the app is suspended")
}
