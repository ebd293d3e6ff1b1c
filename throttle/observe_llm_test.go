package throttle_test

import (
	"context"
	"errors"
	"io"
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

// llmRig runs handlers under the middleware of a Limiter on a real Redis.
type llmRig struct {
	t   *testing.T
	ctx context.Context
	lim *throttle.Limiter
	log *logtest.Recorder
}

func newLLMRig(t *testing.T) *llmRig {
	rdb := redistest.Start(t).Client(t)
	log := &logtest.Recorder{}
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(log.Logger()), throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	return &llmRig{t: t, ctx: context.Background(), lim: lim, log: log}
}

// observe runs a task of key through the middleware whose handler calls
// Observe on resp, and returns what the middleware returned and what
// Observe returned.
func (r *llmRig) observe(key string, resp *http.Response) (handlerErr, observeErr error) {
	r.t.Helper()
	handlerErr = r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		observeErr = throttle.Observe(ctx, resp)
		return observeErr
	})).ProcessTask(r.ctx, newTask(r.t, "llm:call", nil, throttle.Key(key)))
	return handlerErr, observeErr
}

func llmResponse(status int, body string, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}

// Limits configured 10x too high come down to what an OpenAI response
// says, for each unit, after one response; the tokens' bucket, which the
// reset says holds a second's worth, gets that burst: a fleet that learned
// it does not send a minute's worth at once.
func TestObserveLearnsEachUnitFromOpenAIHeaders(t *testing.T) {
	r := newLLMRig(t)
	require.NoError(t, r.lim.SetLimits(r.ctx, "openai:gpt-4o", throttle.PerMinute(5000), throttle.PerMinute(1_200_000).In("tokens")))
	resp := llmResponse(200, "{}",
		"x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "499", "x-ratelimit-reset-requests", "120ms",
		"x-ratelimit-limit-tokens", "120000", "x-ratelimit-remaining-tokens", "1500", "x-ratelimit-reset-tokens", "250ms")
	_, err := r.observe("openai:gpt-4o", resp)
	require.NoError(t, err)
	st, err := r.lim.Inspect(r.ctx, "openai:gpt-4o")
	require.NoError(t, err)
	require.Len(t, st.InForce, 2)
	assert.Equal(t, 500, st.InForce[0].N, "requests per minute learned")
	assert.Equal(t, 120000, st.InForce[1].N, "tokens per minute learned")
	assert.Equal(t, "tokens", st.InForce[1].Unit)
	assert.Equal(t, 2000, st.InForce[1].Burst, "the bucket holds 1,500 + 120,000/min x 250 ms")
	assert.InDelta(t, 1500, st.Tokens[1], 30, "the tokens left, as the provider says (and what refilled since)")
	assert.Equal(t, 5000, st.Limits[0].N, "the configured limits stay the ceiling")
	assert.NotEmpty(t, r.log.Find("bucket holds less than the key's burst"), "the learned burst is logged")
}

// Limits configured 10x too high as per-second tiers learn an OpenAI
// response's per-minute quotas, converted to a second (issue 29, item 10:
// nothing was learned, silently, and the fleet drew 153 429s): 2,400
// requests and 120,000 tokens a minute, from buckets holding a second, are
// 40 requests and 2,000 tokens a second. A unit the key has no tier of is
// ignored with a warning that names the key, the header and the quota.
func TestObserveLearnsPerMinuteQuotasIntoPerSecondTiers(t *testing.T) {
	r := newLLMRig(t)
	require.NoError(t, r.lim.SetLimits(r.ctx, "openai:gpt-4o", throttle.PerSecond(400), throttle.PerSecond(20_000).In("tokens")))
	resp := llmResponse(200, "{}",
		"x-ratelimit-limit-requests", "2400", "x-ratelimit-remaining-requests", "39", "x-ratelimit-reset-requests", "25ms",
		"x-ratelimit-limit-tokens", "120000", "x-ratelimit-remaining-tokens", "1900", "x-ratelimit-reset-tokens", "50ms")
	_, err := r.observe("openai:gpt-4o", resp)
	require.NoError(t, err)
	st, err := r.lim.Inspect(r.ctx, "openai:gpt-4o")
	require.NoError(t, err)
	require.Len(t, st.InForce, 2)
	assert.Equal(t, throttle.PerSecond(40).WithBurst(40), st.InForce[0], "2,400 requests/min in force as 40/s")
	assert.Equal(t, throttle.PerSecond(2000).WithBurst(2000).In("tokens"), st.InForce[1], "120,000 tokens/min in force as 2,000/s")
	assert.NotEmpty(t, r.log.Find("converted"), "the conversion is logged")

	require.NoError(t, r.lim.SetLimits(r.ctx, "anthropic:claude", throttle.PerMinute(50)))
	_, err = r.observe("anthropic:claude", llmResponse(200, "{}",
		"anthropic-ratelimit-input-tokens-limit", "30000", "anthropic-ratelimit-input-tokens-remaining", "29000",
		"anthropic-ratelimit-input-tokens-reset", time.Now().Add(2*time.Second).UTC().Format(time.RFC3339)))
	require.NoError(t, err)
	warned := r.log.Find("it was ignored")
	require.Len(t, warned, 1, "a quota in a unit the key has no tier of is warned about")
	assert.Equal(t, "anthropic:claude", logtest.Attr(warned[0], "key").String())
	assert.Equal(t, "input-tokens", logtest.Attr(warned[0], "unit").String())
	assert.Equal(t, int64(30000), logtest.Attr(warned[0], "ignored_quota").Int64())
	assert.Contains(t, logtest.Attr(warned[0], "source").String(), "nthropic", "the header family")
}

// Groq's x-ratelimit-*-requests count per day, OpenAI's per minute: a key
// named for Groq matches them to its day tier, whatever else it has.
func TestObserveReadsGroqRequestsPerDay(t *testing.T) {
	r := newLLMRig(t)
	day := throttle.Limit{N: 100000, Per: 24 * time.Hour}
	require.NoError(t, r.lim.SetLimits(r.ctx, "groq:llama", throttle.PerMinute(300), day, throttle.PerMinute(60000).In("tokens")))
	resp := llmResponse(200, "{}",
		"x-ratelimit-limit-requests", "14400", "x-ratelimit-remaining-requests", "14370", "x-ratelimit-reset-requests", "2m59.56s",
		"x-ratelimit-limit-tokens", "18000", "x-ratelimit-remaining-tokens", "17997", "x-ratelimit-reset-tokens", "7.66s")
	_, err := r.observe("groq:llama", resp)
	require.NoError(t, err)
	st, err := r.lim.Inspect(r.ctx, "groq:llama")
	require.NoError(t, err)
	assert.Equal(t, 300, st.InForce[0].N, "the per-minute request tier is not Groq's requests")
	assert.Equal(t, 14400, st.InForce[1].N, "the day tier learned Groq's requests per day")
	assert.Equal(t, 18000, st.InForce[2].N, "tokens per minute")
}

// A spend cap is not a rate limit: Observe returns an error that says so,
// learns nothing, the middleware suspends the key with its own log line and
// a Suspended event carrying it, and the handler can still read the body.
func TestObserveTellsASpendCapFromARateLimit(t *testing.T) {
	r := newLLMRig(t)
	require.NoError(t, r.lim.SetLimits(r.ctx, "anthropic:claude", throttle.PerMinute(50), throttle.PerMinute(40000).In("input-tokens"),
		throttle.Adaptive(30*time.Second)))
	var suspended []throttle.Event
	r.lim.OnEvent(func(ev throttle.Event) {
		if ev.Outcome == throttle.Suspended {
			suspended = append(suspended, ev)
		}
	})
	// (docs.anthropic.com, rate limits: a spend limit reached)
	body := `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`
	resp := llmResponse(429, body, "anthropic-ratelimit-requests-limit", "10", "anthropic-ratelimit-requests-remaining", "0")
	var read string
	herr := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		err := throttle.Observe(ctx, resp)
		b, _ := io.ReadAll(resp.Body)
		read = string(b)
		return err
	})).ProcessTask(r.ctx, newTask(t, "llm:call", nil, throttle.Key("anthropic:claude")))
	assert.Equal(t, body, read, "the handler reads the whole body after Observe")
	var rl *throttle.RateLimitedError
	require.True(t, errors.As(herr, &rl) || herr == nil, "%v", herr)
	st, err := r.lim.Inspect(r.ctx, "anthropic:claude")
	require.NoError(t, err)
	assert.Equal(t, 50, st.InForce[0].N, "no quota learned from a spend cap")
	assert.Equal(t, 1.0, st.AdaptiveFactor, "no adaptive cut either: a cap says nothing of the rate")
	assert.Greater(t, st.SuspendedFor, 30*time.Minute, "suspended until an operator resumes it (WithMaxSuspension)")
	require.NotEmpty(t, r.log.Find("spend cap is reached"), "its own log line")
	assert.Empty(t, r.log.Find("provider rate limited a task"), "not logged as a rate limit")
	require.NotEmpty(t, suspended)
	assert.ErrorContains(t, suspended[0].Err, "not a rate limit")
}

// Azure's retry-after-ms says how long a 429 waits when Retry-After does
// not; -1 is ignored.
func TestObserveWaitsAzuresRetryAfterMs(t *testing.T) {
	r := newLLMRig(t)
	require.NoError(t, r.lim.SetLimits(r.ctx, "azure:gpt", throttle.PerMinute(300)))
	_, err := r.observe("azure:gpt", llmResponse(429, "{}", "retry-after-ms", "2500", "x-ratelimit-remaining-requests", "0"))
	var rl *throttle.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Equal(t, 2500*time.Millisecond, rl.RetryAfter)
	require.NoError(t, r.lim.SetLimits(r.ctx, "azure:other", throttle.PerMinute(300)))
	_, err = r.observe("azure:other", llmResponse(429, "{}", "retry-after-ms", "-1"))
	require.ErrorAs(t, err, &rl)
	assert.Equal(t, time.Duration(0), rl.RetryAfter, "-1 is no wait: the default suspension applies")
}
