package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llmPerSecond is 600 RPM and 60,000 TPM held as a second's worth: 10
// requests and 1,000 tokens, refilled at 10 and 1,000 a second.
var llmPerSecond = llmLimits{RPM: 600, TPM: 60000, Capacity: time.Second}

func levels(m *llmModel) (float64, float64) { return m.requests.level, m.tokens.level }

func TestLLMModelTakesBothUnitsOrNeither(t *testing.T) {
	m := newLLMModel(llmPerSecond, at)
	ok, short := m.admit(at, 900)
	require.True(t, ok)
	assert.Nil(t, short)
	r, tok := levels(m)
	assert.InDelta(t, 9, r, 1e-9)
	assert.InDelta(t, 100, tok, 1e-9)

	ok, short = m.admit(at, 101)
	assert.False(t, ok)
	assert.Equal(t, []string{"tokens"}, short)
	r, tok = levels(m)
	assert.InDelta(t, 9, r, 1e-9, "refused for tokens: no request taken")
	assert.InDelta(t, 100, tok, 1e-9)

	for i := range 9 {
		ok, _ = m.admit(at, 10)
		require.True(t, ok, "call %d", i)
	}
	ok, short = m.admit(at, 5)
	assert.False(t, ok)
	assert.Equal(t, []string{"requests"}, short)
	_, tok = levels(m)
	assert.InDelta(t, 10, tok, 1e-9, "refused for requests: no token taken")

	ok, short = m.admit(at, 11)
	assert.False(t, ok)
	assert.Equal(t, []string{"requests", "tokens"}, short)
	assert.Equal(t, 100*time.Millisecond, m.retryAfter(at, 11), "a request in 100 ms; 1 token in 1 ms")
	assert.Equal(t, 190*time.Millisecond, m.retryAfter(at, 200), "190 tokens at 1,000/s")
}

func TestLLMModelRefillsContinuouslyUpToItsCapacity(t *testing.T) {
	m := newLLMModel(llmPerSecond, at)
	for range 10 {
		ok, _ := m.admit(at, 100)
		require.True(t, ok)
	}
	ok, short := m.admit(at.Add(99*time.Millisecond), 99)
	assert.False(t, ok, "99 ms gave 99 tokens but 0.99 request")
	assert.Equal(t, []string{"requests"}, short)
	ok, short = m.admit(at.Add(99*time.Millisecond), 100)
	assert.False(t, ok)
	assert.Equal(t, []string{"requests", "tokens"}, short)
	ok, _ = m.admit(at.Add(100*time.Millisecond), 100)
	assert.True(t, ok, "100 ms gave 1 request and 100 tokens")
	m.refill(at.Add(time.Hour))
	r, tok := levels(m)
	assert.Equal(t, 10.0, r, "never above the capacity")
	assert.Equal(t, 1000.0, tok)
}

// TestLLMModelHoldsOneSecondOfAPerMinuteLimit: 60 RPM enforced as 1/s
// admits one call at once, and the next a second later.
func TestLLMModelHoldsOneSecondOfAPerMinuteLimit(t *testing.T) {
	m := newLLMModel(llmLimits{RPM: 60, TPM: 600000, Capacity: time.Second}, at)
	ok, _ := m.admit(at, 10)
	require.True(t, ok)
	ok, short := m.admit(at.Add(999*time.Millisecond), 10)
	assert.False(t, ok)
	assert.Equal(t, []string{"requests"}, short)
	assert.Equal(t, time.Millisecond, m.retryAfter(at.Add(999*time.Millisecond), 10))
	ok, _ = m.admit(at.Add(time.Second), 10)
	assert.True(t, ok)
	h := http.Header{}
	m.setHeaders(at.Add(time.Second), h)
	assert.Equal(t, "60", h.Get("x-ratelimit-limit-requests"), "the stated per-minute limit")
	assert.Equal(t, "0", h.Get("x-ratelimit-remaining-requests"))
	assert.Equal(t, "1s", h.Get("x-ratelimit-reset-requests"), "a second until full: capacity = remaining + reset x rate = 1")

	whole := newLLMModel(llmLimits{RPM: 60, TPM: 600000, Capacity: time.Minute}, at)
	for i := range 60 {
		ok, _ = whole.admit(at, 10)
		require.True(t, ok, "a minute's worth at once: call %d", i)
	}
	ok, _ = whole.admit(at, 10)
	assert.False(t, ok)
}

func TestLLMModelSendsOpenAIsHeaders(t *testing.T) {
	m := newLLMModel(llmPerSecond, at)
	h := http.Header{}
	m.setHeaders(at, h)
	assert.Equal(t, http.Header{
		"X-Ratelimit-Limit-Requests": {"600"}, "X-Ratelimit-Remaining-Requests": {"10"}, "X-Ratelimit-Reset-Requests": {"0s"},
		"X-Ratelimit-Limit-Tokens": {"60000"}, "X-Ratelimit-Remaining-Tokens": {"1000"}, "X-Ratelimit-Reset-Tokens": {"0s"},
	}, h, "full: nothing to reset")
	ok, _ := m.admit(at, 988)
	require.True(t, ok)
	m.setHeaders(at, h)
	assert.Equal(t, "9", h.Get("x-ratelimit-remaining-requests"))
	assert.Equal(t, "100ms", h.Get("x-ratelimit-reset-requests"))
	assert.Equal(t, "12", h.Get("x-ratelimit-remaining-tokens"))
	assert.Equal(t, "988ms", h.Get("x-ratelimit-reset-tokens"))

	slow := newLLMModel(llmLimits{RPM: 60, TPM: 1000, Capacity: 6 * time.Minute}, at)
	ok, _ = slow.admit(at, 6000)
	require.True(t, ok)
	slow.setHeaders(at, h)
	assert.Equal(t, "0", h.Get("x-ratelimit-remaining-tokens"))
	assert.Equal(t, "6m0s", h.Get("x-ratelimit-reset-tokens"), "OpenAI's documented example")
}

func TestOpenAIDurationIsGoDurationRoundedUpToTheMillisecond(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", -time.Second: "0s", 300 * time.Microsecond: "1ms", 12 * time.Millisecond: "12ms",
		11200 * time.Microsecond: "12ms", time.Second: "1s", 1500 * time.Millisecond: "1.5s",
		8640 * time.Millisecond: "8.64s", 6 * time.Minute: "6m0s", 86*time.Second + 400*time.Millisecond: "1m26.4s",
	} {
		assert.Equal(t, want, openAIDuration(d), "%v", d)
	}
}

func TestLLMModelSettlesAChargeToItsUsage(t *testing.T) {
	lim := llmPerSecond
	lim.Settle = true
	m := newLLMModel(lim, at)
	ok, _ := m.admit(at, 500)
	require.True(t, ok)
	assert.Equal(t, -300, m.settle(at, 500, 200), "300 of the estimate refunded")
	_, tok := levels(m)
	assert.InDelta(t, 800, tok, 1e-9)
	assert.Equal(t, -1000, m.settle(at, 1000, 0), "a refund never fills the bucket above its capacity")
	_, tok = levels(m)
	assert.InDelta(t, 1000, tok, 1e-9)

	ok, _ = m.admit(at, 500)
	require.True(t, ok)
	assert.Equal(t, 1200, m.settle(at, 500, 1700), "the excess charged")
	_, tok = levels(m)
	assert.InDelta(t, -700, tok, 1e-9, "in debt")
	h := http.Header{}
	m.setHeaders(at, h)
	assert.Equal(t, "0", h.Get("x-ratelimit-remaining-tokens"), "never below 0")
	assert.Equal(t, "1.7s", h.Get("x-ratelimit-reset-tokens"))
	ok, _ = m.admit(at.Add(700*time.Millisecond), 1)
	assert.False(t, ok, "out of debt, not yet 1 token")
	ok, _ = m.admit(at.Add(701*time.Millisecond), 1)
	assert.True(t, ok)

	plain := newLLMModel(llmPerSecond, at)
	ok, _ = plain.admit(at, 500)
	require.True(t, ok)
	assert.Equal(t, 0, plain.settle(at, 500, 100), "without settle the estimate stays charged")
	_, tok = levels(plain)
	assert.InDelta(t, 500, tok, 1e-9)
}

// TestLLMProviderAnswersLikeOpenAI: a 200 with the usage in its body and
// the headers as of its completion, before the settle; a 429 with retry-after and OpenAI's
// error body; the counts and events of the endpoint.
func TestLLMProviderAnswersLikeOpenAI(t *testing.T) {
	var clock atomic.Int64
	clock.Store(at.UnixNano())
	p := newLLMProvider(0)
	defer p.Close()
	p.now = func() time.Time { return time.Unix(0, clock.Load()) }
	lim := llmPerSecond
	lim.Settle = true
	p.add("gpt", lim)

	resp, used, err := p.call(t.Context(), "gpt", 900, 300)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 300, used)
	assert.Equal(t, "100", resp.Header.Get("x-ratelimit-remaining-tokens"), "as of the response: the estimate of 900 still charged")
	assert.Equal(t, "900ms", resp.Header.Get("x-ratelimit-reset-tokens"))

	raw, err := p.client.Get(p.srv.URL + "/l/gpt?estimate=800&used=10")
	require.NoError(t, err)
	defer raw.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, raw.StatusCode)
	assert.Equal(t, "1", raw.Header.Get("retry-after"), "100 ms, in whole seconds, at least 1")
	assert.Equal(t, "700", raw.Header.Get("x-ratelimit-remaining-tokens"))
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	require.NoError(t, json.NewDecoder(raw.Body).Decode(&body))
	assert.Equal(t, "tokens", body.Error.Type)
	assert.Equal(t, "rate_limit_exceeded", body.Error.Code)
	assert.Contains(t, body.Error.Message, "Rate limit reached")

	clock.Add(int64(100 * time.Millisecond))
	resp, _, err = p.call(t.Context(), "gpt", 800, 800)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "100 ms later: 800 tokens")

	ep := p.snapshot("gpt")
	assert.Equal(t, [5]int{3, 2, 1, 0, 1}, [5]int{ep.calls, ep.admitted, ep.limited, ep.shortRequests, ep.shortTokens})
	require.Len(t, ep.events, 4, "two admissions, two completions")
	assert.Equal(t, llmEvent{at: at, requests: 1, tokens: 900}, ep.events[0])
	assert.Equal(t, llmEvent{at: at, tokens: -600, used: 300, done: true}, ep.events[1])
	for _, bad := range []string{"/l/gpt?estimate=-1&used=0", "/l/gpt?used=1", "/x/gpt?estimate=1&used=1"} {
		r, err := p.client.Get(p.srv.URL + bad)
		require.NoError(t, err)
		_ = r.Body.Close()
		assert.Equal(t, http.StatusBadRequest, r.StatusCode, bad)
	}
	_, _, err = p.call(t.Context(), "nope", 1, 1)
	assert.ErrorContains(t, err, strconv.Itoa(http.StatusNotFound))
}
