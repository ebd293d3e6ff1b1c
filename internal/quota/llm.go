package quota

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file reads what an LLM provider's response says about its limits:
// several units (requests, tokens, input and output tokens), each with its
// own limit, remaining count and reset, in headers whose names and formats
// differ by provider. It is groundwork for issue 24: nothing calls it yet.
// As in the rest of the package the input is untrusted: nothing here panics,
// and a value out of its range (negative, NaN, an overflow, a count above
// maxQuota, a duration above maxQuotaDelay, a field above maxFieldLen) is
// ignored as if the header were absent, never clamped.
//
// Families, as the providers document them:
//
//   - OpenAI (https://platform.openai.com/docs/guides/rate-limits, "Rate
//     limits in headers"): x-ratelimit-{limit,remaining,reset}-{requests,
//     tokens}. The reset is a Go-like duration ("1s", "6m0s", "12ms"),
//     "the time until the rate limit ... resets to its initial state", that
//     is until the bucket is full again. The limits are per minute (RPM,
//     TPM).
//   - Anthropic (https://platform.claude.com/docs/en/api/rate-limits,
//     formerly docs.anthropic.com/en/api/rate-limits, "Response headers"):
//     anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
//     {limit,remaining,reset}; the reset is an RFC 3339 time, "when the ...
//     rate limit will be fully replenished". The API "uses the token bucket
//     algorithm": "your capacity is continuously replenished up to your
//     maximum limit". Limits are per minute (RPM, ITPM, OTPM). The token
//     remaining counts are "rounded to the nearest thousand".
//   - Azure OpenAI: x-ratelimit-remaining-{requests,tokens} (no limit
//     header; seen in Microsoft Q&A answers, e.g.
//     https://learn.microsoft.com/en-us/answers/questions/2156987), and on a
//     429 retry-after-ms and retry-after
//     (https://learn.microsoft.com/en-us/azure/ai-services/openai/concepts/provisioned-throughput).
//     The token count "is reset each minute"; requests are evaluated "over a
//     small period of time, typically 1 or 10 seconds"
//     (https://learn.microsoft.com/en-us/azure/ai-foundry/openai/how-to/quota).
//     Azure's x-ratelimit-limit-* and -reset-* are not documented and not
//     read.
//   - Groq (https://console.groq.com/docs/rate-limits, "Rate Limit
//     Headers"): OpenAI's header names, but x-ratelimit-*-requests "Always
//     refers to Requests Per Day (RPD)" and x-ratelimit-*-tokens to "Tokens
//     Per Minute (TPM)". Resets as OpenAI's ("2m59.56s", "7.66s").
//   - Mistral: its documentation (https://docs.mistral.ai/deployment/ai-studio/tier,
//     https://help.mistral.ai/en/articles/392924) names the limits (requests
//     per second, tokens per minute, tokens per month) but no response
//     header. Clients in the wild read x-ratelimitbysize-{limit,remaining}-
//     {minute,month} and ratelimitbysize-{limit,remaining,reset}; being
//     undocumented they are not read, and Mistral falls back to the generic
//     families below.
//   - Unknown provider (""), and Mistral: the anthropic-ratelimit-* family
//     (only Anthropic's API uses those names) and OpenAI's meaning of
//     x-ratelimit-*-{requests,tokens}, with WindowGuessed set on the latter.
//
// A header name means different windows at different providers (OpenAI's
// x-ratelimit-limit-requests is per minute, Groq's per day): that is why the
// caller names the provider.

// Provider names whose headers a response carries; it decides which
// families are read and what their windows are.
type Provider string

// The providers whose headers are known. ProviderUnknown (and any value not
// listed) reads the generic families, with OpenAI's windows guessed.
const (
	ProviderUnknown   Provider = ""
	ProviderOpenAI    Provider = "openai"
	ProviderAnthropic Provider = "anthropic"
	ProviderAzure     Provider = "azure"
	ProviderGroq      Provider = "groq"
	ProviderMistral   Provider = "mistral"
)

// ParseProvider reads a provider's name (case and surrounding spaces
// ignored; "" is ProviderUnknown) and refuses any other name.
func ParseProvider(s string) (Provider, error) {
	p := Provider(strings.ToLower(strings.TrimSpace(s)))
	switch p {
	case ProviderUnknown, ProviderOpenAI, ProviderAnthropic, ProviderAzure, ProviderGroq, ProviderMistral:
		return p, nil
	}
	return ProviderUnknown, fmt.Errorf("provider: unknown LLM provider %.64q (want openai, anthropic, azure, groq, mistral, or empty for unknown)", s)
}

// The units a limit counts.
const (
	UnitRequests     = "requests"
	UnitTokens       = "tokens"
	UnitInputTokens  = "input-tokens"
	UnitOutputTokens = "output-tokens"
)

// Day is the window of Groq's request limits.
const Day = 24 * time.Hour

// UnitQuota is what a response says about one unit of one provider's limit.
type UnitQuota struct {
	// Unit is UnitRequests, UnitTokens, UnitInputTokens or UnitOutputTokens.
	Unit string
	// Limit is the stated limit per Window, 1 to maxQuota; 0 when not said.
	Limit int
	// Remaining is what is left now, 0 to maxQuota; -1 when not said.
	Remaining int
	// Reset is the time until the bucket is full again (OpenAI, Groq,
	// Anthropic); a reset in the past is 0. HasReset tells a stated 0 from
	// none.
	Reset    time.Duration
	HasReset bool
	// Window is the limit's window (time.Minute, or Day for Groq's
	// requests), as the provider documents it.
	Window time.Duration
	// WindowGuessed: the provider was not named (or documents no header),
	// and Window is OpenAI's meaning of the header, a guess.
	WindowGuessed bool
	// Burst is the bucket's capacity learned from this response (see
	// bucketCapacity), 1 to Limit; 0 when it cannot be told. A per-minute
	// limit is not a minute's burst: Anthropic says 60 RPM "may be enforced
	// as 1 request per second".
	Burst int
	// Source is the family whose meaning was applied: "openai",
	// "anthropic", "azure" or "groq".
	Source string
}

// LLMInfo is what one LLM provider's response says about its limits.
type LLMInfo struct {
	// Units, sorted by Unit, then Window, then Source.
	Units []UnitQuota
	// RetryAfter is read from retry-after-ms (Azure; preferred) or
	// Retry-After (delay-seconds or an HTTP-date); HasRetryAfter tells a
	// stated 0 from none. A negative retry-after-ms (-1) is ignored.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// RateLimited: a 429 (or a 503 with a valid Retry-After), and not a
	// spend cap as far as known (ParseLLM cannot tell; ParseLLMResponse
	// can).
	RateLimited bool
	// SpendCap: the response is a spend or billing cap, not a rate limit:
	// waiting a minute does not help. Set by ParseLLMResponse only.
	SpendCap bool
	// SpendCapReason names the cap, as SpendCapFromBody does.
	SpendCapReason string
}

// xMeaning is what the x-ratelimit-* family means at one provider.
type xMeaning struct {
	source                       string
	requestsWindow, tokensWindow time.Duration
	guessed                      bool
}

var (
	openAIMeaning  = xMeaning{source: "openai", requestsWindow: time.Minute, tokensWindow: time.Minute}
	groqMeaning    = xMeaning{source: "groq", requestsWindow: Day, tokensWindow: time.Minute}
	guessedMeaning = xMeaning{source: "openai", requestsWindow: time.Minute, tokensWindow: time.Minute, guessed: true}
)

// ParseLLM reads what the headers of a response with this status say about
// provider p's limits, at now (for RFC 3339 resets and HTTP-dates). A
// Provider value not among the constants reads as ProviderUnknown. It never
// sets SpendCap: no provider marks a spend cap in a header; see
// ParseLLMResponse.
func ParseLLM(p Provider, status int, h http.Header, now time.Time) LLMInfo {
	var q LLMInfo
	q.RetryAfter, q.HasRetryAfter = retryAfter(h, now)
	q.RateLimited = status == http.StatusTooManyRequests ||
		(status == http.StatusServiceUnavailable && q.HasRetryAfter)
	switch p {
	case ProviderOpenAI:
		q.Units = xUnits(h, openAIMeaning)
	case ProviderGroq:
		q.Units = xUnits(h, groqMeaning)
	case ProviderAnthropic:
		q.Units = anthropicUnits(h, now)
	case ProviderAzure:
		q.Units = azureUnits(h)
	default: // unknown, Mistral (no documented header), anything else
		q.Units = append(anthropicUnits(h, now), xUnits(h, guessedMeaning)...)
	}
	slices.SortFunc(q.Units, func(a, b UnitQuota) int {
		return cmp.Or(cmp.Compare(a.Unit, b.Unit), cmp.Compare(a.Window, b.Window), cmp.Compare(a.Source, b.Source))
	})
	return q
}

// ParseLLMResponse is ParseLLM that also reads the response's error body,
// to tell a spend or billing cap from a rate limit: SpendCap is set when
// SpendCapFromBody finds a cap in the body, under the status its provider
// documents for it (429 for OpenAI's insufficient_quota and Anthropic's
// enforced_spend_limit_reached, 400 for a spend limit set in Anthropic's
// console, 402 for Anthropic's billing_error), and a 429 carries no
// retry-after. Anthropic's tier spend cap "has no retry-after header" and
// "Retrying ... fails until access resumes"
// (https://platform.claude.com/docs/en/api/rate-limits, "Reaching your
// spend cap"): a 429 without any retry-after and with a spend-cap body is
// not a rate limit, and RateLimited is cleared. A 429 that carries a
// retry-after stays a rate limit whatever its body says (Anthropic's Claude
// Code workspace limits answer so): taking a rate limit for a month-long cap
// would stop a fleet for nothing.
//
// The body checks are scoped to the providers whose bodies they describe,
// as the header families are (SpendCapOf): OpenAI's insufficient_quota to
// OpenAI and Azure OpenAI, Anthropic's caps to Anthropic. Another
// provider's body that happens to read the same (a payments API's 402
// billing_error, a CRM's 429 insufficient_quota) is no spend cap: a
// ProviderUnknown response is read for none.
func ParseLLMResponse(p Provider, status int, h http.Header, body []byte, now time.Time) LLMInfo {
	q := ParseLLM(p, status, h, now)
	if status == http.StatusTooManyRequests && q.HasRetryAfter {
		return q
	}
	capped, reason := SpendCapFromBody(body)
	if capped && spendCapStatus[reason] == status && SpendCapOf(reason, p) {
		q.SpendCap, q.SpendCapReason, q.RateLimited = true, reason, false
	}
	return q
}

// ExhaustedReset is the reset of the unit that ran out (remaining 0 with
// a reset), the latest when several did: the wait of a 429 that states no
// retry-after (OpenAI's x-ratelimit-remaining-requests: 0 with
// x-ratelimit-reset-requests: 1s waits 1 s, not a default).
func (q LLMInfo) ExhaustedReset() (time.Duration, bool) {
	var d time.Duration
	ok := false
	for _, u := range q.Units {
		if u.Remaining == 0 && u.HasReset {
			d, ok = max(d, u.Reset), true
		}
	}
	return d, ok
}

// The reasons SpendCapFromBody returns, and the status each comes with.
const (
	// SpendCapInsufficientQuota: OpenAI's 429 "You exceeded your current
	// quota, please check your plan and billing details", error code
	// insufficient_quota: the maximum monthly spend or the credits are used
	// up (https://platform.openai.com/docs/guides/error-codes,
	// https://help.openai.com/en/articles/6891831).
	SpendCapInsufficientQuota = "insufficient_quota"
	// SpendCapAnthropicTier: Anthropic's 429 rate_limit_error with
	// error.details.error_code enforced_spend_limit_reached: the tier's
	// monthly spend cap (https://platform.claude.com/docs/en/api/rate-limits).
	SpendCapAnthropicTier = "enforced_spend_limit_reached"
	// SpendCapAnthropicOwn: Anthropic's 400 invalid_request_error whose
	// message begins "You have reached your specified API usage limits"
	// (or "... specified workspace API usage limits"): a spend limit set in
	// the console (same page, "Setting your own spend limit").
	SpendCapAnthropicOwn = "specified_api_usage_limits"
	// SpendCapAnthropicBilling: Anthropic's 402 billing_error, "an issue
	// with your billing or payment information"
	// (https://platform.claude.com/docs/en/api/errors).
	SpendCapAnthropicBilling = "billing_error"
)

// SpendCapOf reports whether reason (a SpendCap constant) is a cap that
// provider p documents: SpendCapInsufficientQuota for ProviderOpenAI and
// ProviderAzure (Azure OpenAI answers in OpenAI's error format), the
// Anthropic ones for ProviderAnthropic; no other provider's.
func SpendCapOf(reason string, p Provider) bool {
	switch reason {
	case SpendCapInsufficientQuota:
		return p == ProviderOpenAI || p == ProviderAzure
	case SpendCapAnthropicTier, SpendCapAnthropicOwn, SpendCapAnthropicBilling:
		return p == ProviderAnthropic
	}
	return false
}

var spendCapStatus = map[string]int{
	SpendCapInsufficientQuota: http.StatusTooManyRequests,
	SpendCapAnthropicTier:     http.StatusTooManyRequests,
	SpendCapAnthropicOwn:      http.StatusBadRequest,
	SpendCapAnthropicBilling:  http.StatusPaymentRequired,
}

// maxErrorBody is the longest error body SpendCapFromBody reads.
const maxErrorBody = 64 << 10

// SpendCapFromBody reports whether a JSON error body is one of the
// documented spend or billing caps, and which (a SpendCap constant). It
// reads OpenAI's {"error": {"code": "insufficient_quota", ...}} and
// Anthropic's {"type": "error", "error": {"type": ..., "message": ...,
// "details": {"error_code": ...}}}; anything else, a body that is not JSON
// or one above 64 KiB is no cap. It does not look at the status: see
// ParseLLMResponse.
func SpendCapFromBody(body []byte) (bool, string) {
	if len(body) == 0 || len(body) > maxErrorBody {
		return false, ""
	}
	var doc struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return false, ""
	}
	var e map[string]any
	if json.Unmarshal(doc.Error, &e) != nil {
		return false, "" // absent, null, or not an object
	}
	details, _ := e["details"].(map[string]any)
	switch typ, msg := jsonString(e, "type"), jsonString(e, "message"); {
	case jsonString(e, "code") == "insufficient_quota" || typ == "insufficient_quota":
		return true, SpendCapInsufficientQuota
	case jsonString(details, "error_code") == "enforced_spend_limit_reached":
		return true, SpendCapAnthropicTier
	case typ == "invalid_request_error" &&
		(strings.HasPrefix(msg, "You have reached your specified API usage limits") ||
			strings.HasPrefix(msg, "You have reached your specified workspace API usage limits")):
		return true, SpendCapAnthropicOwn
	case typ == "billing_error":
		return true, SpendCapAnthropicBilling
	}
	return false, ""
}

// jsonString is m[key] when it is a string, "" otherwise.
func jsonString(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// retryAfter reads retry-after-ms (Azure's; milliseconds, fractions
// accepted; a negative, NaN or garbled value is ignored), which is more
// precise than the Retry-After sent beside it (1500 beside 2), else
// Retry-After.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(field(h, "retry-after-ms")); v != "" && len(v) <= 64 {
		ms, err := strconv.ParseFloat(v, 64)
		if err == nil && ms >= 0 && ms <= float64(maxQuotaDelay/time.Millisecond) {
			return secondsUp(ms / 1e3), true
		}
	}
	return parseRetryAfter(field(h, "Retry-After"), now)
}

// xUnits reads x-ratelimit-{limit,remaining,reset}-{requests,tokens} with
// meaning m; the resets are Go-like durations.
func xUnits(h http.Header, m xMeaning) []UnitQuota {
	var out []UnitQuota
	for _, unit := range []string{UnitRequests, UnitTokens} {
		window := m.tokensWindow
		if unit == UnitRequests {
			window = m.requestsWindow
		}
		reset, hasReset := parseGoDuration(field(h, "x-ratelimit-reset-"+unit))
		u, ok := newUnit(unit, m.source, window, m.guessed,
			field(h, "x-ratelimit-limit-"+unit), field(h, "x-ratelimit-remaining-"+unit), reset, hasReset)
		if ok {
			out = append(out, u)
		}
	}
	return out
}

// anthropicUnits reads anthropic-ratelimit-{unit}-{limit,remaining,reset};
// the resets are RFC 3339 times.
func anthropicUnits(h http.Header, now time.Time) []UnitQuota {
	var out []UnitQuota
	for _, unit := range []string{UnitRequests, UnitTokens, UnitInputTokens, UnitOutputTokens} {
		prefix := "anthropic-ratelimit-" + unit + "-"
		reset, hasReset := parseRFC3339Reset(field(h, prefix+"reset"), now)
		u, ok := newUnit(unit, "anthropic", time.Minute, false,
			field(h, prefix+"limit"), field(h, prefix+"remaining"), reset, hasReset)
		if ok {
			out = append(out, u)
		}
	}
	return out
}

// azureUnits reads Azure's x-ratelimit-remaining-{requests,tokens}. The
// token count is per minute; the request limit is stated per minute but
// evaluated over 1 or 10 seconds, so which window the remaining requests
// count is a guess.
func azureUnits(h http.Header) []UnitQuota {
	var out []UnitQuota
	for _, unit := range []string{UnitRequests, UnitTokens} {
		u, ok := newUnit(unit, "azure", time.Minute, unit == UnitRequests,
			"", field(h, "x-ratelimit-remaining-"+unit), 0, false)
		if ok {
			out = append(out, u)
		}
	}
	return out
}

// newUnit builds one unit from its raw limit and remaining and its parsed
// reset; ok is false when the response says nothing valid about it. A
// negative limit or remaining (Azure's Responses API sends -1 for both, with
// a reset of 0: https://learn.microsoft.com/en-us/answers/questions/5625878)
// means the service does not report the unit: it is dropped whole, its
// reset included.
func newUnit(unit, source string, window time.Duration, guessed bool,
	limit, remaining string, reset time.Duration, hasReset bool) (UnitQuota, bool) {
	if isNegativeInteger(limit) || isNegativeInteger(remaining) {
		return UnitQuota{}, false
	}
	u := UnitQuota{Unit: unit, Remaining: -1, Window: window, WindowGuessed: guessed, Source: source}
	if n, ok := parseCount(limit); ok && n > 0 {
		u.Limit = n
	}
	if n, ok := parseCount(remaining); ok {
		u.Remaining = n
	}
	u.Reset, u.HasReset = reset, hasReset
	if u.Limit == 0 && u.Remaining < 0 && !u.HasReset {
		return UnitQuota{}, false
	}
	if u.HasReset {
		u.Burst = bucketCapacity(u.Limit, u.Remaining, u.Reset, u.Window)
	}
	return u, true
}

// bucketCapacity is the capacity C of a bucket refilled continuously at
// r = limit/window that holds remaining R now and is full again after
// reset D: C = R + r*D, rounded down, at least 1, at most limit. It is 0
// (cannot be told) unless limit, R (0 to limit) and D are all stated.
//
// The estimate's meaning: R + r*D is what the bucket will hold when full,
// so it is the capacity when D is exact. It is a lower bound when the reset
// is rounded down (Anthropic's resets are whole seconds, its token counts
// rounded to thousands). D = 0 is a full bucket holding R: its capacity
// (OpenAI's "0s" on a bucket of a second's worth, the answer a client
// calling one at a time always gets), unless R is the limit (a full bucket
// of the whole limit lowers nothing) or 0 (nonsense). A D above the window
// cannot come from a bucket of that window refilled at limit/window
// (OpenAI's docs show a "6m0s" token reset on a per-minute limit): the
// capacity is then the limit. R is rounded down by the provider, and so is
// the sum: against a reset to the millisecond, the estimate is C rounded
// down or one below it. Observe (observe.lua) keeps the burst in force
// against one told within that rounding of it (one, or 1 %).
func bucketCapacity(limit, remaining int, reset, window time.Duration) int {
	if limit < 1 || remaining < 0 || remaining > limit || reset < 0 || window <= 0 {
		return 0
	}
	if reset == 0 {
		// Full now: the bucket holds what is left. At the limit, or
		// holding nothing, that tells nothing.
		if remaining == limit || remaining == 0 {
			return 0
		}
		return remaining
	}
	// r*D = limit*D/window, exactly, in 128 bits: limit <= 1e9 and D <= 30
	// days in nanoseconds overflow 64.
	hi, lo := bits.Mul64(uint64(limit), uint64(reset))
	if hi >= uint64(window) { // the quotient would not fit 64 bits
		return limit
	}
	refill, _ := bits.Div64(hi, lo, uint64(window))
	if refill >= uint64(limit-remaining) {
		return limit
	}
	return max(1, remaining+int(refill))
}

// isNegativeInteger reports a value of the form -digits (such as -1).
func isNegativeInteger(v string) bool {
	v = strings.TrimSpace(v)
	if len(v) < 2 || v[0] != '-' {
		return false
	}
	for i := 1; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// parseGoDuration reads a Go-like duration such as "6m0s", "12ms",
// "2m59.56s" or "0s" (time.ParseDuration's syntax, without a sign), 0 to
// maxQuotaDelay.
func parseGoDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 || (v[0] != '.' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxQuotaDelay {
		return 0, false
	}
	return d, true
}

// parseRFC3339Reset reads an RFC 3339 time as the time until it from now:
// 0 when past, not believed beyond maxQuotaDelay.
func parseRFC3339Reset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false
	}
	return untilReset(t, now)
}
