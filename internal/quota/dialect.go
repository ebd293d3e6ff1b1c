package quota

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file reads the dialects of the providers whose responses say more
// than the generic families of quota.go, or say it otherwise: a limit
// whose window only the provider's documentation states, a rate limit
// under another status than 429, a wait in the body, a wait that is one
// object's rather than the whole quota's. Read applies the dialect of the
// provider the caller names (a key's name) or, when it names none, of the
// provider whose own headers the response carries (Detect). One
// provider's reading is never applied to another's response. As in the
// rest of the package the input is untrusted: nothing here panics, and a
// value out of its range is ignored as if absent.
//
// Dialects, as each provider documents them (the sources are cited by the
// tests, internal/quota/dialect_test.go and throttle/observe_providers_test.go,
// and docs/providers.md):
//
//   - GitHub: X-RateLimit-Limit counts per hour (the search resources per
//     minute); a primary or secondary rate limit comes as a 403 or a 429:
//     Retry-After when present, else X-RateLimit-Reset when remaining is
//     0, else at least a minute.
//   - Shopify: X-Shopify-Shop-Api-Call-Limit: 32/40 is a bucket of 40
//     leaking 2 a second (the size over 20: 80 leak 4, 400 leak 20); the
//     GraphQL Admin API's extensions.cost.throttleStatus states its bucket
//     and its restore rate, and it throttles with a 200 whose errors say
//     THROTTLED: the wait is the points missing over the restore rate.
//   - HubSpot: X-HubSpot-RateLimit-Max per -Interval-Milliseconds,
//     -Secondly per second and -Daily per day, each with its -Remaining;
//     a 429's policyName says which ran out; the daily one is an
//     allocation, waited for.
//   - Salesforce: Sforce-Limit-Info: api-usage=used/limit, per rolling
//     24 hours; a 403 REQUEST_LIMIT_EXCEEDED (TotalRequests) waits for the
//     allocation; ConcurrentPerOrgLongTxn is a short wait.
//   - Jira: X-RateLimit-Reset is an ISO 8601 minute (rounded up to its
//     end); RateLimit-Reason jira-per-issue-on-write is one issue's wait.
//   - Discord: X-RateLimit-Reset-After and the body's retry_after are
//     precise to the millisecond; X-RateLimit-Scope: shared is one
//     resource's wait; X-RateLimit-Limit is a route's, without a window.
//   - X: X-Rate-Limit-Limit counts per 15 minutes (per 24 hours for the
//     endpoints whose reset lies further).
//   - Zendesk: RateLimit-Limit and X-Rate-Limit count per minute.
//   - Gemini: a 429 RESOURCE_EXHAUSTED states its wait in RetryInfo's
//     retryDelay and its quota in QuotaFailure (per minute, per day: an
//     allocation).
//   - Stripe: a 429 has no Retry-After; its limiters count per second; a
//     lock_timeout or a resource-specific limit is one object's wait.
//   - Slack: Retry-After, the generic reading; named so that no other
//     provider's reading (an LLM's spend cap) applies to it.

// The providers whose dialects Read knows, besides the LLM providers of
// llm.go.
const (
	ProviderGitHub     Provider = "github"
	ProviderShopify    Provider = "shopify"
	ProviderHubSpot    Provider = "hubspot"
	ProviderSalesforce Provider = "salesforce"
	ProviderJira       Provider = "jira"
	ProviderDiscord    Provider = "discord"
	ProviderX          Provider = "x"
	ProviderZendesk    Provider = "zendesk"
	ProviderGemini     Provider = "gemini"
	ProviderStripe     Provider = "stripe"
	ProviderSlack      Provider = "slack"
)

// ProviderGeneric is a provider whose dialect the caller reads itself:
// Read applies the generic families alone, for whatever the headers say.
const ProviderGeneric Provider = "-"

// Named is the provider called name, case ignored: one of the Provider
// constants ("twitter" is ProviderX), ProviderUnknown for any other name.
func Named(name string) Provider {
	p := Provider(strings.ToLower(name))
	switch p {
	case ProviderOpenAI, ProviderAnthropic, ProviderAzure, ProviderGroq, ProviderMistral,
		ProviderGitHub, ProviderShopify, ProviderHubSpot, ProviderSalesforce, ProviderJira,
		ProviderDiscord, ProviderX, ProviderZendesk, ProviderGemini, ProviderStripe, ProviderSlack:
		return p
	case "twitter":
		return ProviderX
	}
	return ProviderUnknown
}

// readsLLM reports whether the LLM families of llm.go are read for p: the
// LLM providers', and a provider not known (whose response may be any).
func (p Provider) readsLLM() bool {
	switch p {
	case ProviderUnknown, ProviderOpenAI, ProviderAnthropic, ProviderAzure, ProviderGroq, ProviderMistral:
		return true
	}
	return false
}

// Detect is p, or, when p is ProviderUnknown, the provider whose own
// headers the response carries, headers no other provider sends:
// X-Shopify-Shop-Api-Call-Limit, Sforce-Limit-Info, X-HubSpot-RateLimit-*,
// a RateLimit-Reason of jira-*, Discord's X-RateLimit-Bucket or -Scope,
// Stripe-Rate-Limited-Reason, anthropic-* and OpenAI's openai-organization
// or openai-processing-ms. A provider whose window is not in the response
// (GitHub, X, Zendesk, Gemini) is known only by name.
func Detect(p Provider, h http.Header) Provider {
	if p != ProviderUnknown {
		return p
	}
	has := func(name string) bool { return field(h, name) != "" }
	switch {
	case has("X-Shopify-Shop-Api-Call-Limit"):
		return ProviderShopify
	case has("Sforce-Limit-Info"):
		return ProviderSalesforce
	case hasPrefix(h, "x-hubspot-ratelimit-"):
		return ProviderHubSpot
	case strings.HasPrefix(strings.ToLower(field(h, "RateLimit-Reason")), "jira-"):
		return ProviderJira
	case has("X-RateLimit-Bucket") || has("X-RateLimit-Scope"):
		return ProviderDiscord
	case has("Stripe-Rate-Limited-Reason"):
		return ProviderStripe
	case hasPrefix(h, "anthropic-"):
		return ProviderAnthropic
	case has("Openai-Organization") || has("Openai-Processing-Ms"):
		return ProviderOpenAI
	}
	return ProviderUnknown
}

// hasPrefix reports a header whose name starts with prefix (lower case).
func hasPrefix(h http.Header, prefix string) bool {
	for k := range h {
		if len(k) >= len(prefix) && strings.EqualFold(k[:len(prefix)], prefix) {
			return true
		}
	}
	return false
}

// ReadsBody reports whether Read reads the body of a response of provider
// p (as Detect names it) with this status and header: an error's (400,
// 402, 403, 429: spend caps, GitHub's secondary limits, Salesforce's,
// HubSpot's, Discord's, Gemini's and Stripe's 429 bodies), and a JSON 200
// from Shopify (its GraphQL Admin API throttles with a 200).
func ReadsBody(p Provider, status int, h http.Header) bool {
	if p == ProviderGeneric {
		return false
	}
	switch status {
	case http.StatusBadRequest, http.StatusPaymentRequired, http.StatusForbidden, http.StatusTooManyRequests:
		return true
	case http.StatusOK:
		return p == ProviderShopify && strings.Contains(strings.ToLower(field(h, "Content-Type")), "json")
	}
	return false
}

// Read is what a response of provider p with this status, header and
// body (its start, up to 64 KiB; nil when not read) says about p's quota,
// at now: the generic families of Parse as p's dialect corrects and
// completes them, and, for the LLM providers and a provider not known,
// the LLM families of ParseLLMResponse. p is the provider the caller knows
// (a key's name); for ProviderUnknown, the one the headers name (Detect).
func Read(p Provider, status int, h http.Header, body []byte, now time.Time) (Info, LLMInfo) {
	p = Detect(p, h)
	q := Parse(status, h, now)
	q.Provider = p
	var li LLMInfo
	if p.readsLLM() {
		li = ParseLLMResponse(p, status, h, body, now)
		q.RateLimited = q.RateLimited && !li.SpendCap // a spend cap is no rate limit
	}
	if len(body) > maxErrorBody {
		body = nil
	}
	if d := dialects[p]; d != nil {
		d(&q, status, h, body, now)
	}
	if !q.RateLimited { // (a wait's scope is nothing without a wait)
		q.TaskOnly, q.Allocation = false, false
	}
	return q, li
}

// A dialect corrects and completes what Parse read.
type dialect func(q *Info, status int, h http.Header, body []byte, now time.Time)

var dialects = map[Provider]dialect{
	ProviderGitHub:     readGitHub,
	ProviderShopify:    readShopify,
	ProviderHubSpot:    readHubSpot,
	ProviderSalesforce: readSalesforce,
	ProviderJira:       readJira,
	ProviderDiscord:    readDiscord,
	ProviderX:          readX,
	ProviderZendesk:    readZendesk,
	ProviderGemini:     readGemini,
	ProviderStripe:     readStripe,
}

// documented gives the policies of q without a window the window w the
// provider documents (none when w is 0), and the count left from the
// same family that window.
func documented(q *Info, w time.Duration) {
	if w <= 0 {
		return
	}
	for i := range q.Policies {
		if q.Policies[i].Window == 0 {
			q.Policies[i].Window, q.Policies[i].Documented = w, true
		}
	}
	if q.Remaining >= 0 && q.Window == 0 && len(q.Limits) == 0 {
		q.Window = w
	}
}

// githubWindow is the window of a GitHub resource's limit
// (X-RateLimit-Resource; "" is core): an hour for core and graphql, a
// minute for the search endpoints; 0 for a resource not listed here.
func githubWindow(resource string) time.Duration {
	switch strings.ToLower(resource) {
	case "", "core", "graphql", "integration_manifest":
		return time.Hour
	case "search", "code_search":
		return time.Minute
	}
	return 0
}

// readGitHub: https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api
// ("Checking the status of your rate limit", "Exceeding the rate limit").
func readGitHub(q *Info, status int, h http.Header, body []byte, _ time.Time) {
	if q.PolicySource == "X-RateLimit-Limit" {
		documented(q, githubWindow(field(h, "X-RateLimit-Resource")))
	}
	if status != http.StatusForbidden && status != http.StatusTooManyRequests {
		return
	}
	msg := strings.ToLower(jsonString(jsonObject(jsonOf(body)), "message"))
	secondary := strings.Contains(msg, "secondary rate limit") || strings.Contains(msg, "abuse detection")
	switch {
	case q.HasRetryAfter: // "you should not retry your request until after that many seconds"
	case q.Remaining == 0: // the primary limit: until X-RateLimit-Reset
	case secondary || status == http.StatusTooManyRequests:
		// "Otherwise, wait for at least one minute before retrying."
		q.RetryAfter, q.HasRetryAfter = time.Minute, true
	default:
		return // a 403 that is no limit: a permission, a token
	}
	q.RateLimited = true
}

// readShopify: https://shopify.dev/docs/api/admin-rest/usage/rate-limits
// and https://shopify.dev/docs/api/admin-graphql/usage/rate-limits.
func readShopify(q *Info, status int, _ http.Header, body []byte, _ time.Time) {
	if q.PolicySource == "X-Shopify-Shop-Api-Call-Limit" && len(q.Policies) == 1 {
		// The bucket leaks its size in 20 s: 40 at 2/s (standard), 80 at
		// 4/s (Advanced), 400 at 20/s (Plus).
		size := q.Policies[0].Quota
		q.Policies = []Policy{{Quota: max(1, size/20), Window: time.Second, Burst: size, Documented: true}}
		if q.Source == "X-Shopify-Shop-Api-Call-Limit" {
			q.Window = time.Second
		}
	}
	doc := jsonObject(jsonOf(body))
	if doc == nil {
		return
	}
	cost := jsonObject(jsonObject(doc["extensions"])["cost"])
	ts := jsonObject(cost["throttleStatus"])
	size, ok1 := jsonNumber(ts, "maximumAvailable")
	avail, ok2 := jsonNumber(ts, "currentlyAvailable")
	restore, ok3 := jsonNumber(ts, "restoreRate")
	if !ok1 || !ok2 || !ok3 || size < 1 || size > maxQuota || avail < 0 || avail > size || restore < 1 || restore > size {
		return
	}
	q.Policies, q.PolicySource = []Policy{{Quota: int(restore), Window: time.Second, Burst: int(size), Documented: true}},
		"extensions.cost.throttleStatus"
	q.Remaining, q.Window, q.Source, q.Policy, q.Limits = int(avail), time.Second, "extensions.cost.throttleStatus", "", nil
	if status != http.StatusOK || !graphQLThrottled(doc) {
		return
	}
	q.RateLimited = true
	if !q.HasRetryAfter {
		// The points the query asked for that the bucket lacks, at the
		// restore rate; at least one point's worth.
		need := 1.0
		if req, ok := jsonNumber(cost, "requestedQueryCost"); ok && req > avail && req <= maxQuota {
			need = req - avail
		}
		q.RetryAfter, q.HasRetryAfter = secondsUp(need/restore), true
	}
}

// graphQLThrottled reports an error whose extensions.code is THROTTLED.
func graphQLThrottled(doc map[string]any) bool {
	errs, _ := doc["errors"].([]any)
	for _, e := range errs {
		if jsonString(jsonObject(jsonObject(e)["extensions"]), "code") == "THROTTLED" {
			return true
		}
	}
	return false
}

// readHubSpot: https://developers.hubspot.com/docs/api/usage-details
// ("Rate limits", the headers) and https://developers.hubspot.com/docs/api/error-handling
// (a 429's policyName: DAILY, TEN_SECONDLY_ROLLING, SECONDLY).
func readHubSpot(q *Info, status int, h http.Header, body []byte, _ time.Time) {
	get := func(name string) (int, bool) { return parseCount(field(h, "X-HubSpot-RateLimit-"+name)) }
	var interval time.Duration
	if ms, ok := get("Interval-Milliseconds"); ok && ms > 0 && time.Duration(ms)*time.Millisecond <= maxQuotaDelay {
		interval = (time.Duration(ms)*time.Millisecond + time.Second - 1).Truncate(time.Second)
	}
	var pol []Policy
	if n, ok := get("Max"); ok && n > 0 && interval > 0 {
		pol = append(pol, Policy{Name: "interval", Quota: n, Window: interval})
	}
	if n, ok := get("Secondly"); ok && n > 0 {
		pol = append(pol, Policy{Name: "secondly", Quota: n, Window: time.Second, Documented: true})
	}
	if n, ok := get("Daily"); ok && n > 0 {
		pol = append(pol, Policy{Name: "daily", Quota: n, Window: Day, Documented: true})
	}
	if len(pol) > 0 {
		q.Policies, q.PolicySource = pol, "X-HubSpot-RateLimit"
	}
	rem, okR := get("Remaining")
	sec, okS := get("Secondly-Remaining")
	day, okD := get("Daily-Remaining")
	if okR && interval > 0 {
		q.Remaining, q.Window, q.Source, q.Policy, q.Limits = rem, interval, "X-HubSpot-RateLimit-Remaining", "interval", nil
	}
	if okS {
		q.Left = append(q.Left, Left{Window: time.Second, Remaining: sec})
	}
	if okD {
		q.Left = append(q.Left, Left{Window: Day, Remaining: day})
	}
	if status != http.StatusTooManyRequests {
		return
	}
	policy := strings.ToUpper(jsonString(jsonObject(jsonOf(body)), "policyName"))
	wait := time.Duration(0)
	switch {
	case policy == "DAILY" || (policy == "" && okD && day == 0):
		q.Allocation, wait = true, Day
	case policy == "SECONDLY" || (policy == "" && okS && sec == 0 && !(okR && rem == 0)):
		wait = time.Second
	case interval > 0:
		wait = interval // TEN_SECONDLY_ROLLING: the rolling window
	}
	if !q.HasRetryAfter && wait > 0 {
		q.RetryAfter, q.HasRetryAfter = wait, true
	}
}

// readSalesforce: https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/headers_api_usage.htm
// (Sforce-Limit-Info) and https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/errorcodes.htm
// (403 REQUEST_LIMIT_EXCEEDED); the allocation is per rolling 24 hours
// (https://developer.salesforce.com/docs/atlas.en-us.salesforce_app_limits_cheatsheet.meta/salesforce_app_limits_cheatsheet/salesforce_app_limits_platform_api.htm).
func readSalesforce(q *Info, status int, h http.Header, body []byte, _ time.Time) {
	if used, limit, ok := sforceUsage(field(h, "Sforce-Limit-Info")); ok {
		q.Policies, q.PolicySource = []Policy{{Name: "api-usage", Quota: limit, Window: Day, Documented: true}}, "Sforce-Limit-Info"
		q.Remaining, q.Window, q.Source, q.Policy, q.Limits = max(0, limit-used), Day, "Sforce-Limit-Info", "api-usage", nil
	}
	if status != http.StatusForbidden {
		return
	}
	v := jsonOf(body)
	if list, ok := v.([]any); ok && len(list) > 0 {
		v = list[0]
	}
	e := jsonObject(v)
	if jsonString(e, "errorCode") != "REQUEST_LIMIT_EXCEEDED" {
		return
	}
	q.RateLimited = true
	if strings.Contains(jsonString(e, "message"), "Concurrent") {
		return // long-running requests at once: a short wait
	}
	q.Allocation = true
	if !q.HasRetryAfter {
		q.RetryAfter, q.HasRetryAfter = Day, true
	}
}

// sforceUsage reads api-usage=used/limit from Sforce-Limit-Info (which may
// list per-app-api-usage=... beside it).
func sforceUsage(v string) (used, limit int, ok bool) {
	for _, part := range strings.Split(v, ",") {
		rest, found := strings.CutPrefix(strings.TrimSpace(part), "api-usage=")
		if !found {
			continue
		}
		a, b, cut := strings.Cut(rest, "/")
		used, ok1 := parseCount(a)
		limit, ok2 := parseCount(b)
		if !cut || !ok1 || !ok2 || limit < 1 {
			return 0, 0, false
		}
		return used, limit, true
	}
	return 0, 0, false
}

// readJira: https://developer.atlassian.com/cloud/jira/platform/rate-limiting/
// (X-RateLimit-Reset "in ISO 8601 format ... yyyy-MM-ddTHH:mmZ",
// RateLimit-Reason).
func readJira(q *Info, _ int, h http.Header, _ []byte, now time.Time) {
	if q.Reset == 0 {
		if d, ok := parseISOReset(field(h, "X-RateLimit-Reset"), now); ok {
			q.Reset = d
		}
	}
	if strings.EqualFold(strings.TrimSpace(field(h, "RateLimit-Reason")), "jira-per-issue-on-write") {
		q.TaskOnly = true
	}
}

// parseISOReset reads an ISO 8601 time to the minute (2026-12-06T10:31Z),
// as the time until the end of that minute (never early), or to the second
// (RFC 3339).
func parseISOReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	if t, err := time.Parse("2006-01-02T15:04Z07:00", v); err == nil {
		return untilReset(t.Add(time.Minute), now)
	}
	return parseRFC3339Reset(v, now)
}

// readDiscord: https://discord.com/developers/docs/topics/rate-limits
// ("Header Format", "Exceeding A Rate Limit").
func readDiscord(q *Info, status int, h http.Header, body []byte, _ time.Time) {
	if d, ok := parseDelta(field(h, "X-RateLimit-Reset-After")); ok {
		q.Reset = d // relative and precise to the millisecond
	}
	// X-RateLimit-Limit is a route's bucket, whose window Discord does not
	// state: nothing to learn a quota from.
	q.Policies, q.PolicySource = nil, ""
	if status != http.StatusTooManyRequests {
		return
	}
	if s, ok := jsonNumber(jsonObject(jsonOf(body)), "retry_after"); ok && s >= 0 && s <= maxQuotaDelay.Seconds() {
		q.RetryAfter, q.HasRetryAfter = secondsUp(s), true
	}
	if strings.EqualFold(strings.TrimSpace(field(h, "X-RateLimit-Scope")), "shared") {
		q.TaskOnly = true // "per resource limit"
	}
}

// parseDelta reads delta seconds, fractions accepted, 0 to maxQuotaDelay.
func parseDelta(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || s < 0 || math.IsNaN(s) || s > maxQuotaDelay.Seconds() {
		return 0, false
	}
	return secondsUp(s), true
}

// readX: https://docs.x.com/x-api/fundamentals/rate-limits ("limits are
// per 15 minutes unless noted (e.g. /24hrs)").
func readX(q *Info, _ int, _ http.Header, _ []byte, _ time.Time) {
	if q.PolicySource != "X-Rate-Limit-Limit" {
		return
	}
	w := 15 * time.Minute
	if q.Reset > w {
		w = Day // an endpoint limited per 24 hours
	}
	documented(q, w)
}

// readZendesk: https://developer.zendesk.com/api-reference/introduction/rate-limits
// ("the number of requests remaining in the current minute") and
// https://developer.zendesk.com/documentation/api-basics/best-practices/best-practices-for-avoiding-rate-limiting.
// The endpoint limits (zendesk-ratelimit-tickets-index: total=100; ...)
// are one endpoint's, not the account's, and are not read.
func readZendesk(q *Info, _ int, h http.Header, _ []byte, _ time.Time) {
	if len(q.Policies) == 0 {
		if n, ok := parseCount(field(h, "X-Rate-Limit")); ok && n > 0 {
			q.Policies, q.PolicySource = []Policy{{Quota: n}}, "X-Rate-Limit"
		}
	}
	switch q.PolicySource {
	case "RateLimit-Limit", "X-Rate-Limit", "X-Rate-Limit-Limit":
		documented(q, time.Minute)
	}
}

// readGemini: https://ai.google.dev/gemini-api/docs/rate-limits and
// Google's error model (https://google.aip.dev/193: RetryInfo's
// retryDelay, QuotaFailure's violations).
func readGemini(q *Info, status int, _ http.Header, body []byte, _ time.Time) {
	if status != http.StatusTooManyRequests {
		return
	}
	details, _ := jsonObject(jsonObject(jsonOf(body))["error"])["details"].([]any)
	var pol []Policy
	daily := false
	for _, d := range details {
		m := jsonObject(d)
		switch typ := jsonString(m, "@type"); {
		case strings.HasSuffix(typ, "google.rpc.RetryInfo"):
			if w, ok := parseProtoDuration(jsonString(m, "retryDelay")); ok {
				q.RetryAfter, q.HasRetryAfter = w, true
			}
		case strings.HasSuffix(typ, "google.rpc.QuotaFailure"):
			violations, _ := m["violations"].([]any)
			for _, v := range violations {
				id := jsonString(jsonObject(v), "quotaId")
				var w time.Duration
				switch {
				case strings.Contains(id, "PerDay"):
					w, daily = Day, true
				case strings.Contains(id, "PerMinute"):
					w = time.Minute
				default:
					continue
				}
				n, ok := jsonNumber(jsonObject(v), "quotaValue") // (an int64 in a string)
				if !ok || n < 1 || n > maxQuota || !strings.Contains(id, "Requests") || len(pol) == maxPolicies {
					continue
				}
				if len(id) > maxPolicyName {
					id = ""
				}
				pol = append(pol, Policy{Name: id, Quota: int(n), Window: w, Documented: true})
			}
		}
	}
	if len(pol) > 0 {
		q.Policies, q.PolicySource = pol, "google.rpc.QuotaFailure"
	}
	if daily {
		// Requests per day: an allocation, waited for (the retryDelay
		// when it says, else a day; WithMaxSuspension caps either).
		q.Allocation = true
		if !q.HasRetryAfter {
			q.RetryAfter, q.HasRetryAfter = Day, true
		}
	}
}

// parseProtoDuration reads a protobuf Duration in JSON ("26s", "1.5s"), 0
// to maxQuotaDelay.
func parseProtoDuration(v string) (time.Duration, bool) {
	s, ok := strings.CutSuffix(strings.TrimSpace(v), "s")
	if !ok {
		return 0, false
	}
	return parseDelta(s)
}

// readStripe: https://docs.stripe.com/rate-limits ("Handling limiting
// gracefully": no Retry-After; Stripe-Rate-Limited-Reason; a 429
// lock_timeout is one object locked).
func readStripe(q *Info, status int, h http.Header, body []byte, _ time.Time) {
	if status != http.StatusTooManyRequests {
		return
	}
	reason := strings.ToLower(strings.TrimSpace(field(h, "Stripe-Rate-Limited-Reason")))
	code := jsonString(jsonObject(jsonObject(jsonOf(body))["error"]), "code")
	wait := time.Second // the limiters count per second
	switch {
	case code == "lock_timeout":
		q.TaskOnly = true
	case reason == "resource-specific":
		q.TaskOnly, wait = true, 0 // one object's own limit: the default wait
	}
	if !q.HasRetryAfter && wait > 0 {
		q.RetryAfter, q.HasRetryAfter = wait, true
	}
}

// jsonOf is the JSON value of body, nil when it is none.
func jsonOf(body []byte) any {
	if len(body) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	return v
}

// jsonObject is v when it is a JSON object, nil otherwise.
func jsonObject(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// jsonNumber is m[key] when it is a finite number (a JSON number, or a
// string holding one).
func jsonNumber(m map[string]any, key string) (float64, bool) {
	var f float64
	switch v := m[key].(type) {
	case float64:
		f = v
	case string:
		var err error
		if f, err = strconv.ParseFloat(v, 64); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}
