package throttle_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// countHook counts the commands a client sends (pipelined ones included).
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

var _ redis.Hook = (*countHook)(nil)

// respondWith returns a response with headers h.
func respondWith(h map[string]string) *http.Response {
	rec := httptest.NewRecorder()
	for k, v := range h {
		rec.Header().Set(k, v)
	}
	rec.WriteHeader(http.StatusOK)
	return rec.Result()
}

// A provider whose published window changes on every response (D9): 2,000
// responses cost a bounded number of Redis calls and one warning, not one
// of each per response. A quota that lowers a tier in force still reaches
// Redis at once, and one that raises it back within observeGap.
func TestObserveBoundsCallsAndWarnings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	calls := &countHook{}
	rdb.AddHook(calls)
	logs := &logtest.Recorder{}
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(logs)), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "api", throttle.PerSecond(10), throttle.PerMinute(300)))
	inForce := func() []throttle.Limit {
		st, err := lim.Inspect(ctx, "api")
		require.NoError(t, err)
		return st.InForce
	}

	var elapsed time.Duration
	var sent int64
	err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		before, start := calls.n.Load(), time.Now()
		for i := range 2000 {
			// The tier of 1 s as configured, and a window that is new
			// every time (no tier has it: past the minute; converted to
			// the minute, it stays above the tier's 300).
			require.NoError(t, throttle.Observe(ctx, respondWith(map[string]string{
				"RateLimit-Policy": fmt.Sprintf(`"s";q=10;w=1, "odd";q=100000;w=%d`, 61+i),
			})))
		}
		elapsed, sent = time.Since(start), calls.n.Load()-before
		return nil
	})).ProcessTask(ctx, newTask(t, "api:sync", nil, throttle.Key("api")))
	require.NoError(t, err)
	t.Logf("2,000 responses in %v: %d Redis calls", elapsed, sent)
	assert.LessOrEqual(t, sent, int64(1+elapsed/time.Second), "Redis calls for 2,000 responses with a changing window (at most one a second)")
	assert.Empty(t, logs.Find("no tier of"), "no warning: a period without a tier is converted to the nearest")
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(10).WithBurst(10), throttle.PerMinute(300).WithBurst(300)}, inForce(), "nothing learned")

	observe := func(policy string) {
		err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			return throttle.Observe(ctx, respondWith(map[string]string{"RateLimit-Policy": policy}))
		})).ProcessTask(ctx, newTask(t, "api:sync", nil, throttle.Key("api")))
		require.NoError(t, err)
	}
	// Lower quotas, one right after the other: each reaches Redis at once.
	observe(`"s";q=5;w=1`)
	assert.Equal(t, throttle.PerSecond(5).WithBurst(5), inForce()[0], "a lower published quota")
	observe(`"s";q=3;w=1, "odd";q=100000;w=77`)
	assert.Equal(t, throttle.PerSecond(3).WithBurst(3), inForce()[0], "a still lower one, at once")
	// A higher one may wait, but not long.
	require.Eventually(t, func() bool {
		observe(`"s";q=8;w=1`)
		return inForce()[0] == throttle.PerSecond(8).WithBurst(8)
	}, 5*time.Second, 100*time.Millisecond, "a higher published quota never reached Redis")
	assert.Empty(t, logs.Find("no tier of"), "no warning")
}
