package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A grouped task never reaches a handler itself: asynq hands the group to
// the server's GroupAggregator, and the task it makes (a new ID, headers
// of the aggregator's choosing) is what the middleware decides. A slot
// reserved at enqueue for the grouped task's ID would never be used: it
// would hold a slot (and, for a slot now, tokens) until it lapsed, and keep
// the task out of its group until then. So Limiter.Enqueue enqueues
// grouped tasks as they are.
func TestEnqueueLeavesGroupedTasksAsTheyAre(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	for range 3 {
		info, err := lim.Enqueue(ctx, client, newTask(t, "sync:crm", nil, throttle.Key("crm")), asynq.Group("daily"))
		require.NoError(t, err)
		assert.Equal(t, asynq.TaskStateAggregating, info.State, "task %s: in its group at once", info.ID)
		_, reserved, err := throttle.Reservation(lim, ctx, "crm", info.ID)
		require.NoError(t, err)
		assert.False(t, reserved, "task %s: a slot reserved for a task that never runs under its ID", info.ID)
	}
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Zero(t, st.Reservations, "reservations")
	assert.InDelta(t, 1, st.Tokens[0], 0.01, "tokens taken for grouped tasks")
}

// Limiter.Enqueue books a task's units: a backlog of 10,000-token tasks on
// 600 requests and 60,000 tokens a minute is reserved one every 10 s (what
// the tokens allow), not every 0.1 s (the requests).
func TestEnqueueBooksTheTasksUnits(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "llm",
		throttle.PerMinute(600).WithBurst(1), throttle.PerMinute(60000).WithBurst(10000).In("tokens")))
	client := asynq.NewClientFromRedisClient(rdb)
	var at []time.Time
	for range 4 {
		info, err := lim.Enqueue(ctx, client, newTask(t, "llm:call", nil, throttle.Key("llm"), throttle.Uses("tokens", 10000)))
		require.NoError(t, err)
		when, reserved, err := throttle.Reservation(lim, ctx, "llm", info.ID)
		require.NoError(t, err)
		require.True(t, reserved, "task %s reserved", info.ID)
		at = append(at, when)
	}
	for i := 1; i < len(at); i++ {
		assert.InDelta(t, float64(10*time.Second), float64(at[i].Sub(at[i-1])), float64(50*time.Millisecond), "reserved instants %v", at)
	}
}
