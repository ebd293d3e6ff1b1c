package quota

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A wait read from a response is never shorter than the response says:
// fractions of a second are kept (Discord's X-RateLimit-Reset of
// 1470173023.123 was cut to the whole second: the key reopened 123 ms
// early) and rounded up to the microsecond a suspension is kept in, and
// Azure's retry-after-ms wins over the Retry-After in whole seconds sent
// beside it (https://learn.microsoft.com/en-us/azure/ai-services/openai/how-to/quota,
// "retry-after-ms: 1500" with "retry-after: 2" in the sample).
func TestWaitsAreNeverRoundedDown(t *testing.T) {
	now := time.Unix(1470173000, 0)
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"Discord's fractional Unix reset", hdr("X-RateLimit-Reset", "1470173023.123"), 23123 * time.Millisecond},
		{"a Unix reset in milliseconds with a fraction", hdr("X-RateLimit-Reset", "1470173023123.5"), 23123500 * time.Microsecond},
		{"a reset in seconds, a fraction of a microsecond up", hdr("RateLimit-Reset", "1.0000001"), time.Second + time.Microsecond},
		{"64.57 s is 64.57 s, not one microsecond more", hdr("RateLimit-Reset", "64.57"), 64570 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := Parse(429, tt.h, now)
			assert.Equal(t, tt.want, q.Reset, "Parse(429, %v).Reset", tt.h)
		})
	}
	retry := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"Azure: retry-after-ms over retry-after", hdr("retry-after-ms", "1500", "retry-after", "2"), 1500 * time.Millisecond},
		{"a fractional Retry-After up to the microsecond", hdr("Retry-After", "0.0000015"), 2 * time.Microsecond},
		{"a fractional retry-after-ms", hdr("retry-after-ms", "0.5"), 500 * time.Microsecond},
		{"a garbled retry-after-ms: Retry-After", hdr("retry-after-ms", "soon", "retry-after", "2"), 2 * time.Second},
	}
	for _, tt := range retry {
		t.Run(tt.name, func(t *testing.T) {
			q := Parse(429, tt.h, now)
			assert.True(t, q.HasRetryAfter)
			assert.Equal(t, tt.want, q.RetryAfter, "Parse(429, %v).RetryAfter", tt.h)
			assert.Equal(t, tt.want, q.Wait())
		})
	}
}

// The spend-cap body checks read only the providers whose bodies they
// describe (issue 34, item 7): a payments API's 402 billing_error (one
// declined card), a 400 that begins "You have reached your specified API
// usage limits" or a 429 insufficient_quota without Retry-After, from a
// provider not named (a "stripe" or "crm" key) or another one, is no spend
// cap: it must not suspend the key for an hour.
func TestSpendCapsAreReadOnlyForTheirProviders(t *testing.T) {
	billing := `{"type":"error","error":{"type":"billing_error","message":"x"}}`
	cases := []struct {
		status int
		body   string
		reason string
		of     []Provider // the providers it is a cap of
	}{
		{429, openAIQuotaBody, SpendCapInsufficientQuota, []Provider{ProviderOpenAI, ProviderAzure}},
		{429, anthropicCapBody, SpendCapAnthropicTier, []Provider{ProviderAnthropic}},
		{400, anthropicOwnLimitBody, SpendCapAnthropicOwn, []Provider{ProviderAnthropic}},
		{402, billing, SpendCapAnthropicBilling, []Provider{ProviderAnthropic}},
	}
	all := []Provider{ProviderUnknown, ProviderOpenAI, ProviderAnthropic, ProviderAzure, ProviderGroq, ProviderMistral}
	for _, c := range cases {
		for _, p := range all {
			want := false
			for _, q := range c.of {
				want = want || q == p
			}
			got := ParseLLMResponse(p, c.status, nil, []byte(c.body), llmNow)
			assert.Equal(t, want, got.SpendCap, "ParseLLMResponse(%q, %d, %s).SpendCap", p, c.status, c.reason)
			assert.Equal(t, !want && c.status == 429, got.RateLimited, "ParseLLMResponse(%q, %d, %s).RateLimited", p, c.status, c.reason)
			assert.Equal(t, want, SpendCapOf(c.reason, p), "SpendCapOf(%s, %q)", c.reason, p)
		}
	}
}
