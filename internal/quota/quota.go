// Package quota reads what a provider's HTTP response says about its quota
// (Retry-After, the IETF RateLimit fields and their drafts, the X-RateLimit
// families, Shopify's call limit), for throttle.Observe.
package quota

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file reads what a provider's HTTP response says about its quota. The
// input is untrusted: nothing here panics, and a value out of its range
// (negative, NaN, an overflow, a window of 0 or above MaxPer, a quota of 0 or
// above maxQuota, a field above maxFieldLen) is ignored as if the header were
// absent, never clamped.
//
// Headers read, by family, highest precedence first:
//
//  1. IETF draft-ietf-httpapi-ratelimit-headers, structured fields (RFC
//     9651): RateLimit-Policy (drafts 08+: "name";q=100;w=60, several
//     policies; drafts up to 07: 100;w=60) and RateLimit (drafts 08+:
//     "name";r=50;t=30, several items; draft 07: the Dictionary
//     limit=100, remaining=50, reset=30).
//  2. The earlier drafts' RateLimit-Limit, RateLimit-Remaining and
//     RateLimit-Reset (delta seconds).
//  3. X-RateLimit-Limit, -Remaining, -Reset, -Used (GitHub, and many others;
//     -Resource names the policy). The limit may carry policies as in the
//     drafts (Envoy: 10, 10;w=60).
//  4. X-Rate-Limit-Limit, -Remaining, -Reset (Twitter/X).
//  5. X-Shopify-Shop-Api-Call-Limit: used/size of a leaky bucket (32/40);
//     its restore rate is not in the header (the docs say 2/s on the
//     standard plan).
//
// Precedence when headers disagree: Policies, Remaining and Reset are each
// taken from the first family above that states a valid one; families are
// never merged (they describe the same quota in different words). Retry-After
// is kept apart in RetryAfter: per the draft it takes precedence over any
// reset, which consumers apply (Info.Wait). Azure's retry-after-ms, when
// valid, is preferred to the Retry-After in whole seconds sent beside it.
//
// Waits are never rounded down: a fraction of a second (Discord's Unix
// resets, Shopify's Retry-After: 2.0) is kept, rounded up to the
// microsecond.
//
// A reset, in any family, is delta seconds below unixThreshold (1e9), Unix
// seconds from there (GitHub, Twitter), Unix milliseconds from
// unixMilliThreshold (1e12); one in the past means now (0).

// Bounds on what a response may say; beyond them the value is ignored.
const (
	// maxQuota is the largest quota or remaining count believed.
	maxQuota = 1_000_000_000
	// maxQuotaDelay is the longest window, reset or Retry-After believed.
	maxQuotaDelay = 30 * 24 * time.Hour // as the longest period of a limit
	// maxFieldLen is the longest field value read (all lines of a field
	// together); a longer field is ignored.
	maxFieldLen = 4096
	// maxPolicies is how many policies (and service limits) one response
	// may list; later ones are dropped.
	maxPolicies = 16
	// maxPolicyName is the longest policy name kept; a policy with a longer
	// name is ignored.
	maxPolicyName = 64
	// unixThreshold tells a reset given as a Unix time from one given in
	// seconds.
	unixThreshold = 1_000_000_000
	// unixMilliThreshold tells a Unix time in milliseconds from one in
	// seconds.
	unixMilliThreshold = 1_000_000_000_000
)

// Info is what one response says about the provider's quota.
type Info struct {
	// RateLimited: the response is a 429, or a 503 with a valid Retry-After.
	RateLimited bool
	// RetryAfter is read from retry-after-ms (Azure), else Retry-After
	// (delay-seconds or an HTTP-date; a date in the past is 0); 0 when
	// absent or invalid.
	RetryAfter time.Duration
	// HasRetryAfter tells a valid Retry-After of 0 from none.
	HasRetryAfter bool
	// Policies are the published quotas, from one family (see above).
	Policies []Policy
	// PolicySource is the header Policies come from ("" when none).
	PolicySource string
	// Remaining is how many calls are left in the current window, -1 when
	// the response does not say. With several IETF service limits it is the
	// lowest (the one that binds first).
	Remaining int
	// Reset is the time until the current window resets; 0 when not said
	// (or said to be now).
	Reset time.Duration
	// Policy names the policy Remaining refers to ("" when not named).
	Policy string
	// Window is the window of the policy Remaining refers to, when a
	// published policy tells it; 0 otherwise.
	Window time.Duration
	// Source is the header Remaining comes from ("" when none), for logs.
	Source string
	// Limits are the IETF RateLimit service limits, one per policy the
	// response reports on (empty for the other families).
	Limits []ServiceLimit

	// The fields below are set by a provider's dialect (Read), never by
	// Parse.

	// Provider is the provider whose dialect was read (ProviderUnknown:
	// the generic families alone).
	Provider Provider
	// Left are counts left in windows other than Remaining's (HubSpot's
	// secondly and daily counts beside its ten-second one).
	Left []Left
	// TaskOnly: the wait is narrower than the provider's quota, one object
	// or resource (Discord's shared scope, Jira's per-issue writes,
	// Stripe's lock_timeout): only the call's task waits, and nothing is
	// learned about the quota from the response.
	TaskOnly bool
	// Allocation: the wait is for an allocation used up (HubSpot's and
	// Salesforce's daily calls, Gemini's requests per day), which says
	// nothing of the rate the provider allows.
	Allocation bool
}

// Left is what is left in one window.
type Left struct {
	Window    time.Duration // 1 s to maxQuotaDelay, whole seconds
	Remaining int           // 0 to maxQuota
}

// Wait is how long the response asks to wait before calling again: its
// Retry-After when it has one (the draft gives it precedence), else the
// reset it states (0: none said).
func (q Info) Wait() time.Duration {
	if q.HasRetryAfter {
		return q.RetryAfter
	}
	return q.Reset
}

// Policy is one published quota: Quota calls per Window.
type Policy struct {
	// Name is the IETF policy name, or GitHub's X-RateLimit-Resource; ""
	// when not named.
	Name string
	// Quota is the number of calls per window, 1 to maxQuota.
	Quota int
	// Window is the window's length in whole seconds, 1 s to MaxPer; 0 when
	// the header does not say (X-RateLimit-Limit alone).
	Window time.Duration
	// Burst is the capacity of the provider's bucket when its dialect
	// tells it (Shopify's 40, leaking 2 a second), 1 to maxQuota; 0 when
	// not told. (Read sets it, never Parse.)
	Burst int
	// Documented: the window is the one the provider documents, not one
	// the response states (GitHub's hour behind X-RateLimit-Limit: 5000),
	// so that Observe may convert the quota to a tier of another period.
	// (Read sets it, never Parse.)
	Documented bool
}

// ServiceLimit is one IETF RateLimit item: what is left of one policy.
type ServiceLimit struct {
	Name      string
	Remaining int           // 0 to maxQuota
	Reset     time.Duration // 0 when not said
	HasReset  bool
	Window    time.Duration // the named policy's window, 0 when not published
}

// Parse reads everything a response with this status and header says
// about the provider's quota, at now (for HTTP-dates and Unix times).
func Parse(status int, h http.Header, now time.Time) Info {
	q := Info{Remaining: -1}
	q.RetryAfter, q.HasRetryAfter = retryAfter(h, now)
	q.RateLimited = status == http.StatusTooManyRequests ||
		(status == http.StatusServiceUnavailable && q.HasRetryAfter)

	fams := []quotaFamily{
		ietfFamily(h),
		draftFamily(h, now),
		xFamily(h, now, "X-RateLimit-"),
		xFamily(h, now, "X-Rate-Limit-"),
		shopifyFamily(h),
	}
	for _, f := range fams {
		if len(q.Policies) == 0 && len(f.policies) > 0 {
			q.Policies, q.PolicySource = f.policies, f.policySource
		}
	}
	for _, f := range fams {
		if f.hasRemaining {
			q.Remaining, q.Policy, q.Window, q.Source, q.Limits = f.remaining, f.name, f.window, f.source, f.limits
			if q.Window == 0 && f.limit > 0 {
				q.Window = windowOfQuota(q.Policies, f.limit)
			}
			break
		}
	}
	for _, f := range fams {
		if f.hasReset {
			q.Reset = f.reset
			break
		}
	}
	return q
}

// quotaFamily is what one family of headers says.
type quotaFamily struct {
	policies     []Policy
	policySource string

	hasRemaining bool
	remaining    int
	name         string        // the policy remaining is of
	window       time.Duration // its window, when the family says
	limit        int           // its quota, when the family says (0: not)
	source       string
	limits       []ServiceLimit

	hasReset bool
	reset    time.Duration
}

// ietfFamily reads RateLimit-Policy and RateLimit, in every draft's form.
func ietfFamily(h http.Header) quotaFamily {
	var f quotaFamily
	var policyMembers []sfMember
	if members, ok := parseSFList(field(h, "RateLimit-Policy")); ok {
		policyMembers = members
		if f.policies = policiesOf(members, true); len(f.policies) > 0 {
			f.policySource = "RateLimit-Policy"
		}
	}
	v := field(h, "RateLimit")
	if members, ok := parseSFList(v); ok {
		f.limits = serviceLimits(members, f.policies, otherUnits(policyMembers))
		if len(f.limits) > 0 {
			best := f.limits[0]
			for _, l := range f.limits[1:] {
				// The lowest remaining binds first; on a tie, the longer wait.
				if l.Remaining < best.Remaining || (l.Remaining == best.Remaining && l.Reset > best.Reset) {
					best = l
				}
			}
			f.hasRemaining, f.remaining, f.name, f.window, f.source = true, best.Remaining, best.Name, best.Window, "RateLimit"
			f.hasReset, f.reset = best.HasReset, best.Reset
		}
		return f
	}
	// Draft 07: RateLimit: limit=100, remaining=50, reset=30.
	dict, ok := parseSFDictionary(v)
	if !ok {
		return f
	}
	limit, hasLimit := sfCount(dict["limit"], 1)
	if hasLimit && len(f.policies) == 0 {
		f.policies, f.policySource = []Policy{{Quota: limit}}, "RateLimit"
	}
	if r, ok := sfCount(dict["remaining"], 0); ok {
		f.hasRemaining, f.remaining, f.limit, f.source = true, r, limit, "RateLimit"
	}
	if t, ok := sfSeconds(dict["reset"]); ok {
		f.hasReset, f.reset = true, t
	}
	return f
}

// draftFamily reads the earlier drafts' RateLimit-Limit, -Remaining, -Reset.
func draftFamily(h http.Header, now time.Time) quotaFamily {
	var f quotaFamily
	limit, hasLimit := 0, false
	if members, ok := parseSFList(field(h, "RateLimit-Limit")); ok && len(members) > 0 {
		limit, hasLimit = sfCount(members[0].sfValue, 1)
		f.policies = policiesOf(members, false)
		if len(f.policies) == 0 && hasLimit {
			f.policies = []Policy{{Quota: limit}}
		}
		if len(f.policies) > 0 {
			f.policySource = "RateLimit-Limit"
		}
	}
	if r, ok := parseCount(field(h, "RateLimit-Remaining")); ok {
		f.hasRemaining, f.remaining, f.limit, f.source = true, r, limit, "RateLimit-Remaining"
	}
	f.reset, f.hasReset = parseReset(field(h, "RateLimit-Reset"), now)
	return f
}

// xFamily reads prefix+"Limit", "Remaining", "Reset" and "Used" (GitHub,
// Twitter/X and the many providers that copied them).
func xFamily(h http.Header, now time.Time, prefix string) quotaFamily {
	f := quotaFamily{}
	name := field(h, prefix+"Resource") // GitHub: core, search, graphql, ...
	if len(name) > maxPolicyName || !isToken(name) {
		name = ""
	}
	limit, hasLimit := 0, false
	if members, ok := parseSFList(field(h, prefix+"Limit")); ok && len(members) > 0 {
		limit, hasLimit = sfCount(members[0].sfValue, 1)
		f.policies = policiesOf(members, false)
		if len(f.policies) == 0 && hasLimit {
			f.policies = []Policy{{Name: name, Quota: limit}}
		}
		if len(f.policies) > 0 {
			f.policySource = prefix + "Limit"
		}
	}
	if r, ok := parseCount(field(h, prefix+"Remaining")); ok {
		f.hasRemaining, f.remaining, f.source = true, r, prefix+"Remaining"
	} else if used, ok := parseCount(field(h, prefix+"Used")); ok && hasLimit && used <= limit {
		f.hasRemaining, f.remaining, f.source = true, limit-used, prefix+"Used"
	}
	if f.hasRemaining {
		f.name, f.limit = name, limit
	}
	f.reset, f.hasReset = parseReset(field(h, prefix+"Reset"), now)
	return f
}

// shopifyFamily reads X-Shopify-Shop-Api-Call-Limit: "used/size" of the
// REST Admin API's leaky bucket. The policy has no window: the bucket
// restores at a rate the header does not say.
func shopifyFamily(h http.Header) quotaFamily {
	var f quotaFamily
	a, b, ok := strings.Cut(field(h, "X-Shopify-Shop-Api-Call-Limit"), "/")
	if !ok {
		return f
	}
	used, ok1 := parseCount(a)
	size, ok2 := parseCount(b)
	if !ok1 || !ok2 || size < 1 || used > size {
		return f
	}
	f.policies, f.policySource = []Policy{{Quota: size}}, "X-Shopify-Shop-Api-Call-Limit"
	f.hasRemaining, f.remaining, f.source = true, size-used, "X-Shopify-Shop-Api-Call-Limit"
	return f
}

// policiesOf reads quota policies from list members. named: the members are
// IETF policy items (drafts 08+: a String or Token name with q and w; up to
// draft 07: an Integer quota with w). Otherwise only Integer members with a
// window (w, or window in the first drafts) are policies: a bare Integer is
// the current limit, not a policy.
func policiesOf(members []sfMember, named bool) []Policy {
	var out []Policy
	for _, m := range members {
		if len(out) == maxPolicies {
			break
		}
		var p Policy
		switch {
		case m.inner:
			continue
		case named && (m.kind == sfString || m.kind == sfToken):
			if len(m.str) > maxPolicyName {
				continue
			}
			if !countsRequests(m) {
				continue // content-bytes or concurrent-requests: not calls
			}
			q, ok := m.param("q")
			if !ok {
				continue
			}
			if p.Quota, ok = sfCount(q, 1); !ok {
				continue
			}
			p.Name = m.str
		case m.kind == sfInteger:
			var ok bool
			if p.Quota, ok = sfCount(m.sfValue, 1); !ok {
				continue
			}
		default:
			continue
		}
		w, hasW := m.param("w")
		if !hasW && !named {
			w, hasW = m.param("window")
		}
		if hasW {
			d, ok := sfSeconds(w)
			if !ok || d == 0 {
				continue // a window of 0, or garbled: ignore the policy
			}
			p.Window = d
		} else if !named {
			continue
		}
		out = append(out, p)
	}
	return out
}

// countsRequests reports whether a policy item counts requests: its quota
// unit (qu) is absent or "requests".
func countsRequests(m sfMember) bool {
	qu, ok := m.param("qu")
	return !ok || ((qu.kind == sfString || qu.kind == sfToken) && qu.str == "requests")
}

// otherUnits names the policies whose quota is not in requests.
func otherUnits(members []sfMember) map[string]bool {
	var out map[string]bool
	for _, m := range members {
		if !m.inner && (m.kind == sfString || m.kind == sfToken) && !countsRequests(m) {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.str] = true
		}
	}
	return out
}

// serviceLimits reads IETF RateLimit items ("name";r=50;t=30), but those of
// a policy whose quota is not in requests.
func serviceLimits(members []sfMember, policies []Policy, skip map[string]bool) []ServiceLimit {
	var out []ServiceLimit
	for _, m := range members {
		if len(out) == maxPolicies {
			break
		}
		if m.inner || (m.kind != sfString && m.kind != sfToken) || len(m.str) > maxPolicyName || skip[m.str] {
			continue
		}
		r, ok := m.param("r")
		if !ok {
			continue
		}
		l := ServiceLimit{Name: m.str}
		if l.Remaining, ok = sfCount(r, 0); !ok {
			continue
		}
		if t, ok := m.param("t"); ok {
			if l.Reset, l.HasReset = sfSeconds(t); !l.HasReset {
				continue // a garbled reset makes the item garbled
			}
		}
		for _, p := range policies {
			if p.Name == l.Name {
				l.Window = p.Window
				break
			}
		}
		out = append(out, l)
	}
	return out
}

// windowOfQuota is the window of the one policy whose quota is limit, 0 when
// none or several.
func windowOfQuota(policies []Policy, limit int) time.Duration {
	var w time.Duration
	n := 0
	for _, p := range policies {
		if p.Quota == limit {
			w, n = p.Window, n+1
		}
	}
	if n != 1 {
		return 0
	}
	return w
}

// field returns every line of header name, joined with ", " (RFC 9110 5.3),
// or "" when the lines are longer than maxFieldLen together.
func field(h http.Header, name string) string {
	vs := h.Values(name)
	n := 0
	for _, v := range vs {
		n += len(v) + 2
		if n > maxFieldLen+2 {
			return ""
		}
	}
	if len(vs) == 1 {
		return vs[0]
	}
	return strings.Join(vs, ", ")
}

// sfCount is a structured-field Integer from min to maxQuota.
func sfCount(v sfValue, min int64) (int, bool) {
	if v.kind != sfInteger || v.num < min || v.num > maxQuota {
		return 0, false
	}
	return int(v.num), true
}

// sfSeconds is a structured-field Integer of seconds from 0 to
// maxQuotaDelay.
func sfSeconds(v sfValue) (time.Duration, bool) {
	if v.kind != sfInteger || v.num < 0 || v.num > int64(maxQuotaDelay/time.Second) {
		return 0, false
	}
	return time.Duration(v.num) * time.Second, true
}

// parseCount reads a plain count (digits only) from 0 to maxQuota.
func parseCount(v string) (int, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 10 {
		return 0, false
	}
	n := 0
	for i := range len(v) {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int(v[i]-'0')
	}
	if n > maxQuota {
		return 0, false
	}
	return n, true
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 10.2.3);
// fractional seconds are accepted. A date in the past is 0; a wait above
// maxQuotaDelay is not believed.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || math.IsNaN(s) || s > maxQuotaDelay.Seconds() {
			return 0, false
		}
		return secondsUp(s), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return untilReset(t, now)
	}
	return 0, false
}

// parseReset reads a reset: delta seconds, Unix seconds (from 1e9) or Unix
// milliseconds (from 1e12), fractions accepted. One in the past is 0; one
// more than maxQuotaDelay away is not believed.
func parseReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
		return 0, false
	}
	switch {
	case s >= unixMilliThreshold:
		if s > 1e15 { // past the year 33658: garbage
			return 0, false
		}
		return untilReset(time.UnixMicro(int64(upTo(s*1e3))), now)
	case s >= unixThreshold:
		// (Discord's 1470173023.123: the fraction kept, or the key would
		// reopen up to a second early.)
		return untilReset(time.UnixMicro(int64(upTo(s*1e6))), now)
	case s > maxQuotaDelay.Seconds():
		return 0, false
	}
	return secondsUp(s), true
}

// secondsUp is s seconds as a Duration, rounded up to the microsecond: a
// wait read from a provider is never cut short (a suspension is kept in
// microseconds).
func secondsUp(s float64) time.Duration {
	return time.Duration(upTo(s*1e6)) * time.Microsecond
}

// upTo rounds x up to a whole number, but for the error of its decimal
// notation in binary (64.57 s is 64570000.000000007 us: 64570000, not one
// more), a few units in the last place.
func upTo(x float64) float64 {
	r := math.Round(x)
	if math.Abs(x-r) <= 8*(math.Nextafter(math.Abs(x), math.Inf(1))-math.Abs(x)) {
		return r
	}
	return math.Ceil(x)
}

// untilReset is the time from now until t: 0 when t is past, not believed
// beyond maxQuotaDelay.
func untilReset(t, now time.Time) (time.Duration, bool) {
	if !t.After(now) {
		return 0, true
	}
	if t.After(now.Add(maxQuotaDelay)) {
		return 0, false
	}
	return t.Sub(now), true
}

// Structured field values (RFC 9651, formerly RFC 8941): the subset of the
// parsing algorithms of its section 4.2 that the RateLimit fields need, to
// the letter, so that a field that fails to parse is ignored as a whole.

// sfKind is the type of a bare item.
type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfBytes
	sfBoolean
	sfDate
	sfDisplayString
)

// sfValue is a bare item: num for Integer, Date and Boolean (0 or 1), dec
// for Decimal, str for String, Token, Byte Sequence (still base64) and
// Display String (still percent-encoded).
type sfValue struct {
	kind sfKind
	num  int64
	dec  float64
	str  string
}

type sfParam struct {
	key string
	val sfValue
}

// sfMember is a List member or Dictionary value: an Item, or an Inner List
// (inner, whose items are not kept) with its parameters.
type sfMember struct {
	sfValue
	inner  bool
	params []sfParam
}

// param returns the value of parameter key.
func (m sfMember) param(key string) (sfValue, bool) {
	for _, p := range m.params {
		if p.key == key {
			return p.val, true
		}
	}
	return sfValue{}, false
}

// sfParser walks one field value.
type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool { return p.i >= len(p.s) }

func (p *sfParser) peek() byte {
	if p.eof() {
		return 0
	}
	return p.s[p.i]
}

func (p *sfParser) skipSP() {
	for !p.eof() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// parseSFList parses a List (RFC 9651 4.2.1); ok is false when the value is
// not one. An empty value is an empty list.
func parseSFList(s string) ([]sfMember, bool) {
	p := &sfParser{s: s}
	p.skipSP()
	var out []sfMember
	for !p.eof() {
		m, ok := p.itemOrInnerList()
		if !ok {
			return nil, false
		}
		out = append(out, m)
		if !p.nextMember() {
			return nil, false
		}
	}
	return out, true
}

// parseSFDictionary parses a Dictionary (RFC 9651 4.2.2).
func parseSFDictionary(s string) (map[string]sfValue, bool) {
	p := &sfParser{s: s}
	p.skipSP()
	out := map[string]sfValue{}
	for !p.eof() {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		m := sfMember{sfValue: sfValue{kind: sfBoolean, num: 1}}
		if p.peek() == '=' {
			p.i++
			if m, ok = p.itemOrInnerList(); !ok {
				return nil, false
			}
		} else if m.params, ok = p.parameters(); !ok {
			return nil, false
		}
		if m.inner {
			m.sfValue = sfValue{}
		}
		out[key] = m.sfValue
		if !p.nextMember() {
			return nil, false
		}
	}
	return out, true
}

// nextMember consumes the comma between two members: true at the end of the
// value, or after a comma followed by another member.
func (p *sfParser) nextMember() bool {
	p.skipOWS()
	if p.eof() {
		return true
	}
	if p.s[p.i] != ',' {
		return false
	}
	p.i++
	p.skipOWS()
	return !p.eof() // a trailing comma fails
}

func (p *sfParser) itemOrInnerList() (sfMember, bool) {
	if p.peek() != '(' {
		return p.item()
	}
	p.i++
	for {
		p.skipSP()
		if p.eof() {
			return sfMember{}, false
		}
		if p.s[p.i] == ')' {
			p.i++
			params, ok := p.parameters()
			return sfMember{inner: true, params: params}, ok
		}
		if _, ok := p.item(); !ok {
			return sfMember{}, false
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return sfMember{}, false
		}
	}
}

func (p *sfParser) item() (sfMember, bool) {
	v, ok := p.bareItem()
	if !ok {
		return sfMember{}, false
	}
	params, ok := p.parameters()
	return sfMember{sfValue: v, params: params}, ok
}

// parameters parses ;key[=value]... (RFC 9651 4.2.3.2); a repeated key keeps
// its last value.
func (p *sfParser) parameters() ([]sfParam, bool) {
	var out []sfParam
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		v := sfValue{kind: sfBoolean, num: 1}
		if p.peek() == '=' {
			p.i++
			if v, ok = p.bareItem(); !ok {
				return nil, false
			}
		}
		replaced := false
		for j := range out {
			if out[j].key == key {
				out[j].val, replaced = v, true
			}
		}
		if !replaced {
			out = append(out, sfParam{key: key, val: v})
		}
	}
	return out, true
}

func (p *sfParser) key() (string, bool) {
	start := p.i
	if c := p.peek(); !(c >= 'a' && c <= 'z') && c != '*' {
		return "", false
	}
	for !p.eof() {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

func (p *sfParser) bareItem() (sfValue, bool) {
	switch c := p.peek(); {
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == '"':
		return p.string()
	case c == '*' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'):
		return p.token(), true
	case c == ':':
		return p.byteSequence()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			v := sfValue{kind: sfBoolean, num: int64(p.s[p.i+1] - '0')}
			p.i += 2
			return v, true
		}
	case c == '@':
		p.i++
		if v, ok := p.number(); ok && v.kind == sfInteger {
			v.kind = sfDate
			return v, true
		}
	case c == '%':
		return p.displayString()
	}
	return sfValue{}, false
}

// number parses an Integer (at most 15 digits) or a Decimal (at most 12
// digits, a point, 1 to 3 digits) (RFC 9651 4.2.4).
func (p *sfParser) number() (sfValue, bool) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if c := p.peek(); c < '0' || c > '9' {
		return sfValue{}, false
	}
	digits, point := 0, -1 // point: digits before the '.', -1 for an Integer
digits:
	for !p.eof() {
		c := p.s[p.i]
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && point < 0:
			if digits > 12 {
				return sfValue{}, false
			}
			point = digits
		default:
			break digits
		}
		p.i++
		if digits > 15 {
			return sfValue{}, false
		}
	}
	text := p.s[start:p.i]
	if point < 0 {
		n, err := strconv.ParseInt(text, 10, 64)
		return sfValue{kind: sfInteger, num: n}, err == nil
	}
	if frac := digits - point; frac < 1 || frac > 3 {
		return sfValue{}, false
	}
	f, err := strconv.ParseFloat(text, 64)
	return sfValue{kind: sfDecimal, dec: f}, err == nil
}

func (p *sfParser) string() (sfValue, bool) {
	p.i++ // the opening quote
	var b strings.Builder
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.eof() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return sfValue{}, false
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return sfValue{kind: sfString, str: b.String()}, true
		case c < 0x20 || c > 0x7e:
			return sfValue{}, false
		default:
			b.WriteByte(c)
		}
	}
	return sfValue{}, false // no closing quote
}

func (p *sfParser) token() sfValue {
	start := p.i
	p.i++
	for !p.eof() && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	return sfValue{kind: sfToken, str: p.s[start:p.i]}
}

func (p *sfParser) byteSequence() (sfValue, bool) {
	p.i++
	start := p.i
	for !p.eof() {
		c := p.s[p.i]
		if c == ':' {
			v := sfValue{kind: sfBytes, str: p.s[start:p.i]}
			p.i++
			return v, true
		}
		if !(c >= 'A' && c <= 'Z') && !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '+' && c != '/' && c != '=' {
			return sfValue{}, false
		}
		p.i++
	}
	return sfValue{}, false
}

// displayString checks a Display String (%"...", RFC 9651 4.2.10) and keeps
// it percent-encoded: nothing here reads one.
func (p *sfParser) displayString() (sfValue, bool) {
	if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' {
		return sfValue{}, false
	}
	p.i += 2
	start := p.i
	for !p.eof() {
		c := p.s[p.i]
		switch {
		case c < 0x20 || c > 0x7e:
			return sfValue{}, false
		case c == '%':
			if p.i+2 >= len(p.s) || !isLowerHex(p.s[p.i+1]) || !isLowerHex(p.s[p.i+2]) {
				return sfValue{}, false
			}
			p.i += 3
			continue
		case c == '"':
			v := sfValue{kind: sfDisplayString, str: p.s[start:p.i]}
			p.i++
			return v, true
		}
		p.i++
	}
	return sfValue{}, false
}

func isLowerHex(c byte) bool { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') }

// isTchar reports a token character (RFC 9110 5.6.2).
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isToken reports a non-empty run of token characters.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}
