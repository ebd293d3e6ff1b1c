package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A wait narrower than the key (one object locked, one resource's own
// limit) defers the task that met it, and nothing else: the key is not
// suspended, no adaptive cut, its next task runs at once. Before
// RateLimitedError.TaskOnly, Discord's 429 with X-RateLimit-Scope: shared
// (Retry-After: 1337) stopped every task of the key for 22 minutes.
func TestRateLimitedTaskOnlyDefersTheTaskAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	logs := &logtest.Recorder{}
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(logs.Logger()), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "discord", throttle.PerSecond(50), throttle.Adaptive(time.Minute)))
	var mu sync.Mutex
	var events []throttle.Event
	lim.OnEvent(func(ev throttle.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})
	ran := 0
	h := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		ran++
		if string(task.Payload()) == "locked" {
			return &throttle.RateLimitedError{RetryAfter: 1337 * time.Second, StatusCode: 429, TaskOnly: true}
		}
		return nil
	}))
	err := h.ProcessTask(ctx, newTask(t, "discord:post", []byte("locked"), throttle.Key("discord")))
	require.NoError(t, err, "deferred (outside a worker.NewServer, by a copy)")

	st, err := lim.Inspect(ctx, "discord")
	require.NoError(t, err)
	assert.Zero(t, st.SuspendedFor, "the key is not suspended for one resource's wait")
	assert.Equal(t, 1.0, st.AdaptiveFactor, "nor cut")

	require.NoError(t, h.ProcessTask(ctx, newTask(t, "discord:post", []byte("other"), throttle.Key("discord"))))
	assert.Equal(t, 2, ran, "the key's next task runs at once")

	mu.Lock()
	defer mu.Unlock()
	var deferred []throttle.Event
	for _, ev := range events {
		if ev.Outcome == throttle.Deferred || ev.Outcome == throttle.Suspended {
			deferred = append(deferred, ev)
		}
	}
	require.Len(t, deferred, 1, "events %+v", events)
	assert.Equal(t, throttle.Deferred, deferred[0].Outcome)
	assert.Equal(t, throttle.RefusedByProvider, deferred[0].Reason)
	assert.Equal(t, "provider", deferred[0].Reason.String())
	assert.GreaterOrEqual(t, deferred[0].Delay, 1337*time.Second, "the task waits what the provider asked")
	assert.LessOrEqual(t, deferred[0].Delay, 1337*time.Second+11*time.Second, "and a jitter of at most 10 s more")
	assert.Empty(t, logs.Find("suspended fleet-wide"))
}

func TestRateLimitedTaskOnlySaysSo(t *testing.T) {
	err := &throttle.RateLimitedError{RetryAfter: 2 * time.Second, TaskOnly: true}
	assert.Equal(t, "throttle: the provider asked this task alone to wait 2s (one object or resource, not the key's quota)", err.Error())
}
