package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// rig is a Limiter on an in-memory Redis whose clock stands still (no
// refill: what the tiers hold is what the tasks took).
func rig(t *testing.T) (*throttle.Limiter, context.Context) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return throttle.NewLimiter(rdb, throttle.WithHeadroom(0), throttle.WithLease(0, 0)), context.Background()
}

// run runs task through the middleware and handler h, as a worker would.
func run(t *testing.T, lim *throttle.Limiter, h asynq.Handler, task *asynq.Task) error {
	t.Helper()
	return lim.Middleware()(h).ProcessTask(context.Background(), task)
}

// The OpenAI handler books prompt + max_tokens, gives back what the
// response says was not used, and learns the API's limits from its
// headers: a key configured 10x too high comes down to them.
func TestOpenAIHandlerSettlesTokensAndLearnsTheLimits(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("x-ratelimit-limit-requests", "500")
		w.Header().Set("x-ratelimit-remaining-requests", "499")
		w.Header().Set("x-ratelimit-reset-requests", "120ms")
		w.Header().Set("x-ratelimit-limit-tokens", "30000")
		w.Header().Set("x-ratelimit-remaining-tokens", "29000")
		w.Header().Set("x-ratelimit-reset-tokens", "2s")
		fmt.Fprintf(w, `{"usage":{"prompt_tokens":100,"completion_tokens":150,"total_tokens":250}}`)
	}))
	defer api.Close()
	lim, ctx := rig(t)
	const key = "openai:gpt-4o"
	require.NoError(t, lim.SetLimits(ctx, key, throttle.PerMinute(5000), throttle.PerMinute(300000).In("tokens")))
	h := OpenAIHandler(api.URL, "sk-test")
	for range 4 {
		task, err := NewOpenAITask(key, Summarize{Text: "...", PromptTokens: 100, MaxTokens: 1000})
		require.NoError(t, err)
		require.NoError(t, run(t, lim, h, task))
	}
	st, err := lim.Inspect(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, 500, st.InForce[0].N, "requests per minute learned from the headers")
	assert.Equal(t, 30000, st.InForce[1].N, "tokens per minute learned")
	assert.Equal(t, 30000, st.InForce[1].Burst, "the bucket holds what is left and 2 s of refill: 29,000 + 1,000, a minute's worth")
	assert.LessOrEqual(t, st.Tokens[1], 29000.0-3*250, "the tokens the API says are left, less the settled usage of the tasks after")
}

// The Anthropic handler books input tokens and max_tokens as output
// tokens, and settles both from the usage; a spend limit reached suspends
// the key as no rate limit.
func TestAnthropicHandlerSettlesBothUnits(t *testing.T) {
	capped := false
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if capped {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`)
			return
		}
		fmt.Fprintf(w, `{"usage":{"input_tokens":400,"output_tokens":120}}`)
	}))
	defer api.Close()
	lim, ctx := rig(t)
	const key = "anthropic:claude"
	require.NoError(t, SetAnthropicLimits(ctx, lim, key))
	h := AnthropicHandler(api.URL, "sk-ant-test")
	for range 5 {
		task, err := NewAnthropicTask(key, Summarize{Text: "...", PromptTokens: 400, MaxTokens: 1024})
		require.NoError(t, err)
		require.NoError(t, run(t, lim, h, task))
	}
	st, err := lim.Inspect(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, []float64{45, 30000 - 5*400, 8000 - 5*120}, st.Tokens, "5 requests, their input tokens, and the output tokens they used (not the 1,024 booked)")

	capped = true
	task, err := NewAnthropicTask(key, Summarize{Text: "...", PromptTokens: 400, MaxTokens: 1024})
	require.NoError(t, err)
	_ = run(t, lim, h, task) // deferred: the key is suspended
	st, err = lim.Inspect(ctx, key)
	require.NoError(t, err)
	assert.Greater(t, st.SuspendedFor, 30*time.Minute, "a spend cap suspends the key until an operator resumes it")
	assert.Equal(t, 50, st.InForce[0].N, "nothing learned from it")
}

// docs/llm.md shows this package's code: every line of its Go blocks is a
// line of openai.go or anthropic.go (the docs drop some comments).
func TestDocsShowThisCode(t *testing.T) {
	doc, err := os.ReadFile("../../docs/llm.md")
	require.NoError(t, err)
	var src string
	for _, f := range []string{"openai.go", "anthropic.go"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		src += string(b)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(src, "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	blocks := strings.Split(string(doc), "```go\n")[2:] // the first is "What you write"
	require.Len(t, blocks, 2, "an OpenAI and an Anthropic block")
	for _, b := range blocks {
		code, _, _ := strings.Cut(b, "```")
		for _, l := range strings.Split(code, "\n") {
			l = strings.TrimSpace(l)
			if i := strings.Index(l, " // "); i >= 0 && !lines[l] {
				l = strings.TrimSpace(l[:i])
			}
			if l == "" || strings.HasPrefix(l, "//") {
				continue
			}
			found := lines[l]
			for k := range lines {
				if found {
					break
				}
				found = strings.HasPrefix(k, l+" //") || strings.HasPrefix(k, l+"\t//")
			}
			assert.True(t, found, "docs/llm.md line not in the example's code: %q", l)
		}
	}
}
