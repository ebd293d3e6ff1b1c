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

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// Resume or SetLimits of a task's SECOND key brings back the tasks of
// several keys waiting for the old instant, deferred by the middleware or
// booked by Limiter.Enqueue, and they run without waiting for it: the
// instant was booked in the second key and held ("~ID") in the first,
// whose queue is open (tasks of its own are booked a moment ahead); the
// hold, its booking gone, must not make the task wait for the old instant.
func TestResumeOrSetLimitsOfTheSecondKeyRunsTasksOfSeveralKeysNow(t *testing.T) {
	redistest.Require(t)
	for _, tt := range []struct {
		name  string
		setup func(ctx context.Context, op *throttle.Limiter) error
		bring func(ctx context.Context, op *throttle.Limiter) (int, error)
	}{
		{"resume", func(ctx context.Context, op *throttle.Limiter) error {
			if err := op.SetLimits(ctx, "b", throttle.PerSecond(100)); err != nil {
				return err
			}
			return op.Suspend(ctx, "b", time.Minute)
		}, func(ctx context.Context, op *throttle.Limiter) (int, error) {
			return op.Resume(ctx, "b")
		}},
		{"setlimits", func(ctx context.Context, op *throttle.Limiter) error {
			if err := op.SetLimits(ctx, "b", throttle.PerMinute(1)); err != nil {
				return err
			}
			_, err := op.Take(ctx, "b")
			return err
		}, func(ctx context.Context, op *throttle.Limiter) (int, error) {
			return -1, op.SetLimits(ctx, "b", throttle.PerSecond(100))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			srvRedis := redistest.Start(t)
			rdb := srvRedis.Client(t)
			lim := throttle.NewLimiter(rdb, quietLog)
			operator := throttle.NewLimiter(srvRedis.Client(t), quietLog) // (another process: lim caches nothing it did)
			require.NoError(t, operator.SetLimits(ctx, "a", throttle.PerSecond(5).WithBurst(1)))
			require.NoError(t, tt.setup(ctx, operator))

			var mu sync.Mutex
			ran := map[string]bool{}
			srv := worker.NewServer(srvRedis.Client(t), asynq.Config{Concurrency: 4, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
			mux := asynq.NewServeMux()
			mux.Use(lim.Middleware())
			mux.HandleFunc("sync", func(ctx context.Context, _ *asynq.Task) error {
				id, _ := asynq.GetTaskID(ctx)
				mu.Lock()
				defer mu.Unlock()
				ran[id] = true
				return nil
			})

			client := asynq.NewClientFromRedisClient(rdb)
			insp := asynq.NewInspectorFromRedisClient(rdb)
			// a's own queue: tasks of a alone booked over the next 2 s.
			for i := range 10 {
				_, err := lim.Enqueue(ctx, client, newTask(t, "sync", []byte(fmt.Sprint("a", i)), throttle.Key("a")), asynq.Retention(time.Hour))
				require.NoError(t, err)
			}
			var ids []string
			for i := range 3 {
				// Booked by Limiter.Enqueue for b's instant.
				info, err := lim.Enqueue(ctx, client, newTask(t, "sync", []byte(fmt.Sprint("e", i)), throttle.Key("a", "b")), asynq.Retention(time.Hour))
				require.NoError(t, err)
				ids = append(ids, info.ID)
				// Deferred by the middleware to b's instant.
				info, err = client.Enqueue(newTask(t, "sync", []byte(fmt.Sprint("m", i)), throttle.Key("a", "b")), asynq.Retention(time.Hour))
				require.NoError(t, err)
				ids = append(ids, info.ID)
			}
			require.NoError(t, srv.Start(mux))
			t.Cleanup(srv.Shutdown)
			require.Eventually(t, func() bool {
				for _, id := range ids {
					info, err := insp.GetTaskInfo("default", id)
					if err != nil || (info.State != asynq.TaskStateRetry && info.State != asynq.TaskStateScheduled) || time.Until(info.NextProcessAt) < 30*time.Second {
						return false
					}
				}
				return true
			}, 10*time.Second, 50*time.Millisecond, "every task of a and b waits for b, 30 s or more ahead")

			n, err := tt.bring(ctx, operator)
			require.NoError(t, err)
			if n >= 0 {
				assert.Equal(t, len(ids), n, "Resume brought every task back")
			}
			assert.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, id := range ids {
					if !ran[id] {
						return false
					}
				}
				return true
			}, 8*time.Second, 50*time.Millisecond, "every task of a and b ran soon after")
			for _, id := range ids {
				info, err := insp.GetTaskInfo("default", id)
				require.NoError(t, err)
				assert.Equal(t, asynq.TaskStateCompleted, info.State, "task %s: %s, due in %v", id, info.State, time.Until(info.NextProcessAt).Round(time.Second))
			}
		})
	}
}
