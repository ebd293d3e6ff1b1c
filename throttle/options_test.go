package throttle_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Take takes the exact bucket; a decision keeping room for d of dispatch
// jitter (the middleware's headroom) keeps back what the bucket refills in d.
func TestTakeIsExactHeadroomKeepsRoom(t *testing.T) {
	ctx := context.Background()
	lim := throttle.NewLimiter(redistest.Start(t).Client(t), quietLog)
	admitted := func(key string, headroom time.Duration) int {
		t.Helper()
		require.NoError(t, lim.SetLimits(ctx, key, throttle.PerSecond(10)))
		n := 0
		for range 10 {
			d, err := throttle.TakeWithHeadroom(lim, ctx, key, headroom)
			require.NoError(t, err)
			if d.Allowed {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 10, admitted("exact", 0), "PerSecond(10) admits 10 at once through Take")
	// 200 ms of headroom at 10/s: two tokens stay in the bucket.
	assert.Equal(t, 8, admitted("headroom", 200*time.Millisecond))
}

// TestLearnedQuotaLastsWithLearnFor: a quota learned from a response lasts WithLearnFor (at
// least two of the tier's periods) unless the provider says it again, then
// the key is back to its configured limits.
func TestLearnedQuotaLastsWithLearnFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim := throttle.NewLimiter(redistest.Start(t).Client(t), quietLog, throttle.WithLease(0, 0), throttle.WithLearnFor(time.Second))
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(20)))
	rec := httptest.NewRecorder()
	rec.Header().Set("RateLimit-Policy", `"default";q=10;w=1`)
	rec.WriteHeader(http.StatusOK)
	task := newTask(t, "crm:sync", nil, throttle.Key("crm"))
	require.NoError(t, lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Observe(ctx, rec.Result())
	})).ProcessTask(ctx, task))

	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(10).WithBurst(10)}, st.InForce, "learned")
	require.Len(t, st.LearnedFor, 1)
	assert.InDelta(t, 2*time.Second, st.LearnedFor[0], float64(200*time.Millisecond), "1 s asked, two periods of the 1 s tier at least")

	time.Sleep(st.LearnedFor[0] + 100*time.Millisecond)
	st, err = lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(20).WithBurst(20)}, st.InForce, "back to the configured limit")
}

// Invalid options are refused at construction, naming the option: a panic
// from NewLimiter and ByProvider (a programming error), an error from
// CheckOptions; never a task stalled at run time.
func TestInvalidOptionsAreRefusedAtConstruction(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		opt  throttle.Option
		name string
	}{
		{throttle.WithDefaultLimits(throttle.Limit{N: 0, Per: time.Second}), "WithDefaultLimits"},
		{throttle.WithDefaultLimits(throttle.PerSecond(1), throttle.PerSecond(2)), "WithDefaultLimits"},
		{throttle.WithTimeout(-time.Second), "WithTimeout"},
		{throttle.WithPrefix(""), "WithPrefix"},
		{throttle.WithMaxSuspension(0), "WithMaxSuspension"},
		{throttle.WithReservationHorizon(-time.Second), "WithReservationHorizon"},
		{throttle.WithSlotExpiry(time.Millisecond), "WithSlotExpiry"},
		{throttle.WithHeadroom(2 * time.Second), "WithHeadroom"},
		{throttle.WithFailureDelay(0), "WithFailureDelay"},
		{throttle.WithLease(-1, time.Second), "WithLease"},
		{throttle.WithLogger(nil), "WithLogger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := throttle.CheckOptions(tt.opt)
			require.Error(t, err, "CheckOptions(%s)", tt.name)
			assert.Contains(t, err.Error(), tt.name, "the error names the option")
			assert.PanicsWithError(t, err.Error(), func() { throttle.NewLimiter(rdb, tt.opt) }, "NewLimiter(%s)", tt.name)
			assert.PanicsWithError(t, err.Error(), func() { throttle.ByProvider(rdb, tt.opt) }, "ByProvider(%s)", tt.name)
		})
	}
	assert.NoError(t, throttle.CheckOptions(throttle.WithTimeout(0), throttle.WithLease(0, 0), throttle.WithDefaultLimits(throttle.PerSecond(1))))
}
