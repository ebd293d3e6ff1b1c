package throttle_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// A task admitted ahead, at its paced instant, waits in its worker for it.
// A suspension this process learns of during that wait (Suspend here; a 429
// of another of its tasks, or a decision that saw one, alike) stops it: its
// handler does not run, its admission is given back, and it is deferred
// past the suspension. Of one key and of several.
func TestSuspensionDuringAPacedWaitStopsTheTask(t *testing.T) {
	redistest.Require(t)
	for _, keys := range [][]string{{"crm"}, {"crm", "ws"}} {
		t.Run(keys[len(keys)-1], func(t *testing.T) {
			// (A task that comes back after its instant does not wait: the
			// case is then not met, and tried again.)
			for try := 1; !suspendDuringPacedWait(t, keys); try++ {
				if try == 3 {
					t.Fatal("in 3 tries, the second task never waited in its worker for its paced instant")
				}
			}
		})
	}
}

// suspendDuringPacedWait runs the case once; it reports whether the second
// task waited for its instant (else nothing was checked).
func suspendDuringPacedWait(t *testing.T, keys []string) bool {
	ctx := context.Background()
	srvRedis := redistest.Start(t)
	rdb := srvRedis.Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(1).WithBurst(1)))
	require.NoError(t, lim.SetLimits(ctx, "ws", throttle.PerSecond(100)))
	var mu sync.Mutex
	var events []throttle.Event
	lim.OnEvent(func(ev throttle.Event) {
		if ev.Outcome == throttle.Ran && ev.Wait > 0 {
			// Before the task's worker starts its wait (the event comes
			// first): the suspension is certain to fall inside it.
			assert.NoError(t, lim.Suspend(ctx, "crm", 30*time.Second))
		}
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})
	var ran atomic.Int64
	srv := worker.NewServer(srvRedis.Client(t), asynq.Config{Concurrency: 2, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	mux := asynq.NewServeMux()
	mux.Use(lim.Middleware())
	mux.HandleFunc("sync", func(context.Context, *asynq.Task) error {
		ran.Add(1)
		return nil
	})
	client := asynq.NewClientFromRedisClient(rdb)
	_, err := client.Enqueue(newTask(t, "sync", []byte("a"), throttle.Key(keys...)))
	require.NoError(t, err)
	info, err := client.Enqueue(newTask(t, "sync", []byte("b"), throttle.Key(keys...)))
	require.NoError(t, err)
	// The first task runs about mid-second: the second, deferred to its
	// instant 1 s later, comes back on the whole second before it and waits
	// about half a second in its worker.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1500 * time.Millisecond)))
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)

	insp := asynq.NewInspectorFromRedisClient(rdb)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) >= 3 && events[len(events)-1].Outcome != throttle.Deferred || len(events) >= 4
	}, 5*time.Second, time.Millisecond, "the second task is decided again at its instant")
	mu.Lock()
	got := append([]throttle.Event(nil), events...)
	mu.Unlock()
	if got[2].Outcome != throttle.Ran || got[2].Wait == 0 {
		t.Logf("the second task did not wait for its instant (%v, wait %v); again", got[2].Outcome, got[2].Wait)
		return false
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 4
	}, 3*time.Second, time.Millisecond, "the waiting task is deferred when its wait ends")
	// Its token is back: at its instant, the token it was admitted on is
	// there (taken, the next would be 1 s off).
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Greater(t, st.Tokens[0], 0.6, "the admission of the task that did not run was given back")

	assert.Equal(t, int64(1), ran.Load(), "the task waiting for its paced instant ran during the suspension")
	mu.Lock()
	last := events[3]
	mu.Unlock()
	assert.Equal(t, throttle.Deferred, last.Outcome)
	assert.Equal(t, throttle.RefusedBySuspension, last.Reason)
	assert.Equal(t, "crm", last.Key)
	require.Eventually(t, func() bool {
		ti, err := insp.GetTaskInfo("default", info.ID)
		return err == nil && ti.State != asynq.TaskStateActive
	}, 3*time.Second, 10*time.Millisecond)
	ti, err := insp.GetTaskInfo("default", info.ID)
	require.NoError(t, err)
	assert.Greater(t, time.Until(ti.NextProcessAt), 25*time.Second, "deferred past the suspension: %v", ti.State)
	return true
}
