package throttle_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// observeOn runs one task of key through lim's middleware, its handler
// returning what Observe says of a response of status, header kv and body.
func observeOn(t *testing.T, lim *throttle.Limiter, key string, status int, body string, kv ...string) error {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	resp := &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
	var observed error
	_ = lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		observed = throttle.Observe(ctx, resp)
		return observed
	})).ProcessTask(context.Background(), newTask(t, "sync", nil, throttle.Key(key)))
	return observed
}

// The spend-cap body checks read only the providers whose bodies they
// describe (issue 34, item 7): on a payments key (named for Stripe, or a
// name Observe does not know), a 402 billing_error from a declined card,
// a 400 whose message begins "You have reached your specified API usage
// limits" and a 429 insufficient_quota without Retry-After are no spend
// cap: no hour-long suspension. The same bodies from a key named for
// Anthropic or OpenAI still are.
func TestObserveReadsSpendCapsOnlyFromTheirProviders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, throttle.WithLogger((&logtest.Recorder{}).Logger()), throttle.WithLease(0, 0))
	bodies := []struct {
		status int
		body   string
		cap    string // the provider whose cap it is
	}{
		{402, `{"type":"error","error":{"type":"billing_error","message":"Your card was declined."}}`, "anthropic"},
		{400, `{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits."}}`, "anthropic"},
		{429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, "openai"},
	}
	for _, b := range bodies {
		for _, key := range []string{"stripe:acct", "crm", "payments-eu", b.cap + ":m"} {
			k := key + ":" + b.cap + "-" + http.StatusText(b.status)[:3]
			require.NoError(t, lim.SetLimits(ctx, k, throttle.PerSecond(10)))
			err := observeOn(t, lim, k, b.status, b.body)
			st, ierr := lim.Inspect(ctx, k)
			require.NoError(t, ierr)
			if strings.HasPrefix(key, b.cap) {
				require.Error(t, err, "%s: %d %s", k, b.status, b.body)
				assert.Contains(t, err.Error(), "spend cap", k)
				assert.Greater(t, st.SuspendedFor, 30*time.Minute, k)
				continue
			}
			assert.Less(t, st.SuspendedFor, 10*time.Second, "%s: a %d %s suspends it for %v", k, b.status, b.body, st.SuspendedFor)
			if err != nil {
				assert.NotContains(t, err.Error(), "spend cap", k)
				assert.Equal(t, 429, b.status, "%s: only a 429 is a rate limit: %v", k, err)
			}
		}
	}
}

// A key named for a provider whose quota's window only its documentation
// states learns the quota from every response, not only the first: the
// first fits it to the key's tiers once Redis told them; later responses
// fit it in the process, without a second call, and with no warning that
// the key has no tier for the quota's period.
func TestObserveFitsADocumentedQuotaOnEveryResponse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	calls := &countHook{}
	rdb.AddHook(calls)
	logs := &logtest.Recorder{}
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(logs)), throttle.WithLease(0, 0))
	require.NoError(t, lim.SetLimits(ctx, "github:org", throttle.PerSecond(20), throttle.PerMinute(830)))
	github := []string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4999", "x-ratelimit-resource", "core"}
	for range 5 {
		require.NoError(t, observeOn(t, lim, "github:org", 200, "", github...))
	}
	st, err := lim.Inspect(ctx, "github:org")
	require.NoError(t, err)
	assert.Equal(t, 20, st.InForce[0].N, "the per-second tier: the nearest is the minute's")
	assert.Equal(t, 83, st.InForce[1].N, "5,000 an hour is 83 a minute, rounded down")
	assert.Empty(t, logs.Find("no tier for"), "a quota converted is no unmatched period")
	assert.Len(t, logs.Find("publishes a lower quota"), 1, "learned once")

	// A provider's quota above the configured one lowers nothing.
	require.NoError(t, lim.SetLimits(ctx, "github:big", throttle.PerMinute(60)))
	require.NoError(t, observeOn(t, lim, "github:big", 200, "", github...))
	st, err = lim.Inspect(ctx, "github:big")
	require.NoError(t, err)
	assert.Equal(t, 60, st.InForce[0].N, "converted, 83 a minute is above the 60 set: only ever lowering")
}

// WithDialect's reader replaces Observe's own reading of a provider it
// knows by that name, and an invalid WithDialect is caught at start.
func TestWithDialect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, throttle.WithLease(0, 0), throttle.WithLogger((&logtest.Recorder{}).Logger()),
		throttle.WithDialect("GitHub", func(resp *http.Response) (throttle.Limit, time.Duration) {
			return throttle.PerHour(100), 0 // an enterprise server's own limits, say
		}))
	require.NoError(t, lim.SetLimits(ctx, "github-ghes", throttle.PerHour(1000)))
	err := observeOn(t, lim, "github-ghes", 403, `{"message":"You have exceeded a secondary rate limit."}`, "x-ratelimit-limit", "5000")
	assert.NoError(t, err, "the user's reading, not GitHub's: no wait said, and a 403 is no rate limit")
	st, ierr := lim.Inspect(ctx, "github-ghes")
	require.NoError(t, ierr)
	assert.Equal(t, 100, st.InForce[0].N, "the quota the reader says, not GitHub's 5000 an hour")

	for _, tt := range []struct {
		name string
		read func(*http.Response) (throttle.Limit, time.Duration)
		says string
	}{
		{"", func(*http.Response) (throttle.Limit, time.Duration) { return throttle.Limit{}, 0 }, "non-empty"},
		{"acme:eu", func(*http.Response) (throttle.Limit, time.Duration) { return throttle.Limit{}, 0 }, "without ':'"},
		{"a{b", func(*http.Response) (throttle.Limit, time.Duration) { return throttle.Limit{}, 0 }, "valid key name"},
		{"acme", nil, "must not be nil"},
	} {
		func() {
			defer func() {
				r := recover()
				require.NotNil(t, r, "WithDialect(%q) was accepted", tt.name)
				e, ok := r.(error)
				require.True(t, ok, "%v", r)
				assert.Contains(t, e.Error(), "WithDialect")
				assert.Contains(t, e.Error(), tt.says)
			}()
			throttle.NewLimiter(rdb, throttle.WithDialect(tt.name, tt.read))
		}()
	}
}
