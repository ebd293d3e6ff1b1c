package throttle_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A key that fails validation (here with '{', which would escape its
// Redis Cluster hash tag) must not run a task silently unthrottled.
func TestInvalidDerivedKeyNeverRunsSilentlyUnthrottled(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	require.NoError(t, throttle.NewLimiter(rdb).SetLimits(ctx, "crm", throttle.PerSecond(100)))

	// From WithKeyFunc: the user's bug. The task fails once, for good
	// (asynq archives it: SkipRetry), with an error and a log line that
	// name the key.
	t.Run("WithKeyFunc", func(t *testing.T) {
		logs := &logtest.Recorder{}
		mw := throttle.ByProvider(rdb, throttle.WithLogger(slog.New(logs)),
			throttle.WithKeyFunc(func(t *asynq.Task) string { return "crm{" + string(t.Payload()) + "}" }))
		var ran atomic.Int64
		err := runTask(mw, asynq.NewTask("sync", []byte("acme")), func() error { ran.Add(1); return nil })
		require.Error(t, err, "a task whose key function gives an invalid key")
		assert.ErrorIs(t, err, throttle.ErrInvalidKey)
		assert.ErrorIs(t, err, asynq.SkipRetry, "retrying cannot fix the key")
		assert.Contains(t, err.Error(), `"crm{acme}"`)
		assert.Contains(t, err.Error(), "WithKeyFunc")
		assert.Zero(t, ran.Load(), "the handler ran")
		lines := logs.AtLeast(slog.LevelError)
		require.Len(t, lines, 1, "log lines at Error")
		assert.Equal(t, "crm{acme}", logtest.Attr(lines[0], "key").String())
		assert.Contains(t, logtest.Attr(lines[0], "err").String(), "WithKeyFunc")
	})

	// From the task type's prefix: the type may never have been meant as a
	// key (the default applies to every type), so its tasks run
	// unthrottled as a type without a prefix does, with one warning per
	// task type.
	t.Run("type prefix", func(t *testing.T) {
		logs := &logtest.Recorder{}
		mw := throttle.ByProvider(rdb, throttle.WithLogger(slog.New(logs)))
		var ran atomic.Int64
		h := func() error { ran.Add(1); return nil }
		for _, typ := range []string{"a{b}:sync", "a{b}:sync", "a{b}:sync", "c}:export"} {
			require.NoError(t, runTask(mw, asynq.NewTask(typ, nil), h), "task type %q", typ)
		}
		assert.Equal(t, int64(4), ran.Load(), "tasks run, unthrottled")
		lines := logs.Find("unthrottled")
		require.Len(t, lines, 2, "one warning per task type")
		for i, typ := range []string{"a{b}:sync", "c}:export"} {
			assert.Equal(t, slog.LevelWarn, lines[i].Level)
			assert.Equal(t, typ, logtest.Attr(lines[i], "task_type").String())
		}
	})

	// Limiter.Enqueue refuses a task whose key function gives an invalid
	// key: the enqueuer hears of it at once.
	t.Run("Enqueue", func(t *testing.T) {
		lim := throttle.NewLimiter(rdb, quietLog, throttle.WithKeyFunc(func(*asynq.Task) string { return "{x}" }))
		_, err := lim.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), asynq.NewTask("sync", nil))
		assert.True(t, errors.Is(err, throttle.ErrInvalidKey), "Enqueue: %v", err)
	})
}
