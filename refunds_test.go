package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Refunds reach a booked backlog (issue 29, item 9): tasks enqueued
// through Limiter.Enqueue book 200 tokens each and use 50; the refunds
// their handlers settle with Used bring the latest booked tasks forward
// (asynq's RunTask), so that tasks run well before the times they were
// booked for, each once. 30 tasks on 500 tokens a second, a bucket of
// 1,000: booked at their estimates, the last ones wait 10 s (their usage
// takes 1 s of the rate; on a machine so busy that enqueueing the 30 takes
// seconds, the bookings still reach well past it).
func TestE2ERefundsBringBookedTasksForward(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{servers: 2, handler: func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Used(ctx, "tokens", 50)
	}})
	f.setLimits("llm", throttle.PerSecond(100), throttle.PerSecond(500).WithBurst(1000).In("tokens"))
	lim := throttle.NewLimiter(f.rdb, throttle.WithLogger(quiet))
	ctx := context.Background()
	const n = 30
	var mu sync.Mutex
	bookedFor := map[string]time.Time{}
	start := time.Now()
	for i := range n {
		job := fmt.Sprintf("job-%d", i)
		info, err := lim.Enqueue(ctx, f.client, newTask(t, "sync:llm", []byte(job), throttle.Key("llm"), throttle.Uses("tokens", 200)))
		require.NoError(t, err)
		f.jobOfID.Store(info.ID, job)
		mu.Lock()
		bookedFor[job] = info.NextProcessAt
		mu.Unlock()
	}
	f.waitDone(n, 20*time.Second)
	f.audit(n)
	early, last := 0, time.Time{}
	f.rec.mu.Lock()
	for job, runs := range f.rec.runs {
		if runs[0].Before(bookedFor[job].Add(-time.Second)) {
			early++
		}
	}
	f.rec.mu.Unlock()
	for _, at := range bookedFor {
		if at.After(last) {
			last = at
		}
	}
	t.Logf("%d of %d tasks ran over a second before the time they were booked for (the last booked for %v after the first enqueue)", early, n, last.Sub(start).Round(time.Second))
	assert.GreaterOrEqual(t, early, 5, "tasks brought forward by the refunds")
}

// A refund brings forward tasks of several keys booked in the key that
// refunded, their SECOND key (the first, a workspace's, is generous; the
// app's tokens make them wait): the same drain as above, every task
// Key("ws", "llm").
func TestE2ERefundsBringTasksBookedInTheirSecondKeyForward(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{servers: 2, handler: func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Used(ctx, "tokens", 50)
	}})
	f.setLimits("ws", throttle.PerSecond(1000))
	f.setLimits("llm", throttle.PerSecond(100), throttle.PerSecond(500).WithBurst(1000).In("tokens"))
	lim := throttle.NewLimiter(f.rdb, throttle.WithLogger(quiet))
	ctx := context.Background()
	const n = 30
	bookedFor := map[string]time.Time{}
	for i := range n {
		job := fmt.Sprintf("job-%d", i)
		info, err := lim.Enqueue(ctx, f.client, newTask(t, "sync:llm", []byte(job), throttle.Key("ws", "llm"), throttle.Uses("tokens", 200)))
		require.NoError(t, err)
		f.jobOfID.Store(info.ID, job)
		bookedFor[job] = info.NextProcessAt
	}
	f.waitDone(n, 20*time.Second)
	f.audit(n)
	early := 0
	f.rec.mu.Lock()
	for job, runs := range f.rec.runs {
		if runs[0].Before(bookedFor[job].Add(-time.Second)) {
			early++
		}
	}
	f.rec.mu.Unlock()
	assert.GreaterOrEqual(t, early, 5, "tasks brought forward by the refunds in llm, their second key")
}

// A refund brings forward only the task that booked the reservation: a
// task deleted from asynq and enqueued again under its ID for an hour
// later (asynq's way to reschedule) leaves its booking in the queue until
// it lapses, and a refund that brings that booking forward must not run
// the new task now.
func TestE2EARefundRunsNoTaskRescheduledForLater(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	ran := map[string]time.Time{}
	f := startFleet(t, fleetConfig{servers: 1, handler: func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran[id] = time.Now()
		mu.Unlock()
		if id == "later" {
			return nil
		}
		<-release
		return throttle.Used(ctx, "tokens", 50)
	}})
	f.setLimits("llm", throttle.PerSecond(100), throttle.PerSecond(1000).WithBurst(2000).In("tokens"))
	lim := throttle.NewLimiter(f.rdb, throttle.WithLogger(quiet))
	ctx := context.Background()
	for i := range 29 {
		_, err := lim.Enqueue(ctx, f.client, newTask(t, "sync:llm", []byte(fmt.Sprintf("job-%d", i)), throttle.Key("llm"), throttle.Uses("tokens", 200)))
		require.NoError(t, err)
	}
	// The latest booking, 4 s ahead: the first a refund brings forward.
	info, err := lim.Enqueue(ctx, f.client, newTask(t, "sync:llm", []byte("later"), throttle.Key("llm"), throttle.Uses("tokens", 200)), asynq.TaskID("later"))
	require.NoError(t, err)
	require.Greater(t, time.Until(info.NextProcessAt), 2*time.Second, "booked behind the others")
	require.NoError(t, f.insp.DeleteTask("default", "later"))
	_, err = f.client.Enqueue(newTask(t, "sync:llm", []byte("later"), throttle.Key("llm"), throttle.Uses("tokens", 200)), asynq.TaskID("later"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	close(release)

	// The others run, their refunds bringing bookings forward.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) >= 29
	}, 20*time.Second, 50*time.Millisecond, "the 29 booked tasks ran")
	mu.Lock()
	_, bad := ran["later"]
	mu.Unlock()
	assert.False(t, bad, "a task enqueued for an hour later ran now")
	later, err := f.insp.GetTaskInfo("default", "later")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateScheduled, later.State)
	assert.Greater(t, time.Until(later.NextProcessAt), 50*time.Minute, "still due in an hour")
}
