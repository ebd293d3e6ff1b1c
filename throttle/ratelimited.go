package throttle

import (
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// RateLimitedError is the error of a handler whose provider answered "too
// many requests". The middleware suspends the task's key fleet-wide for
// RetryAfter and defers the task without spending its retry budget; with
// TaskOnly, it defers the task alone.
type RateLimitedError struct {
	// RetryAfter is how long the provider asked to wait; 0 when it did not
	// say (the middleware then waits 5s).
	RetryAfter time.Duration
	// StatusCode is the HTTP status that said so, when known.
	StatusCode int
	// TaskOnly marks a wait narrower than the key: one object locked or
	// one resource's own limit (Discord's X-RateLimit-Scope: shared, Jira's
	// jira-per-issue-on-write, Stripe's lock_timeout), which the key's
	// other tasks do not share. The middleware then defers this task by
	// RetryAfter and suspends nothing: the key's other tasks run on. A
	// handler marks such a wait itself with
	// &throttle.RateLimitedError{RetryAfter: d, TaskOnly: true}; Observe
	// marks the ones it knows.
	TaskOnly bool
	// Key names which of the task's keys the provider's limit is, for a
	// task of several keys (Key("slack:T0123:chat.postMessage",
	// "slack:T0123", "slack")): the middleware suspends that key, e.g.
	// &throttle.RateLimitedError{RetryAfter: d, Key: "slack"} when the
	// app's limit answered. "" (the default, and what RateLimited and
	// Observe return) suspends the task's first key, the most specific.
	// A name that is not one of the task's keys suspends the first, with a
	// warning. With TaskOnly nothing is suspended: the task's deferral is
	// reported on the key named (Event.Key).
	Key string

	spendCap   string // the provider's reason when it is a spend cap, not a rate limit (Observe)
	allocation bool   // an allocation used up (a daily one): no adaptive cut (Observe)
}

// Error says the provider rate limited the call, and for how long.
func (e *RateLimitedError) Error() string {
	if e.spendCap != "" {
		return fmt.Sprintf("throttle: the provider's spend cap is reached (%s, HTTP %d): not a rate limit; raise the cap or wait for the billing period, then resume the key", e.spendCap, e.StatusCode)
	}
	if e.TaskOnly {
		return fmt.Sprintf("throttle: the provider asked this task alone to wait %v (one object or resource, not the key's quota)", e.RetryAfter)
	}
	if e.allocation {
		return fmt.Sprintf("throttle: the provider's allocation is used up, retry after %v", e.RetryAfter)
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("throttle: rate limited by provider, retry after %v", e.RetryAfter)
	}
	return "throttle: rate limited by provider"
}

// RateLimited returns the error a handler returns (or wraps) when its
// provider rate-limited it: every worker in the fleet stops calling that key
// for retryAfter. A retryAfter of 0 or less means the provider did not say:
// the middleware suspends for 5s. A suspension lasts at most
// WithMaxSuspension.
func RateLimited(retryAfter time.Duration) error {
	if retryAfter < 0 {
		retryAfter = 0
	}
	return &RateLimitedError{RetryAfter: retryAfter}
}

// fromResponse is the error Observe returns for a response read as q and
// li: a *RateLimitedError when the response is a rate limit (a 429, a 503
// with Retry-After, or what a provider's dialect says is one: GitHub's
// 403, Shopify's THROTTLED 200), waiting its Retry-After (or the wait its
// dialect states), else the reset it states (the IETF RateLimit's t, then
// RateLimit-Reset, X-RateLimit-Reset, X-Rate-Limit-Reset), else the reset
// of the LLM unit that ran out; nil for any other response. A wait the
// dialect says is the task's alone (q.TaskOnly) makes a TaskOnly error;
// an allocation used up (q.Allocation) suspends without an adaptive cut.
//
// A spend cap (quota.LLMInfo.SpendCap: OpenAI's insufficient_quota,
// Anthropic's spend limits) is no rate limit: the error says so and asks
// the middleware to suspend the key for WithMaxSuspension, under its own
// log line. An LLM provider's retry-after-ms counts when Retry-After is
// absent.
func fromResponse(q quota.Info, li quota.LLMInfo, status int) error {
	if li.SpendCap {
		return &RateLimitedError{RetryAfter: spendCapWait, StatusCode: status, spendCap: li.SpendCapReason}
	}
	if !q.RateLimited && !li.RateLimited {
		return nil
	}
	wait := q.Wait()
	if !q.HasRetryAfter && li.HasRetryAfter {
		wait = li.RetryAfter
	}
	if wait == 0 && !q.HasRetryAfter && !li.HasRetryAfter {
		if d, ok := li.ExhaustedReset(); ok {
			wait = d // OpenAI's 429 without retry-after: the reset of the unit that ran out
		}
	}
	return &RateLimitedError{RetryAfter: wait, StatusCode: status, TaskOnly: q.TaskOnly, allocation: q.Allocation}
}

// spendCapWait is what a spend cap asks for: as long as the middleware
// suspends at most (WithMaxSuspension). An operator resumes the key once
// the cap is raised.
const spendCapWait = 30 * 24 * time.Hour
