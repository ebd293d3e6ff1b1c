package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A caller that gives up (WithTimeout) after its decision was sent: Redis
// still makes the decision once it can (here after a CLIENT PAUSE), and
// admits it. Nobody will run the call, so nothing may stay taken for it:
// its tokens are given back and its slot in flight released, where the
// reply reaches the process.
func TestAbandonedDecisionGivesBack(t *testing.T) {
	ctx := context.Background()
	const timeout = 200 * time.Millisecond
	s := redistest.Start(t)
	// Without ContextTimeoutEnabled the client waits for the reply past the
	// caller's deadline (its ReadTimeout), so the reply reaches the process.
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithTimeout(timeout))
	require.NoError(t, lim.SetLimits(ctx, "api", throttle.PerHour(10), throttle.InFlight(1)))
	st, err := lim.Inspect(ctx, "api")
	require.NoError(t, err)
	require.InDelta(t, 10, st.Tokens[0], 0.01)

	admin := s.Client(t)
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 600, "ALL").Err())
	start := time.Now()
	_, err = lim.Take(ctx, "api")
	require.ErrorIs(t, err, context.DeadlineExceeded, "Take while Redis is paused")
	require.Less(t, time.Since(start), 600*time.Millisecond, "Take outlasted its timeout")

	// Once Redis runs the decision, nothing of it may stay taken.
	ok := assert.Eventually(t, func() bool {
		st, err = lim.Inspect(ctx, "api")
		return err == nil && st.InFlight == 0 && st.Tokens[0] > 9.99
	}, 3*time.Second, 20*time.Millisecond, "tokens and slot of the abandoned decision")
	if !ok {
		st, err = lim.Inspect(ctx, "api")
		require.NoError(t, err)
		t.Logf("%d in flight, %.2f tokens", st.InFlight, st.Tokens[0])
	}
	d, err := lim.Take(ctx, "api")
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the only slot, after an abandoned decision")
}
