package quota

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hdr builds a header from name, value pairs; a name may repeat (several
// field lines).
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseQuotaReadsEveryHeaderDialect(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return fmt.Sprint(now.Add(d).Unix()) }
	p := func(name string, quota int, window time.Duration) Policy {
		return Policy{Name: name, Quota: quota, Window: window}
	}
	sec := time.Second
	type want struct {
		limited    bool
		retryAfter time.Duration
		hasRetry   bool
		policies   []Policy
		policySrc  string
		remaining  int
		reset      time.Duration
		policy     string
		window     time.Duration
		source     string
		limits     int // len(Limits)
	}
	none := want{remaining: -1}
	tests := []struct {
		name   string
		status int
		h      http.Header
		want   want
	}{
		{"nothing", 200, nil, none},

		// GitHub REST (docs.github.com, "Rate limits for the REST API").
		{"GitHub 200", 200, hdr(
			"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999", "X-RateLimit-Used", "1",
			"X-RateLimit-Reset", epoch(30*time.Minute), "X-RateLimit-Resource", "core"),
			want{policies: []Policy{p("core", 5000, 0)}, policySrc: "X-RateLimit-Limit",
				remaining: 4999, reset: 30 * time.Minute, policy: "core", source: "X-RateLimit-Remaining"}},
		{"GitHub primary limit: 403 with remaining 0 is no 429", 403, hdr(
			"x-ratelimit-limit", "60", "x-ratelimit-remaining", "0", "x-ratelimit-used", "60",
			"x-ratelimit-reset", epoch(42*time.Minute), "x-ratelimit-resource", "core"),
			want{policies: []Policy{p("core", 60, 0)}, policySrc: "X-RateLimit-Limit",
				remaining: 0, reset: 42 * time.Minute, policy: "core", source: "X-RateLimit-Remaining"}},
		{"GitHub secondary limit: 429 with retry-after", 429, hdr(
			"retry-after", "60", "x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4000",
			"x-ratelimit-reset", epoch(10*time.Minute)),
			want{limited: true, retryAfter: time.Minute, hasRetry: true, policies: []Policy{p("", 5000, 0)},
				policySrc: "X-RateLimit-Limit", remaining: 4000, reset: 10 * time.Minute, source: "X-RateLimit-Remaining"}},
		{"X-RateLimit-Used without Remaining", 200, hdr(
			"X-RateLimit-Limit", "60", "X-RateLimit-Used", "58"),
			want{policies: []Policy{p("", 60, 0)}, policySrc: "X-RateLimit-Limit", remaining: 2, source: "X-RateLimit-Used"}},
		{"X-RateLimit-Used above the limit is ignored", 200, hdr(
			"X-RateLimit-Limit", "60", "X-RateLimit-Used", "61"),
			want{policies: []Policy{p("", 60, 0)}, policySrc: "X-RateLimit-Limit", remaining: -1}},
		{"X-RateLimit-Reset in delta seconds", 429, hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20"),
			want{limited: true, remaining: 0, reset: 20 * sec, source: "X-RateLimit-Remaining"}},
		{"X-RateLimit-Reset in Unix milliseconds", 200, hdr("X-RateLimit-Reset", fmt.Sprint(now.Add(1500*time.Millisecond).UnixMilli())),
			want{remaining: -1, reset: 1500 * time.Millisecond}},
		{"X-RateLimit-Reset in the past is now", 200, hdr("X-RateLimit-Reset", epoch(-time.Hour)), none},
		{"Envoy: X-RateLimit-Limit with its policy", 200, hdr(
			"X-RateLimit-Limit", "10, 10;w=60", "X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "30"),
			want{policies: []Policy{p("", 10, 60*sec)}, policySrc: "X-RateLimit-Limit",
				remaining: 5, reset: 30 * sec, window: 60 * sec, source: "X-RateLimit-Remaining"}},

		// IETF drafts 08+ (the examples of the draft, section 3 and 4).
		{"IETF one policy", 200, hdr("RateLimit-Policy", `"default";q=100;w=10`, "RateLimit", `"default";r=50;t=30`),
			want{policies: []Policy{p("default", 100, 10*sec)}, policySrc: "RateLimit-Policy",
				remaining: 50, reset: 30 * sec, policy: "default", window: 10 * sec, source: "RateLimit", limits: 1}},
		{"IETF several policies, several limits: the lowest remaining", 200, hdr(
			"RateLimit-Policy", `"permin";q=50;w=60,"perhr";q=1000;w=3600`,
			"RateLimit", `"perhr";r=900;t=2000, "permin";r=5;t=10`),
			want{policies: []Policy{p("permin", 50, 60*sec), p("perhr", 1000, 3600*sec)}, policySrc: "RateLimit-Policy",
				remaining: 5, reset: 10 * sec, policy: "permin", window: 60 * sec, source: "RateLimit", limits: 2}},
		{"IETF two limits at 0: the longer wait binds", 429, hdr(
			"RateLimit-Policy", `"burst";q=100;w=60,"daily";q=1000;w=86400`,
			"RateLimit", `"burst";r=0;t=20, "daily";r=0;t=5000`),
			want{limited: true, policies: []Policy{p("burst", 100, 60*sec), p("daily", 1000, 86400*sec)},
				policySrc: "RateLimit-Policy", remaining: 0, reset: 5000 * sec, policy: "daily", window: 86400 * sec, source: "RateLimit", limits: 2}},
		{"IETF fields split over several lines", 200, hdr(
			"RateLimit-Policy", `"permin";q=50;w=60`, "RateLimit-Policy", `"perhr";q=1000;w=3600`),
			want{policies: []Policy{p("permin", 50, 60*sec), p("perhr", 1000, 3600*sec)}, policySrc: "RateLimit-Policy", remaining: -1}},
		{"IETF partition key and comment parameters", 200, hdr(
			"RateLimit-Policy", `"peruser";q=100;w=60;pk=:cHsdsRa894==:;acme-burst=10`,
			"RateLimit", `"peruser";r=999;pk=:dHJpYWwxMjEzMjM=:`),
			want{policies: []Policy{p("peruser", 100, 60*sec)}, policySrc: "RateLimit-Policy",
				remaining: 999, policy: "peruser", window: 60 * sec, source: "RateLimit", limits: 1}},
		{"IETF content-bytes policies are not calls", 200, hdr(
			"RateLimit-Policy", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:, "calls";q=10;w=1;qu="requests"`,
			"RateLimit", `"peruser";r=300000000;t=60, "calls";r=7`),
			want{policies: []Policy{p("calls", 10, sec)}, policySrc: "RateLimit-Policy",
				remaining: 7, policy: "calls", window: sec, source: "RateLimit", limits: 1}},
		{"IETF policy without a window", 200, hdr("RateLimit-Policy", `"trial";q=1000`),
			want{policies: []Policy{p("trial", 1000, 0)}, policySrc: "RateLimit-Policy", remaining: -1}},
		{"IETF limit without a policy", 200, hdr("RateLimit", `"default";r=1;t=7`),
			want{remaining: 1, reset: 7 * sec, policy: "default", source: "RateLimit", limits: 1}},
		{"IETF token names, whitespace after ; and around commas", 200, hdr(
			"RateLimit-Policy", "default; q=100; w=60 ,\t \"x\";q=5;w=1"),
			want{policies: []Policy{p("default", 100, 60*sec), p("x", 5, sec)}, policySrc: "RateLimit-Policy", remaining: -1}},
		{"IETF a repeated parameter keeps its last value", 200, hdr("RateLimit-Policy", `"a";q=1;w=60;q=5`),
			want{policies: []Policy{p("a", 5, 60*sec)}, policySrc: "RateLimit-Policy", remaining: -1}},
		{"IETF other members are skipped, the valid ones kept", 200, hdr(
			"RateLimit-Policy", `("a" "b");q=1, "c";q=5;w=10, ?1;q=3, @1700000000;q=3, :aGk=:;q=3, %"x%20y";q=3, 1.5;q=3, "d";w=10, "e";q=2;w=1.0`),
			want{policies: []Policy{p("c", 5, 10*sec)}, policySrc: "RateLimit-Policy", remaining: -1}},
		{"IETF Retry-After and reset are kept apart", 429, hdr("Retry-After", "40", "RateLimit", `"default";r=0;t=30`),
			want{limited: true, retryAfter: 40 * sec, hasRetry: true, remaining: 0, reset: 30 * sec, policy: "default", source: "RateLimit", limits: 1}},

		// IETF draft 07 (RateLimit a Dictionary) and drafts up to 06.
		{"draft 07", 200, hdr("RateLimit-Policy", "100;w=10", "RateLimit", "limit=100, remaining=50, reset=5"),
			want{policies: []Policy{p("", 100, 10*sec)}, policySrc: "RateLimit-Policy",
				remaining: 50, reset: 5 * sec, window: 10 * sec, source: "RateLimit"}},
		{"draft 07 several policies", 200, hdr(
			"RateLimit-Policy", "10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400", "RateLimit", "limit=50, remaining=0, reset=48"),
			want{policies: []Policy{p("", 10, sec), p("", 50, 60*sec), p("", 1000, 3600*sec), p("", 5000, 86400*sec)},
				policySrc: "RateLimit-Policy", remaining: 0, reset: 48 * sec, window: 60 * sec, source: "RateLimit"}},
		{"draft 07 without a policy", 200, hdr("RateLimit", "limit=10, remaining=1, reset=7"),
			want{policies: []Policy{p("", 10, 0)}, policySrc: "RateLimit", remaining: 1, reset: 7 * sec, source: "RateLimit"}},
		{"draft 06", 200, hdr("RateLimit-Limit", "100", "RateLimit-Remaining", "50", "RateLimit-Reset", "50", "RateLimit-Policy", "100;w=10"),
			want{policies: []Policy{p("", 100, 10*sec)}, policySrc: "RateLimit-Policy",
				remaining: 50, reset: 50 * sec, window: 10 * sec, source: "RateLimit-Remaining"}},
		{"draft 06 without a policy", 200, hdr("RateLimit-Limit", "100", "RateLimit-Remaining", "0", "RateLimit-Reset", "50"),
			want{policies: []Policy{p("", 100, 0)}, policySrc: "RateLimit-Limit", remaining: 0, reset: 50 * sec, source: "RateLimit-Remaining"}},
		{"first drafts: policies in RateLimit-Limit", 200, hdr("RateLimit-Limit", "10, 10;window=1, 50;window=60", "RateLimit-Remaining", "3"),
			want{policies: []Policy{p("", 10, sec), p("", 50, 60*sec)}, policySrc: "RateLimit-Limit",
				remaining: 3, window: sec, source: "RateLimit-Remaining"}},

		// Twitter/X and Shopify.
		{"Twitter/X", 200, hdr("x-rate-limit-limit", "900", "x-rate-limit-remaining", "899", "x-rate-limit-reset", epoch(15*time.Minute)),
			want{policies: []Policy{p("", 900, 0)}, policySrc: "X-Rate-Limit-Limit",
				remaining: 899, reset: 15 * time.Minute, source: "X-Rate-Limit-Remaining"}},
		{"Shopify", 200, hdr("X-Shopify-Shop-Api-Call-Limit", "32/40"),
			want{policies: []Policy{p("", 40, 0)}, policySrc: "X-Shopify-Shop-Api-Call-Limit",
				remaining: 8, source: "X-Shopify-Shop-Api-Call-Limit"}},
		{"Shopify 429", 429, hdr("X-Shopify-Shop-Api-Call-Limit", "40/40", "Retry-After", "2.0"),
			want{limited: true, retryAfter: 2 * sec, hasRetry: true, policies: []Policy{p("", 40, 0)},
				policySrc: "X-Shopify-Shop-Api-Call-Limit", remaining: 0, source: "X-Shopify-Shop-Api-Call-Limit"}},

		// Precedence.
		{"IETF over X-", 200, hdr(
			"RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=10;t=30`,
			"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4000", "X-RateLimit-Reset", "600"),
			want{policies: []Policy{p("default", 100, 60*sec)}, policySrc: "RateLimit-Policy",
				remaining: 10, reset: 30 * sec, policy: "default", window: 60 * sec, source: "RateLimit", limits: 1}},
		{"each from the first family that says it", 200, hdr(
			"RateLimit-Policy", `"default";q=100;w=60`, "X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "40", "X-RateLimit-Reset", "12"),
			want{policies: []Policy{p("default", 100, 60*sec)}, policySrc: "RateLimit-Policy",
				remaining: 40, reset: 12 * sec, window: 60 * sec, source: "X-RateLimit-Remaining"}},
		{"draft headers over X-", 200, hdr("RateLimit-Remaining", "1", "RateLimit-Reset", "0", "X-RateLimit-Remaining", "9", "X-RateLimit-Reset", "60"),
			want{remaining: 1, source: "RateLimit-Remaining"}},
		{"X-RateLimit over X-Rate-Limit over Shopify", 200, hdr(
			"X-Rate-Limit-Limit", "900", "X-Rate-Limit-Remaining", "1", "X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "2",
			"X-Shopify-Shop-Api-Call-Limit", "39/40"),
			want{policies: []Policy{p("", 60, 0)}, policySrc: "X-RateLimit-Limit", remaining: 2, source: "X-RateLimit-Remaining"}},
		{"a malformed IETF field falls back to X-", 200, hdr("RateLimit", `"default";r=50;t=30,`, "X-RateLimit-Remaining", "3"),
			want{remaining: 3, source: "X-RateLimit-Remaining"}},

		// 429 and 503.
		{"503 with Retry-After is a rate limit", 503, hdr("Retry-After", "12"), want{limited: true, retryAfter: 12 * sec, hasRetry: true, remaining: -1}},
		{"503 without Retry-After is an outage", 503, hdr("RateLimit", `"default";r=0;t=30`),
			want{remaining: 0, reset: 30 * sec, policy: "default", source: "RateLimit", limits: 1}},
		{"Retry-After as an HTTP-date", 429, hdr("Retry-After", now.Add(90*sec).Format(http.TimeFormat)),
			want{limited: true, retryAfter: 90 * sec, hasRetry: true, remaining: -1}},
		{"Retry-After 0", 429, hdr("Retry-After", "0", "X-RateLimit-Reset", "9"),
			want{limited: true, hasRetry: true, remaining: -1, reset: 9 * sec}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Parse(tt.status, tt.h, now)
			w := tt.want
			assert.Equal(t, w.limited, got.RateLimited, "RateLimited")
			assert.Equal(t, w.retryAfter, got.RetryAfter, "RetryAfter")
			assert.Equal(t, w.hasRetry, got.HasRetryAfter, "HasRetryAfter")
			assert.Equal(t, w.policies, got.Policies, "Policies")
			assert.Equal(t, w.policySrc, got.PolicySource, "PolicySource")
			assert.Equal(t, w.remaining, got.Remaining, "Remaining")
			assert.Equal(t, w.reset, got.Reset, "Reset")
			assert.Equal(t, w.policy, got.Policy, "Policy")
			assert.Equal(t, w.window, got.Window, "Window")
			assert.Equal(t, w.source, got.Source, "Source")
			assert.Len(t, got.Limits, w.limits, "Limits")
			checkQuotaInfo(t, tt.status, got)
		})
	}
}

// TestParseQuotaIgnoresAbsurdValues: every value out of range reads as if the
// header were absent, never clamped.
func TestParseQuotaIgnoresAbsurdValues(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	huge := strings.Repeat(`"p";q=1;w=1, `, 400) + `"p";q=1;w=1`
	tests := []struct {
		name string
		h    http.Header
	}{
		{"quota 0", hdr("RateLimit-Policy", `"a";q=0;w=60`)},
		{"quota above 1e9", hdr("RateLimit-Policy", `"a";q=1000000001;w=60`)},
		{"quota negative", hdr("RateLimit-Policy", `"a";q=-5;w=60`)},
		{"quota a decimal", hdr("RateLimit-Policy", `"a";q=10.5;w=60`)},
		{"quota a string", hdr("RateLimit-Policy", `"a";q="10";w=60`)},
		{"quota of 16 digits", hdr("RateLimit-Policy", `"a";q=1000000000000000;w=60`)},
		{"window 0", hdr("RateLimit-Policy", `"a";q=10;w=0`)},
		{"window above 30 days", hdr("RateLimit-Policy", `"a";q=10;w=2592001`)},
		{"window negative", hdr("RateLimit-Policy", `"a";q=10;w=-1`)},
		{"old-draft window 0", hdr("RateLimit-Policy", `10;w=0`)},
		{"policy name too long", hdr("RateLimit-Policy", `"`+strings.Repeat("n", 65)+`";q=10;w=1`)},
		{"a megabyte field", hdr("RateLimit-Policy", strings.Repeat(`"a";q=1;w=1,`, 90000)+`"a";q=1;w=1`)},
		{"a field of many lines", func() http.Header {
			h := http.Header{}
			for range 1000 {
				h.Add("RateLimit-Policy", `"a";q=1;w=1`)
			}
			return h
		}()},
		{"over 4 KiB", hdr("RateLimit-Policy", huge)},
		{"remaining negative", hdr("RateLimit", `"a";r=-1`, "X-RateLimit-Remaining", "-1", "RateLimit-Remaining", "-3")},
		{"remaining above 1e9", hdr("RateLimit", `"a";r=1000000001`, "X-RateLimit-Remaining", "99999999999")},
		{"remaining not a number", hdr("X-RateLimit-Remaining", "NaN", "RateLimit-Remaining", "1e3", "X-Rate-Limit-Remaining", "+5")},
		{"reset garbled", hdr("RateLimit", `"a";r=5;t=-1`, "RateLimit-Reset", "soon", "X-RateLimit-Reset", "NaN", "X-Rate-Limit-Reset", "Inf")},
		{"reset beyond 30 days", hdr("RateLimit-Reset", "2592001", "X-RateLimit-Reset", fmt.Sprint(now.Add(31*24*time.Hour).Unix()),
			"X-Rate-Limit-Reset", "1e20")},
		{"Retry-After beyond 30 days", hdr("Retry-After", "2592001")},
		{"Retry-After date beyond 30 days", hdr("Retry-After", now.Add(31*24*time.Hour).Format(http.TimeFormat))},
		{"Retry-After garbled", hdr("Retry-After", "-1")},
		{"Shopify used above size", hdr("X-Shopify-Shop-Api-Call-Limit", "41/40")},
		{"Shopify size 0", hdr("X-Shopify-Shop-Api-Call-Limit", "0/0")},
		{"Shopify garbled", hdr("X-Shopify-Shop-Api-Call-Limit", "32/40/2")},
		{"X-RateLimit-Limit 0", hdr("X-RateLimit-Limit", "0")},
		{"draft-07 limit 0", hdr("RateLimit", "limit=0, remaining=-1, reset=-5")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Parse(200, tt.h, now)
			assert.Equal(t, Info{Remaining: -1}, got, "Parse(200, %.200v)", tt.h)
		})
	}
}

func TestParseQuotaKeepsAtMostMaxPolicies(t *testing.T) {
	var items, limits []string
	for i := range maxPolicies + 4 {
		items = append(items, fmt.Sprintf(`"p%d";q=%d;w=%d`, i, i+1, i+1))
		limits = append(limits, fmt.Sprintf(`"p%d";r=%d`, i, i))
	}
	got := Parse(200, hdr("RateLimit-Policy", strings.Join(items, ","), "RateLimit", strings.Join(limits, ",")), time.Now())
	require.Len(t, got.Policies, maxPolicies)
	require.Len(t, got.Limits, maxPolicies)
	assert.Equal(t, Policy{Name: "p15", Quota: 16, Window: 16 * time.Second}, got.Policies[15])
	assert.Equal(t, 0, got.Remaining)
}

// TestParseSFListFollowsRFC9651 checks the structured-field parser on RFC 9651's rules
// (cases after the structured-field-tests suite).
func TestParseSFListFollowsRFC9651(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{``, true},
		{`   `, true},
		{`1, 2`, true},
		{`1,2`, true},
		{"1 ,\t2", true},
		{`1,`, false},
		{`,1`, false},
		{`1 2`, false},
		{`999999999999999`, true},
		{`-999999999999999`, true},
		{`1000000000000000`, false},
		{`123456789012.123`, true},
		{`1234567890123.1`, false},
		{`1.1234`, false},
		{`1.`, false},
		{`-`, false},
		{`-a`, false},
		{`"a\"b\\c"`, true},
		{`"a\b"`, false},
		{`"unterminated`, false},
		{"\"tab\tin\"", false},
		{`"é"`, false},
		{`*tok:en/x`, true},
		{`:aGVsbG8=:`, true},
		{`:aGVsbG8=`, false},
		{`:a b:`, false},
		{`?0, ?1`, true},
		{`?2`, false},
		{`@1659578233`, true},
		{`@1.5`, false},
		{`%"caf%c3%a9"`, true},
		{`%"caf%C3%A9"`, false},
		{`%"x`, false},
		{`("a" 1 tok);p=1, 2`, true},
		{`("a"  1 )`, true},
		{`("a",1)`, false},
		{`("a"`, false},
		{`a;b;c=?0;d="x"`, true},
		{`a; b`, true},
		{`a ;b`, false},
		{`a;B=1`, false},
		{`a;=1`, false},
		{`a;b=`, false},
		{`1;2`, false},
		{"\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, ok := parseSFList(tt.in)
			assert.Equal(t, tt.ok, ok, "parseSFList(%q)", tt.in)
		})
	}
}

func TestParseSFDictionaryReadsItemsAndRefusesBadSyntax(t *testing.T) {
	d, ok := parseSFDictionary(`limit=100, remaining=50;x=1, reset=5, flag, inner=(1 2)`)
	require.True(t, ok)
	assert.Equal(t, sfValue{kind: sfInteger, num: 100}, d["limit"])
	assert.Equal(t, sfValue{kind: sfInteger, num: 50}, d["remaining"])
	assert.Equal(t, sfValue{kind: sfBoolean, num: 1}, d["flag"])
	assert.Equal(t, sfValue{}, d["inner"])
	for _, bad := range []string{`limit=`, `Limit=1`, `a=1,`, `a=1 b=2`} {
		_, ok := parseSFDictionary(bad)
		assert.False(t, ok, "parseSFDictionary(%q)", bad)
	}
}

// Wait is Retry-After when the response has one, else the reset it states
// (the IETF RateLimit's t is a fallback for Retry-After).
func TestWaitIsRetryAfterElseReset(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, status := range []int{200, 403, 429, 500, 503} {
		for _, h := range []http.Header{
			nil,
			hdr("Retry-After", "3"),
			hdr("RateLimit", `"d";r=0;t=30`),
			hdr("RateLimit", `"d";r=0;t=30`, "X-RateLimit-Reset", "60"),
			hdr("Retry-After", "0", "RateLimit-Reset", "50"),
			hdr("X-Rate-Limit-Reset", fmt.Sprint(now.Add(time.Minute).Unix())),
		} {
			q := Parse(status, h, now)
			want := q.Reset
			if q.HasRetryAfter {
				want = q.RetryAfter
			}
			assert.Equal(t, want, q.Wait(), "%d %v", status, h)
		}
	}
	assert.Equal(t, 30*time.Second, Parse(429, hdr("RateLimit", `"d";r=0;t=30`), now).Wait())
}

// checkQuotaInfo asserts every documented range of a Parse result.
func checkQuotaInfo(t testing.TB, status int, q Info) {
	t.Helper()
	inDelay := func(d time.Duration) bool { return d >= 0 && d <= maxQuotaDelay }
	if q.RateLimited != (status == 429 || (status == 503 && q.HasRetryAfter)) {
		t.Errorf("RateLimited = %v for status %d, HasRetryAfter %v", q.RateLimited, status, q.HasRetryAfter)
	}
	if !inDelay(q.RetryAfter) || (!q.HasRetryAfter && q.RetryAfter != 0) {
		t.Errorf("RetryAfter = %v (HasRetryAfter %v)", q.RetryAfter, q.HasRetryAfter)
	}
	if !inDelay(q.Reset) {
		t.Errorf("Reset = %v", q.Reset)
	}
	if q.Remaining < -1 || q.Remaining > maxQuota {
		t.Errorf("Remaining = %d", q.Remaining)
	}
	if (q.Remaining == -1) != (q.Source == "") {
		t.Errorf("Remaining = %d with Source %q", q.Remaining, q.Source)
	}
	if q.Remaining == -1 && (q.Policy != "" || q.Window != 0 || len(q.Limits) > 0) {
		t.Errorf("no Remaining, yet Policy %q, Window %v, Limits %v", q.Policy, q.Window, q.Limits)
	}
	checkWindow := func(what string, w time.Duration, zeroOK bool) {
		if (w == 0 && !zeroOK) || w < 0 || w > maxQuotaDelay || w%time.Second != 0 {
			t.Errorf("%s window = %v", what, w)
		}
	}
	checkWindow("Window", q.Window, true)
	if len(q.Policies) > maxPolicies || len(q.Limits) > maxPolicies {
		t.Errorf("%d policies, %d limits: more than %d", len(q.Policies), len(q.Limits), maxPolicies)
	}
	if (len(q.Policies) == 0) != (q.PolicySource == "") {
		t.Errorf("%d policies with PolicySource %q", len(q.Policies), q.PolicySource)
	}
	for _, p := range q.Policies {
		if p.Quota < 1 || p.Quota > maxQuota || len(p.Name) > maxPolicyName {
			t.Errorf("policy %+v", p)
		}
		checkWindow("policy", p.Window, true)
	}
	for _, l := range q.Limits {
		if l.Remaining < 0 || l.Remaining > maxQuota || !inDelay(l.Reset) || len(l.Name) > maxPolicyName || (!l.HasReset && l.Reset != 0) {
			t.Errorf("limit %+v", l)
		}
		checkWindow("limit", l.Window, true)
	}
	if len(q.Limits) > 0 {
		low := math.MaxInt
		for _, l := range q.Limits {
			low = min(low, l.Remaining)
		}
		if q.Remaining != low {
			t.Errorf("Remaining = %d, want the lowest of the limits, %d", q.Remaining, low)
		}
	}
}

// FuzzParseQuota: no input panics, and every result is within its
// documented range. The corpus is in testdata/fuzz/FuzzParseQuota; run it
// with go test -run '^$' -fuzz '^FuzzParseQuota$' -fuzztime 30s ./internal/quota/
func FuzzParseQuota(f *testing.F) {
	f.Add(429, int64(1796040000), "60", `"permin";q=50;w=60,"perhr";q=1000;w=3600`, `"permin";r=0;t=10`,
		"", "", "", "5000", "4999", "1796041800", "1", "core", "", "", "", "32/40")
	f.Add(200, int64(1796040000), "", "100;w=10", "limit=100, remaining=50, reset=5",
		"10, 10;w=1", "3", "7", "", "", "", "", "", "900", "899", "1796040900", "")
	f.Fuzz(func(t *testing.T, status int, nowUnix int64, retryAfter, policy, rateLimit,
		rlLimit, rlRemaining, rlReset, xLimit, xRemaining, xReset, xUsed, xResource,
		tLimit, tRemaining, tReset, shopify string) {
		h := http.Header{}
		for _, kv := range [][2]string{
			{"Retry-After", retryAfter}, {"RateLimit-Policy", policy}, {"RateLimit", rateLimit},
			{"RateLimit-Limit", rlLimit}, {"RateLimit-Remaining", rlRemaining}, {"RateLimit-Reset", rlReset},
			{"X-RateLimit-Limit", xLimit}, {"X-RateLimit-Remaining", xRemaining}, {"X-RateLimit-Reset", xReset},
			{"X-RateLimit-Used", xUsed}, {"X-RateLimit-Resource", xResource},
			{"X-Rate-Limit-Limit", tLimit}, {"X-Rate-Limit-Remaining", tRemaining}, {"X-Rate-Limit-Reset", tReset},
			{"X-Shopify-Shop-Api-Call-Limit", shopify},
		} {
			// A newline splits a value into several field lines.
			for line := range strings.SplitSeq(kv[1], "\n") {
				if line != "" {
					h.Add(kv[0], line)
				}
			}
		}
		now := time.Unix(nowUnix%(1<<40), 0)
		q := Parse(status, h, now)
		checkQuotaInfo(t, status, q)
		if w := q.Wait(); w < 0 || w > maxQuotaDelay {
			t.Errorf("Wait() = %v", w)
		}
	})
}
