package throttle_test

// End-to-end regressions of the waits a task may do in its worker (for a
// slot in flight, for a paced slot) and of the tasks that can never run.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A task whose deadline is near does not wait in its worker for a slot in
// flight past the time it needs to be deferred: it is deferred, keeps its
// retries, and runs once the slot frees. (Regression: the only InFlight(1)
// slot held 3 s, tasks with a timeout of 650 ms or 1 s waited for it into
// their deadline; asynq archived the one with MaxRetry(0) with "context
// deadline exceeded" and spent a retry of the other.)
func TestE2EWaitsEndBeforeTheTaskDeadline(t *testing.T) {
	t.Parallel()
	holding := make(chan struct{})
	var once sync.Once
	f := startFleet(t, fleetConfig{handler: func(ctx context.Context, task *asynq.Task) error {
		if string(task.Payload()) == "holder" {
			once.Do(func() { close(holding) })
			time.Sleep(3 * time.Second)
		}
		return nil
	}})
	f.setLimits("crm", throttle.PerSecond(100), throttle.InFlight(1))
	_, err := f.client.Enqueue(newTask(t, "sync:crm", []byte("holder"), throttle.Key("crm")), asynq.Retention(time.Hour))
	require.NoError(t, err)
	<-holding
	var ids []string
	for _, c := range []struct {
		job     string
		timeout time.Duration
		retry   int
	}{{"t650-r0", 650 * time.Millisecond, 0}, {"t650-r3", 650 * time.Millisecond, 3}, {"t1s-r0", time.Second, 0}, {"t1s-r3", time.Second, 3}} {
		info, err := f.client.Enqueue(newTask(t, "sync:crm", []byte(c.job), throttle.Key("crm")),
			asynq.Timeout(c.timeout), asynq.MaxRetry(c.retry), asynq.Retention(time.Hour))
		require.NoError(t, err)
		f.jobOfID.Store(info.ID, c.job)
		ids = append(ids, info.ID)
	}
	f.waitDone(5, 30*time.Second)
	f.audit(5)
	completed, err := f.insp.ListCompletedTasks("default")
	require.NoError(t, err)
	for _, info := range completed {
		assert.Zero(t, info.Retried, "task %s (%s): retries spent by throttling", info.ID, info.Payload)
	}
	assert.Positive(t, f.ev.deferred.Load(), "the tasks were deferred while the slot was held")
}

// A task that holds a reservation but is refused a slot in flight comes back
// when a slot is expected free, not to its reserved time, which has passed.
// (Regression: 8 tasks behind a slot held 12 s were deferred 60 times, 44
// of them by about 0 s.)
func TestE2EReservedTaskRefusedASlotComesBackWhenOneIsExpectedFree(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var slotDeferrals []time.Duration
	holding := make(chan struct{})
	var once sync.Once
	f := startFleet(t, fleetConfig{
		handler: func(ctx context.Context, task *asynq.Task) error {
			if string(task.Payload()) == "holder" {
				once.Do(func() { close(holding) })
				time.Sleep(6 * time.Second)
			}
			return nil
		},
		observer: func(ev throttle.Event) {
			if ev.Outcome == throttle.Deferred && ev.Reason == throttle.RefusedBySlots {
				mu.Lock()
				slotDeferrals = append(slotDeferrals, ev.Delay)
				mu.Unlock()
			}
		},
	})
	// One task a second: the tasks behind the holder are refused by the
	// bucket first and reserve a slot each, then find the slot in flight
	// held at their reserved time.
	f.setLimits("crm", throttle.PerSecond(1), throttle.InFlight(1))
	_, err := f.client.Enqueue(newTask(t, "sync:crm", []byte("holder"), throttle.Key("crm")), asynq.Retention(time.Hour))
	require.NoError(t, err)
	<-holding
	f.enqueue("crm", "job", 4)
	f.waitDone(5, 40*time.Second)
	f.audit(5)
	mu.Lock()
	defer mu.Unlock()
	short := 0
	for _, d := range slotDeferrals {
		if d < 500*time.Millisecond {
			short++
		}
	}
	t.Logf("deferrals refused a slot: %v", slotDeferrals)
	assert.LessOrEqual(t, short, 1, "deferrals by less than 500 ms while the slot was held for seconds: %v", slotDeferrals)
	assert.LessOrEqual(t, len(slotDeferrals), 12, "deferrals refused a slot: %v", slotDeferrals)
}

// A task already enqueued with a header no worker can throttle (an invalid
// key or cost) fails once, for good, with a log line and outcome Rejected,
// instead of being retried until its retries run out.
func TestE2EBadTaskFailsOnceForGood(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	rejected := map[string]string{}
	f := startFleet(t, fleetConfig{observer: func(ev throttle.Event) {
		if ev.Outcome == throttle.Rejected {
			mu.Lock()
			rejected[ev.TaskID] = ev.Err.Error()
			mu.Unlock()
		}
	}})
	f.setLimits("crm", throttle.PerSecond(10))
	for _, bad := range []map[string]string{
		{throttle.HeaderKey: "crm{x}"},
		{throttle.HeaderKey: strings.Repeat("k", 1000)},
		{throttle.HeaderKey: "crm", keyspace.Cost: "0"},
		{throttle.HeaderKey: "crm", keyspace.Cost: "-3"},
		{throttle.HeaderKey: "crm", keyspace.Cost: "11"}, // above the burst
	} {
		_, err := f.client.Enqueue(asynq.NewTaskWithHeaders("sync:crm", nil, bad), asynq.MaxRetry(5))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		q, err := f.insp.GetQueueInfo("default")
		return err == nil && q.Archived == 5
	}, 20*time.Second, 50*time.Millisecond, "the five tasks archived")
	archived, err := f.insp.ListArchivedTasks("default")
	require.NoError(t, err)
	for _, a := range archived {
		assert.Zero(t, a.Retried, "task %s retried before it was archived: %s", a.ID, a.LastErr)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, rejected, 5, "one Rejected event per task: %v", rejected)
	assert.Zero(t, f.rec.count(), "no handler ran")
}
