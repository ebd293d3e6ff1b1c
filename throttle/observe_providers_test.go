package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// providerSample is one response as its provider documents it (status,
// headers, body), sent to Observe in a handler run by the middleware, on
// a key whose limits are 10x above the provider's; want is what a correct
// client concludes from it.
type providerSample struct {
	row    string // the row of docs/providers.md
	name   string
	source string // the provider's page that shows the shape
	key    string // the key's name (made unique per sample)
	limits []throttle.Limit
	status int
	header []string // name, value, ...; values may hold {unix+d}, {unixf+d}, {iso+d}, {rfc3339+d}
	body   string
	want   conclusion
	// outOfReach says why the sample is known not to be understood; ""
	// for the samples that must be.
	outOfReach string
}

// conclusion is what a correct client concludes from one response.
type conclusion struct {
	n        []int         // each rate tier's quota in force after (nil: as configured)
	suspend  time.Duration // the key's suspension (0: none), capped by WithMaxSuspension (1h)
	upTo     time.Duration // the latest the suspension may end, when it is a range (0: suspend + 1 s)
	task     time.Duration // the task alone deferred this long (0: none)
	wait     time.Duration // the exact wait of Observe's *RateLimitedError (0: not checked)
	spendCap bool          // Observe says it is a spend cap
	tokens   []float64     // each rate tier's tokens at most (nil: not checked; negative: not checked)
	takeWait time.Duration // a Take right after is refused at least this long (0: not checked)
	// byReset: the response is no rate limit (Observe returns nil), but
	// none is left until a reset it states: the key is suspended until then.
	byReset bool
}

// Sources, the providers' own pages.
const (
	srcIETF       = "https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/"
	srcSlack      = "https://api.slack.com/apis/rate-limits"
	srcSlackPost  = "https://api.slack.com/methods/chat.postMessage"
	srcOpenAI     = "https://platform.openai.com/docs/guides/rate-limits"
	srcOpenAIErr  = "https://platform.openai.com/docs/guides/error-codes"
	srcAnthropic  = "https://platform.claude.com/docs/en/api/rate-limits"
	srcAnthErrors = "https://platform.claude.com/docs/en/api/errors"
	srcAzure      = "https://learn.microsoft.com/en-us/azure/ai-services/openai/how-to/quota"
	srcGroq       = "https://console.groq.com/docs/rate-limits"
	srcGitHub     = "https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api"
	srcShopify    = "https://shopify.dev/docs/api/admin-rest/usage/rate-limits"
	srcShopifyGQL = "https://shopify.dev/docs/api/admin-graphql/usage/rate-limits"
	srcHubSpot    = "https://developers.hubspot.com/docs/api/usage-details"
	srcHubSpotErr = "https://developers.hubspot.com/docs/api/error-handling"
	srcSFHeader   = "https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/headers_api_usage.htm"
	srcSFErrors   = "https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/errorcodes.htm"
	srcJira       = "https://developer.atlassian.com/cloud/jira/platform/rate-limiting/"
	srcDiscord    = "https://discord.com/developers/docs/topics/rate-limits"
	srcX          = "https://docs.x.com/x-api/fundamentals/rate-limits"
	srcZendesk    = "https://developer.zendesk.com/api-reference/introduction/rate-limits"
	srcZendeskBP  = "https://developer.zendesk.com/documentation/api-basics/best-practices/best-practices-for-avoiding-rate-limiting"
	srcGemini     = "https://ai.google.dev/gemini-api/docs/rate-limits"
	srcStripe     = "https://docs.stripe.com/rate-limits"
	srcStripeErr  = "https://docs.stripe.com/error-codes"
)

func perDay(n int) throttle.Limit { return throttle.Limit{N: n, Per: 24 * time.Hour} }

// providerCorpus is the corpus: every provider of docs/providers.md, each
// shape from its documentation.
func providerCorpus() []providerSample {
	sec, mn, hr := time.Second, time.Minute, time.Hour
	openAIHeaders := func(remReq, resetReq, remTok, resetTok string) []string {
		return []string{"x-ratelimit-limit-requests", "60", "x-ratelimit-limit-tokens", "150000",
			"x-ratelimit-remaining-requests", remReq, "x-ratelimit-remaining-tokens", remTok,
			"x-ratelimit-reset-requests", resetReq, "x-ratelimit-reset-tokens", resetTok}
	}
	hubspot := func(remaining, secondly, daily string) []string {
		return []string{"X-HubSpot-RateLimit-Daily", "250000", "X-HubSpot-RateLimit-Daily-Remaining", daily,
			"X-HubSpot-RateLimit-Interval-Milliseconds", "10000", "X-HubSpot-RateLimit-Max", "100",
			"X-HubSpot-RateLimit-Remaining", remaining, "X-HubSpot-RateLimit-Secondly", "10",
			"X-HubSpot-RateLimit-Secondly-Remaining", secondly}
	}
	hubspotLimits := []throttle.Limit{throttle.PerSecond(100), {N: 1000, Per: 10 * sec}, perDay(2_500_000)}
	github := func(remaining, reset string) []string {
		return []string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", remaining, "x-ratelimit-used", "1",
			"x-ratelimit-reset", reset, "x-ratelimit-resource", "core"}
	}
	gemini := func(per, value, delay string) string {
		retry := ""
		if delay != "" {
			retry = `,{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"` + delay + `"}`
		}
		return `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.",` +
			`"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[` +
			`{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests",` +
			`"quotaId":"GenerateRequests` + per + `PerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash"},` +
			`"quotaValue":"` + value + `"}]}` + retry + `]}}`
	}
	return []providerSample{
		// The IETF drafts.
		{row: "ietf", name: "RateLimit-Policy and RateLimit, drafts 08 and later", source: srcIETF,
			key: "api-a", limits: []throttle.Limit{{N: 1000, Per: 10 * sec}}, status: 200,
			header: []string{"RateLimit-Policy", `"default";q=100;w=10`, "RateLimit", `"default";r=50;t=5`},
			want:   conclusion{n: []int{100}, tokens: []float64{50}}},
		{row: "ietf", name: "a 429 whose RateLimit says the reset", source: srcIETF,
			key: "api-b", limits: []throttle.Limit{throttle.PerMinute(1000)}, status: 429,
			header: []string{"RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=0;t=30`},
			want:   conclusion{n: []int{100}, suspend: 30 * sec}},
		{row: "ietf", name: "draft 07's RateLimit dictionary, none left", source: srcIETF,
			key: "api-c", limits: []throttle.Limit{throttle.PerMinute(1000)}, status: 200,
			header: []string{"RateLimit-Policy", "100;w=60", "RateLimit", "limit=100, remaining=0, reset=40"},
			want:   conclusion{n: []int{100}, suspend: 40 * sec, byReset: true}},
		{row: "ietf", name: "drafts up to 06: RateLimit-Limit with its policy", source: srcIETF,
			key: "api-d", limits: []throttle.Limit{throttle.PerSecond(100)}, status: 200,
			header: []string{"RateLimit-Limit", "10, 10;w=1", "RateLimit-Remaining", "5", "RateLimit-Reset", "1"},
			want:   conclusion{n: []int{10}, tokens: []float64{5}}},
		{row: "ietf", name: "two policies, two tiers", source: srcIETF,
			key: "api-e", limits: []throttle.Limit{throttle.PerMinute(500), throttle.PerHour(10000)}, status: 200,
			header: []string{"RateLimit-Policy", `"permin";q=50;w=60, "perhr";q=1000;w=3600`},
			want:   conclusion{n: []int{50, 1000}}},

		// Slack.
		{row: "slack", name: "a 429 with Retry-After", source: srcSlack,
			key: "slack:T1", limits: []throttle.Limit{throttle.PerMinute(500)}, status: 429,
			header: []string{"Retry-After", "30"}, body: `{"ok":false,"error":"ratelimited"}`,
			want: conclusion{suspend: 30 * sec, wait: 30 * sec}},
		{row: "slack", name: "chat.postMessage's one message a second per channel", source: srcSlackPost,
			key: "slack:T1:post", limits: []throttle.Limit{throttle.PerMinute(500)}, status: 429,
			header: []string{"Retry-After", "1"}, body: `{"ok":false,"error":"ratelimited"}`,
			want:       conclusion{task: sec},
			outOfReach: "nothing in the response tells one channel's limit from the method's: the key is suspended for the second"},

		// OpenAI.
		{row: "openai", name: "each unit's limit and what is left", source: srcOpenAI,
			key: "openai:gpt-a", limits: []throttle.Limit{throttle.PerMinute(600), throttle.PerMinute(1_500_000).In("tokens")}, status: 200,
			header: openAIHeaders("59", "1s", "149984", "6m0s"),
			want:   conclusion{n: []int{60, 150000}}},
		{row: "openai", name: "a 429 without retry-after: the reset of the requests that ran out", source: srcOpenAI,
			key: "openai:gpt-b", limits: []throttle.Limit{throttle.PerMinute(600), throttle.PerMinute(1_500_000).In("tokens")}, status: 429,
			header: openAIHeaders("0", "1s", "149000", "400ms"),
			want:   conclusion{n: []int{60, 150000}, suspend: sec, wait: sec}},
		{row: "openai", name: "a 429 without retry-after: the reset of the tokens that ran out", source: srcOpenAI,
			key: "openai:gpt-c", limits: []throttle.Limit{throttle.PerMinute(600), throttle.PerMinute(1_500_000).In("tokens")}, status: 429,
			header: openAIHeaders("50", "10s", "0", "20s"),
			want:   conclusion{n: []int{60, 150000}, suspend: 20 * sec, wait: 20 * sec}},
		{row: "openai", name: "insufficient_quota is a spend cap", source: srcOpenAIErr,
			key: "openai:gpt-d", limits: []throttle.Limit{throttle.PerMinute(600)}, status: 429,
			body: `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			want: conclusion{suspend: hr, spendCap: true}},

		// Anthropic.
		{row: "anthropic", name: "each unit's limit", source: srcAnthropic,
			key: "anthropic:claude-a", status: 200,
			limits: []throttle.Limit{throttle.PerMinute(500), throttle.PerMinute(300000).In("input-tokens"), throttle.PerMinute(80000).In("output-tokens")},
			header: []string{"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "49",
				"anthropic-ratelimit-requests-reset", "{rfc3339+2s}",
				"anthropic-ratelimit-input-tokens-limit", "30000", "anthropic-ratelimit-input-tokens-remaining", "29000",
				"anthropic-ratelimit-input-tokens-reset", "{rfc3339+2s}",
				"anthropic-ratelimit-output-tokens-limit", "8000", "anthropic-ratelimit-output-tokens-remaining", "8000",
				"anthropic-ratelimit-output-tokens-reset", "{rfc3339+0s}"},
			want: conclusion{n: []int{50, 30000, 8000}}},
		{row: "anthropic", name: "a 429 with retry-after", source: srcAnthropic,
			key: "anthropic:claude-b", limits: []throttle.Limit{throttle.PerMinute(500)}, status: 429,
			header: []string{"retry-after", "30", "anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0"},
			body:   `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`,
			want:   conclusion{n: []int{50}, suspend: 30 * sec, wait: 30 * sec}},
		{row: "anthropic", name: "the tier's spend cap", source: srcAnthropic,
			key: "anthropic:claude-c", limits: []throttle.Limit{throttle.PerMinute(500)}, status: 429,
			body: `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`,
			want: conclusion{suspend: hr, spendCap: true}},
		{row: "anthropic", name: "a 402 billing_error", source: srcAnthErrors,
			key: "anthropic:claude-d", limits: []throttle.Limit{throttle.PerMinute(500)}, status: 402,
			body: `{"type":"error","error":{"type":"billing_error","message":"There is an issue with your billing or payment information."}}`,
			want: conclusion{suspend: hr, spendCap: true}},

		// Azure OpenAI.
		{row: "azure", name: "retry-after-ms over retry-after", source: srcAzure,
			key: "azure:gpt-a", limits: []throttle.Limit{throttle.PerMinute(3000)}, status: 429,
			header: []string{"retry-after-ms", "1500", "retry-after", "2"},
			want:   conclusion{suspend: 1500 * time.Millisecond, wait: 1500 * time.Millisecond}},
		{row: "azure", name: "what is left of each unit", source: srcAzure,
			key: "azure:gpt-b", limits: []throttle.Limit{throttle.PerMinute(3000), throttle.PerMinute(500000).In("tokens")}, status: 200,
			header: []string{"x-ratelimit-remaining-requests", "10", "x-ratelimit-remaining-tokens", "5000"},
			want:   conclusion{tokens: []float64{10, 5000}}},

		// Groq.
		{row: "groq", name: "requests per day, tokens per minute", source: srcGroq,
			key: "groq:llama-a", limits: []throttle.Limit{perDay(144000), throttle.PerMinute(180000).In("tokens")}, status: 200,
			header: []string{"x-ratelimit-limit-requests", "14400", "x-ratelimit-limit-tokens", "18000",
				"x-ratelimit-remaining-requests", "14370", "x-ratelimit-remaining-tokens", "17997",
				"x-ratelimit-reset-requests", "2m59.56s", "x-ratelimit-reset-tokens", "7.66s"},
			want: conclusion{n: []int{14400, 18000}}},
		{row: "groq", name: "a 429 with retry-after", source: srcGroq,
			key: "groq:llama-b", limits: []throttle.Limit{throttle.PerMinute(300)}, status: 429,
			header: []string{"retry-after", "2"},
			want:   conclusion{suspend: 2 * sec, wait: 2 * sec}},

		// GitHub.
		{row: "github", name: "5,000 an hour, on a window of an hour", source: srcGitHub,
			key: "github:org1", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 200,
			header: github("4999", "{unix+59m}"),
			want:   conclusion{n: []int{5000}}},
		{row: "github", name: "5,000 an hour, converted to a per-second tier", source: srcGitHub,
			key: "github:org2", limits: []throttle.Limit{throttle.PerSecond(14)}, status: 200,
			header: github("4999", "{unix+59m}"),
			want:   conclusion{n: []int{1}}},
		{row: "github", name: "5,000 an hour, converted to the tier of the nearest period", source: srcGitHub,
			key: "github:org3", limits: []throttle.Limit{throttle.PerSecond(20), throttle.PerMinute(830)}, status: 200,
			header: github("4999", "{unix+59m}"),
			want:   conclusion{n: []int{20, 83}}},
		{row: "github", name: "search, 30 a minute", source: srcGitHub,
			key: "github:search", limits: []throttle.Limit{throttle.PerMinute(300)}, status: 200,
			header: []string{"x-ratelimit-limit", "30", "x-ratelimit-remaining", "29", "x-ratelimit-reset", "{unix+50s}", "x-ratelimit-resource", "search"},
			want:   conclusion{n: []int{30}}},
		{row: "github", name: "the primary limit as a 403", source: srcGitHub,
			key: "github:org4", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 403,
			header: github("0", "{unix+20m}"),
			body:   `{"message":"API rate limit exceeded for user ID 1.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`,
			want:   conclusion{n: []int{5000}, suspend: 20 * mn}},
		{row: "github", name: "the primary limit as a 429", source: srcGitHub,
			key: "github:org5", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 429,
			header: github("0", "{unix+45m}"),
			body:   `{"message":"API rate limit exceeded for user ID 1."}`,
			want:   conclusion{n: []int{5000}, suspend: 45 * mn}},
		{row: "github", name: "a secondary limit: a 403 with retry-after", source: srcGitHub,
			key: "github:org6", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 403,
			header: append(github("4900", "{unix+40m}"), "retry-after", "60"),
			body:   `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`,
			want:   conclusion{n: []int{5000}, suspend: mn, wait: mn}},
		{row: "github", name: "a secondary limit without retry-after: at least a minute", source: srcGitHub,
			key: "github:org7", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 403,
			header: github("4900", "{unix+40m}"),
			body:   `{"message":"You have exceeded a secondary rate limit and have been temporarily blocked from content creation. Please retry your request again later."}`,
			want:   conclusion{n: []int{5000}, suspend: mn, wait: mn}},
		{row: "github", name: "a 403 that is no rate limit", source: srcGitHub,
			key: "github:org8", limits: []throttle.Limit{throttle.Window(50000, hr)}, status: 403,
			header: github("4900", "{unix+40m}"),
			body:   `{"message":"Resource not accessible by integration","documentation_url":"https://docs.github.com/rest"}`,
			want:   conclusion{n: []int{5000}}},

		// Shopify.
		{row: "shopify", name: "REST: 32 of a bucket of 40, leaking 2 a second", source: srcShopify,
			key: "shopify:store1", limits: []throttle.Limit{throttle.PerSecond(20)}, status: 200,
			header: []string{"X-Shopify-Shop-Api-Call-Limit", "32/40"},
			want:   conclusion{n: []int{2}, tokens: []float64{8}}},
		{row: "shopify", name: "REST: a 429 with Retry-After: 2.0", source: srcShopify,
			key: "shopify:store2", limits: []throttle.Limit{throttle.PerSecond(20)}, status: 429,
			header: []string{"X-Shopify-Shop-Api-Call-Limit", "40/40", "Retry-After", "2.0"},
			want:   conclusion{n: []int{2}, suspend: 2 * sec, wait: 2 * sec}},
		{row: "shopify", name: "REST on Shopify Plus, on a key not named for it", source: srcShopify,
			key: "store-plus", limits: []throttle.Limit{throttle.PerSecond(200)}, status: 200,
			header: []string{"X-Shopify-Shop-Api-Call-Limit", "1/400"},
			want:   conclusion{n: []int{20}}},
		{row: "shopify", name: "GraphQL: the bucket in extensions.cost", source: srcShopifyGQL,
			key: "shopify:gql1", limits: []throttle.Limit{throttle.PerSecond(500)}, status: 200,
			header: []string{"Content-Type", "application/json; charset=utf-8"},
			body: `{"data":{"shop":{"name":"Snowdevil"}},"extensions":{"cost":{"requestedQueryCost":1,"actualQueryCost":1,` +
				`"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":990,"restoreRate":50.0}}}}`,
			want: conclusion{n: []int{50}}},
		{row: "shopify", name: "GraphQL: THROTTLED in a 200 waits for the points missing", source: srcShopifyGQL,
			key: "shopify:gql2", limits: []throttle.Limit{throttle.PerSecond(500)}, status: 200,
			header: []string{"Content-Type", "application/json"},
			body: `{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED","documentation":"https://shopify.dev/api/usage/rate-limits"}}],` +
				`"extensions":{"cost":{"requestedQueryCost":752,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":100,"restoreRate":50.0}}}}`,
			want: conclusion{n: []int{50}, suspend: 13040 * time.Millisecond, wait: 13040 * time.Millisecond}},

		// HubSpot.
		{row: "hubspot", name: "ten-second, secondly and daily limits", source: srcHubSpot,
			key: "hubspot:portal1", limits: hubspotLimits, status: 200, header: hubspot("99", "9", "249000"),
			want: conclusion{n: []int{10, 100, 250000}, tokens: []float64{9, 99, -1}}},
		{row: "hubspot", name: "the ten-second limit: its interval", source: srcHubSpotErr,
			key: "hubspot:portal2", limits: hubspotLimits, status: 429, header: hubspot("0", "5", "200000"),
			body: `{"status":"error","message":"You have reached your ten_secondly_rolling limit.","errorType":"RATE_LIMIT","policyName":"TEN_SECONDLY_ROLLING"}`,
			want: conclusion{n: []int{10, 100, 250000}, suspend: 10 * sec, wait: 10 * sec}},
		{row: "hubspot", name: "the daily limit, waited for", source: srcHubSpotErr,
			key: "hubspot:portal3", limits: hubspotLimits, status: 429, header: hubspot("50", "5", "0"),
			body: `{"status":"error","message":"You have reached your daily limit.","errorType":"RATE_LIMIT","correlationId":"c033cdaa-2c40-4a64-ae48-b4cec88dad24","policyName":"DAILY"}`,
			want: conclusion{n: []int{10, 100, 250000}, suspend: hr, wait: 24 * hr}},
		{row: "hubspot", name: "the secondly limit", source: srcHubSpotErr,
			key: "hubspot:portal4", limits: hubspotLimits, status: 429, header: hubspot("40", "0", "200000"),
			body: `{"status":"error","message":"You have reached your secondly limit.","errorType":"RATE_LIMIT","policyName":"SECONDLY"}`,
			want: conclusion{n: []int{10, 100, 250000}, suspend: sec, wait: sec}},

		// Salesforce.
		{row: "salesforce", name: "api-usage per rolling 24 hours, on a key not named for it", source: srcSFHeader,
			key: "crm-sf", limits: []throttle.Limit{throttle.Window(1_000_000, 24*hr)}, status: 200,
			header: []string{"Sforce-Limit-Info", "api-usage=10018/100000"},
			want:   conclusion{n: []int{100000}}},
		{row: "salesforce", name: "REQUEST_LIMIT_EXCEEDED: the allocation, waited for", source: srcSFErrors,
			key: "salesforce:org1", limits: []throttle.Limit{throttle.Window(150000, 24*hr)}, status: 403,
			header: []string{"Sforce-Limit-Info", "api-usage=15000/15000"},
			body:   `[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]`,
			want:   conclusion{n: []int{15000}, suspend: hr, wait: 24 * hr}},
		{row: "salesforce", name: "too many long requests at once: a short wait", source: srcSFErrors,
			key: "salesforce:org2", limits: []throttle.Limit{throttle.PerSecond(50)}, status: 403,
			body: `[{"message":"ConcurrentPerOrgLongTxn Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]`,
			want: conclusion{suspend: 5 * sec}},

		// Jira.
		{row: "jira", name: "the burst limit: Retry-After", source: srcJira,
			key: "jira:site1", limits: []throttle.Limit{throttle.PerSecond(100)}, status: 429,
			header: []string{"Retry-After", "5", "X-RateLimit-Reset", "{iso+5s}", "RateLimit-Reason", "jira-burst-based"},
			want:   conclusion{suspend: 5 * sec, wait: 5 * sec}},
		{row: "jira", name: "the tenant's hourly quota", source: srcJira,
			key: "jira:site2", limits: []throttle.Limit{throttle.PerSecond(100)}, status: 429,
			header: []string{"Retry-After", "1800", "X-RateLimit-Reset", "{iso+30m}", "RateLimit-Reason", "jira-quota-tenant-based"},
			want:   conclusion{suspend: 30 * mn, wait: 30 * mn}},
		{row: "jira", name: "one issue's writes: the task alone waits", source: srcJira,
			key: "jira:site3", limits: []throttle.Limit{throttle.PerSecond(100)}, status: 429,
			header: []string{"Retry-After", "2", "RateLimit-Reason", "jira-per-issue-on-write"},
			want:   conclusion{task: 2 * sec, wait: 2 * sec}},
		{row: "jira", name: "only X-RateLimit-Reset, an ISO 8601 minute", source: srcJira,
			key: "jira:site4", limits: []throttle.Limit{throttle.PerSecond(100)}, status: 429,
			header: []string{"X-RateLimit-Reset", "{iso+3m}"},
			want:   conclusion{suspend: 3 * mn, upTo: 4 * mn}},

		// Discord.
		{row: "discord", name: "a route's bucket, empty, Reset-After to the millisecond", source: srcDiscord,
			key: "discord:bot1", limits: []throttle.Limit{throttle.PerSecond(50)}, status: 200,
			header: []string{"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "{unixf+1.234s}",
				"X-RateLimit-Reset-After", "1.234", "X-RateLimit-Bucket", "abcd1234"},
			want: conclusion{tokens: []float64{0}, takeWait: 1234 * time.Millisecond}},
		{row: "discord", name: "a user limit: the body's retry_after", source: srcDiscord,
			key: "discord:bot2", limits: []throttle.Limit{throttle.PerSecond(50)}, status: 429,
			header: []string{"Retry-After", "65", "X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "0",
				"X-RateLimit-Reset", "{unixf+64.57s}", "X-RateLimit-Reset-After", "64.57", "X-RateLimit-Bucket", "abcd1234", "X-RateLimit-Scope", "user"},
			body: `{"message":"You are being rate limited.","retry_after":64.57,"global":false}`,
			want: conclusion{suspend: 64570 * time.Millisecond, wait: 64570 * time.Millisecond}},
		{row: "discord", name: "a shared resource's limit: the task alone waits", source: srcDiscord,
			key: "discord:bot3", limits: []throttle.Limit{throttle.PerSecond(50)}, status: 429,
			header: []string{"Retry-After", "1337", "X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "9",
				"X-RateLimit-Reset", "{unixf+64.57s}", "X-RateLimit-Reset-After", "64.57", "X-RateLimit-Bucket", "abcd1234", "X-RateLimit-Scope", "shared"},
			body: `{"message":"The resource is being rate limited.","retry_after":1336.57,"global":false}`,
			want: conclusion{task: 1336570 * time.Millisecond, wait: 1336570 * time.Millisecond}},
		{row: "discord", name: "the global limit", source: srcDiscord,
			key: "discord:bot4", limits: []throttle.Limit{throttle.PerSecond(50)}, status: 429,
			header: []string{"Retry-After", "65", "X-RateLimit-Global", "true", "X-RateLimit-Scope", "global"},
			body:   `{"message":"You are being rate limited.","retry_after":64.57,"global":true}`,
			want:   conclusion{suspend: 64570 * time.Millisecond, wait: 64570 * time.Millisecond}},

		// X.
		{row: "x", name: "900 per 15 minutes", source: srcX,
			key: "x:app1", limits: []throttle.Limit{throttle.Window(9000, 15*mn)}, status: 200,
			header: []string{"x-rate-limit-limit", "900", "x-rate-limit-remaining", "847", "x-rate-limit-reset", "{unix+10m}"},
			want:   conclusion{n: []int{900}}},
		{row: "x", name: "900 per 15 minutes, converted to a per-minute tier", source: srcX,
			key: "twitter:app2", limits: []throttle.Limit{throttle.PerMinute(600)}, status: 200,
			header: []string{"x-rate-limit-limit", "900", "x-rate-limit-remaining", "847", "x-rate-limit-reset", "{unix+10m}"},
			want:   conclusion{n: []int{60}}},
		{row: "x", name: "a 429 waits for x-rate-limit-reset", source: srcX,
			key: "x:app3", limits: []throttle.Limit{throttle.Window(9000, 15*mn)}, status: 429,
			header: []string{"x-rate-limit-limit", "900", "x-rate-limit-remaining", "0", "x-rate-limit-reset", "{unix+12m}"},
			body:   `{"title":"Too Many Requests","detail":"Too Many Requests","type":"about:blank","status":429}`,
			want:   conclusion{n: []int{900}, suspend: 12 * mn}},

		// Zendesk.
		{row: "zendesk", name: "700 a minute", source: srcZendeskBP,
			key: "zendesk:acme1", limits: []throttle.Limit{throttle.PerMinute(7000)}, status: 200,
			header: []string{"x-rate-limit", "700", "ratelimit-limit", "700", "x-rate-limit-remaining", "699",
				"ratelimit-remaining", "699", "ratelimit-reset", "41", "zendesk-ratelimit-tickets-index", "total=100; remaining=99; resets=41"},
			want: conclusion{n: []int{700}, tokens: []float64{699}}},
		{row: "zendesk", name: "700 a minute, converted to a per-second tier", source: srcZendesk,
			key: "zendesk:acme2", limits: []throttle.Limit{throttle.PerSecond(120)}, status: 200,
			header: []string{"X-Rate-Limit", "700", "X-Rate-Limit-Remaining", "699"},
			want:   conclusion{n: []int{11}}},
		{row: "zendesk", name: "a 429 with Retry-After", source: srcZendesk,
			key: "zendesk:acme3", limits: []throttle.Limit{throttle.PerMinute(7000)}, status: 429,
			header: []string{"Retry-After", "93", "X-Rate-Limit", "700", "X-Rate-Limit-Remaining", "0"},
			want:   conclusion{n: []int{700}, suspend: 93 * sec, wait: 93 * sec}},
		{row: "zendesk", name: "an endpoint's own limit beside the account's", source: srcZendeskBP,
			key: "zendesk:acme4", limits: []throttle.Limit{throttle.PerMinute(7000)}, status: 200,
			header: []string{"ratelimit-limit", "700", "ratelimit-remaining", "650", "ratelimit-reset", "41",
				"zendesk-ratelimit-tickets-index", "total=100; remaining=0; resets=41"},
			want:       conclusion{n: []int{700}, task: 41 * sec},
			outOfReach: "an endpoint's limit is the endpoint's: only a key per endpoint could follow it, and nothing tells which tasks call it"},

		// Gemini.
		{row: "gemini", name: "RetryInfo and the per-minute quota", source: srcGemini,
			key: "gemini:flash1", limits: []throttle.Limit{throttle.PerMinute(150)}, status: 429,
			body: gemini("PerMinute", "15", "26s"),
			want: conclusion{n: []int{15}, suspend: 26 * sec, wait: 26 * sec}},
		{row: "gemini", name: "the per-day quota, waited for", source: srcGemini,
			key: "gemini:flash2", limits: []throttle.Limit{throttle.PerMinute(150), perDay(2500)}, status: 429,
			body: gemini("PerDay", "250", ""),
			want: conclusion{n: []int{150, 250}, suspend: hr, wait: 24 * hr}},

		// Stripe.
		{row: "stripe", name: "the rate limiter: a second", source: srcStripe,
			key: "stripe:acct1", limits: []throttle.Limit{throttle.PerSecond(1000)}, status: 429,
			header: []string{"Stripe-Rate-Limited-Reason", "global-rate"},
			body:   `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests hit the API too quickly."}}`,
			want:   conclusion{suspend: sec, wait: sec}},
		{row: "stripe", name: "lock_timeout: the task alone waits", source: srcStripe,
			key: "stripe:acct2", limits: []throttle.Limit{throttle.PerSecond(1000)}, status: 429,
			body: `{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"This object cannot be accessed right now because another API request or Stripe process is currently accessing it."}}`,
			want: conclusion{task: sec, wait: sec}},
		{row: "stripe", name: "a resource-specific limit: the task alone waits", source: srcStripe,
			key: "stripe:acct3", limits: []throttle.Limit{throttle.PerSecond(1000)}, status: 429,
			header: []string{"Stripe-Rate-Limited-Reason", "resource-specific"},
			body:   `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests on this PaymentIntent."}}`,
			want:   conclusion{task: 5 * sec}},
		{row: "stripe", name: "a 402 declined card is no spend cap", source: srcStripeErr,
			key: "stripe:acct4", limits: []throttle.Limit{throttle.PerSecond(1000)}, status: 402,
			body: `{"error":{"type":"card_error","code":"card_declined","decline_code":"generic_decline","message":"Your card was declined."}}`,
			want: conclusion{}},
	}
}

var placeholder = regexp.MustCompile(`\{(unix|unixf|iso|rfc3339)\+([0-9.a-z]+)\}`)

// headerAt builds a sample's header, its times as of now.
func headerAt(kv []string, now time.Time) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		v := placeholder.ReplaceAllStringFunc(kv[i+1], func(m string) string {
			p := placeholder.FindStringSubmatch(m)
			d, err := time.ParseDuration(p[2])
			if err != nil {
				panic(err)
			}
			at := now.Add(d)
			switch p[1] {
			case "unix":
				return fmt.Sprint(int64(math.Ceil(float64(at.UnixNano()) / 1e9)))
			case "unixf":
				return fmt.Sprintf("%.3f", math.Ceil(float64(at.UnixNano())/1e6)/1e3)
			case "iso":
				return at.UTC().Format("2006-01-02T15:04Z")
			}
			return at.Add(time.Second - 1).UTC().Format(time.RFC3339)
		})
		h.Add(kv[i], v)
	}
	return h
}

// corpusRig runs samples through Observe under the middleware of one
// Limiter on a real Redis.
type corpusRig struct {
	ctx context.Context
	lim *throttle.Limiter
	mu  sync.Mutex
	evs map[string][]throttle.Event
}

func newCorpusRig(t *testing.T) *corpusRig {
	rdb := redistest.Start(t).Client(t)
	r := &corpusRig{ctx: context.Background(), evs: map[string][]throttle.Event{}}
	r.lim = throttle.NewLimiter(rdb, throttle.WithLogger((&logtest.Recorder{}).Logger()), throttle.WithHeadroom(0), throttle.WithLease(0, 0))
	r.lim.OnEvent(func(ev throttle.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.evs[ev.Key] = append(r.evs[ev.Key], ev)
	})
	return r
}

// run sends sample s to Observe on key, and returns how what the key then
// does differs from s.want (none: understood).
func (r *corpusRig) run(t *testing.T, key string, s providerSample) []string {
	t.Helper()
	require.NoError(t, r.lim.SetLimits(r.ctx, key, s.limits...))
	resp := &http.Response{StatusCode: s.status, Header: headerAt(s.header, time.Now()), Body: io.NopCloser(strings.NewReader(s.body))}
	var observed error
	start := time.Now()
	_ = r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		observed = throttle.Observe(ctx, resp)
		return observed
	})).ProcessTask(r.ctx, newTask(t, "sync", nil, throttle.Key(key)))
	st, err := r.lim.Inspect(r.ctx, key)
	require.NoError(t, err)
	elapsed := time.Since(start)
	var off []string
	differ := func(format string, args ...any) { off = append(off, fmt.Sprintf(format, args...)) }

	for i, l := range s.limits {
		want := l.N
		if s.want.n != nil {
			want = s.want.n[i]
		}
		if got := st.InForce[i].N; got != want {
			differ("tier %d (%v): %d in force, want %d", i, l, got, want)
		}
	}
	switch lo, hi := s.want.suspend, s.want.upTo; {
	case lo == 0 && st.SuspendedFor > 0:
		differ("the key is suspended for %v, want not", st.SuspendedFor)
	case lo > 0:
		if hi == 0 {
			hi = lo + time.Second
		}
		// (less what passed since the response, which the suspension began after)
		if lo = lo - elapsed - 50*time.Millisecond; st.SuspendedFor < lo || st.SuspendedFor > hi {
			differ("the key is suspended for %v, want %v to %v", st.SuspendedFor, lo, hi)
		}
	}
	var task time.Duration
	r.mu.Lock()
	for _, ev := range r.evs[key] {
		if ev.Outcome == throttle.Deferred && ev.Reason.String() == "provider" {
			task = ev.Delay
		}
	}
	r.mu.Unlock()
	if w := s.want.task; (w == 0) != (task == 0) || task < w || task > w+w/10+2*time.Second {
		differ("the task alone deferred for %v, want %v", task, w)
	}
	var rl *throttle.RateLimitedError
	isRL := errors.As(observed, &rl)
	switch {
	case (s.want.byReset || s.want.suspend == 0 && s.want.task == 0) && observed != nil:
		differ("Observe returned %v, want nil", observed)
	case (s.want.suspend > 0 || s.want.task > 0) && !s.want.byReset && !isRL:
		differ("Observe returned %v, want a *RateLimitedError", observed)
	case s.want.wait > 0 && isRL && (rl.RetryAfter < s.want.wait || rl.RetryAfter > s.want.wait+time.Microsecond):
		differ("Observe's wait %v, want %v", rl.RetryAfter, s.want.wait)
	}
	if isRL && s.want.spendCap != strings.Contains(rl.Error(), "spend cap") {
		differ("Observe says %q; a spend cap: %v", rl.Error(), s.want.spendCap)
	}
	for i, most := range s.want.tokens {
		// (what the tier refilled since, at its configured rate at most)
		refill := float64(s.limits[i].N) * float64(elapsed) / float64(s.limits[i].Per)
		if most >= 0 && st.Tokens[i] > most+refill+1 {
			differ("tier %d holds %.1f tokens, want at most %v", i, st.Tokens[i], most)
		}
	}
	if s.want.takeWait > 0 {
		d, err := r.lim.Take(r.ctx, key)
		require.NoError(t, err)
		if d.Allowed || d.RetryAfter < s.want.takeWait-time.Since(start) {
			differ("a Take right after: allowed %v, retry after %v; want refused for %v at least", d.Allowed, d.RetryAfter, s.want.takeWait)
		}
	}
	return off
}

// The providers' dialects, each shape as the provider documents it: the
// key does what a correct client concludes (learns the quota, converted
// to the key's tier; waits the right time; suspends the key, or defers
// the one task) for all but the samples marked out of reach, which are
// held to stay so (move one in when it is understood). docs/providers.md
// is this table.
func TestObserveSpeaksTheProvidersDialects(t *testing.T) {
	t.Parallel()
	r := newCorpusRig(t)
	corpus := providerCorpus()
	understood, rows := 0, map[string][2]int{}
	for i, s := range corpus {
		key := fmt.Sprintf("%s:s%d", s.key, i)
		t.Run(s.row+"/"+s.name, func(t *testing.T) {
			require.NotEmpty(t, s.source, "every sample cites its source")
			off := r.run(t, key, s)
			c := rows[s.row]
			c[1]++
			if s.outOfReach == "" {
				assert.Empty(t, off, "%s (%s): not understood", s.name, s.source)
				if len(off) == 0 {
					understood++
					c[0]++
				}
			} else {
				assert.NotEmpty(t, off, "%s is understood now: drop its outOfReach (%s)", s.name, s.outOfReach)
				t.Logf("out of reach: %s; %v", s.outOfReach, off)
			}
			rows[s.row] = c
		})
	}
	t.Logf("understood: %d of %d documented responses; by provider: %v", understood, len(corpus), rows)
	assert.GreaterOrEqual(t, len(corpus), 48, "the corpus is at least as broad as the issue's")
	assert.GreaterOrEqual(t, understood, len(corpus)-2, "understood")
}
