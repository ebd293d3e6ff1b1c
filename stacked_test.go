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

// A 429 on one workspace's key (the handler returns RateLimited, which
// suspends the task's first key) stops that workspace's tasks until the
// suspension ends; the other workspace's tasks keep running meanwhile, at
// their rate, and every task still runs exactly once.
func TestE2EA429OnAWorkspaceKeyStopsOnlyThatWorkspace(t *testing.T) {
	t.Parallel()
	const perWS, pause = 40, 3 * time.Second
	var limitedAt atomic.Int64 // UnixNano of T1's 429
	f := stackedFleet(t, func(ctx context.Context, task *asynq.Task) error {
		if task.Type() == "sync:slack:T1" && limitedAt.Load() == 0 && limitedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			return throttle.RateLimited(pause)
		}
		return nil
	})
	f.enqueueStacked(perWS)
	f.waitDone(2*perWS, 40*time.Second)
	f.audit(2 * perWS)

	at := time.Unix(0, limitedAt.Load())
	require.False(t, at.IsZero(), "T1's first task ran")
	// Within the suspension (less the 429's own instant and asynq's
	// one-second granule at its end): no T1 run; T2 runs at about its
	// 10/s (the app's 20/s leaves it room).
	from, to := at.Add(100*time.Millisecond), at.Add(pause-100*time.Millisecond)
	t1 := countIn(f.rec.times("slack:T1"), from, to)
	t2 := countIn(f.rec.times("slack:T2"), from, to)
	assert.Zero(t, t1, "T1 runs while T1 is suspended")
	assert.GreaterOrEqual(t, t2, 15, "T2 runs while T1 is suspended (10/s over %v)", to.Sub(from))
}
