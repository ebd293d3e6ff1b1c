package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Used called from several goroutines of one handler (parallel calls to
// the provider, each reporting what the task cost so far) settles the cost
// once per change: the task ends up charged the last actual cost, not the
// difference counted twice. Run with -race: the cost is shared state.
func TestConcurrentUsedCallsSettleTheCostOnce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "gql", throttle.PerHour(1000)))
	const goroutines = 8
	err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, goroutines)
		for i := range goroutines {
			wg.Go(func() {
				<-start
				errs[i] = throttle.Used(ctx, "requests", 50)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "Used in goroutine %d", i)
		}
		return nil
	})).ProcessTask(ctx, newTask(t, "gql:query", nil, throttle.Key("gql")))
	require.NoError(t, err)
	st, err := lim.Inspect(ctx, "gql")
	require.NoError(t, err)
	assert.InDelta(t, 950, st.Tokens[0], 0.5, "a task of cost 1 whose actual cost, said %d times at once, was 50", goroutines)
}

// A settlement Redis cannot record never fails the task that ran (issue 29,
// item 7): under WithFailOpen a task whose decision Redis could not make
// runs, and the documented handler ends with `return throttle.Used(...)`;
// an error there would fail the task, and asynq would make its paid call
// again. Used logs it, reports an Unsettled event and returns nil.
func TestUsedThatCannotBeRecordedNeverFailsTheTask(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithFailOpen(), throttle.WithTimeout(200*time.Millisecond))
	r.setLimits("openai", throttle.PerMinute(100), throttle.PerMinute(10_000).In("tokens"))
	ev := recordEvents(r.lim)
	r.mr.Close() // Redis goes away
	ran := false
	err := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		ran = true
		return throttle.Used(ctx, "tokens", 1800)
	})).ProcessTask(context.Background(), newTask(t, "llm:chat", nil, throttle.Key("openai"), throttle.Uses("tokens", 1000)))
	require.True(t, ran, "WithFailOpen runs the task when Redis cannot decide")
	assert.NoError(t, err, "the task's result: its call was made")
	var unsettled []throttle.Event
	ev.mu.Lock()
	for _, e := range ev.all {
		if e.Outcome == throttle.Unsettled {
			unsettled = append(unsettled, e)
		}
	}
	ev.mu.Unlock()
	require.Len(t, unsettled, 1, "one Unsettled event")
	assert.Equal(t, "openai", unsettled[0].Key)
	assert.Error(t, unsettled[0].Err, "the event says why")
	assert.Equal(t, "unsettled", throttle.Unsettled.String())
}
