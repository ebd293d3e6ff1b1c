package throttle

import (
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// RateLimitedError is the error of a handler whose provider answered "too
// many requests". The middleware suspends the task's key fleet-wide for
// RetryAfter and defers the task without spending its retry budget.
type RateLimitedError struct {
	// RetryAfter is how long the provider asked to wait; 0 when it did not
	// say (the middleware then suspends for 5s).
	RetryAfter time.Duration
	// StatusCode is the HTTP status that said so, when known.
	StatusCode int
}

// Error says the provider rate limited the call, and for how long.
func (e *RateLimitedError) Error() string {
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

// fromResponse is the error Observe returns for resp at now: a
// *RateLimitedError for a 429, or a 503 with a Retry-After, waiting its
// Retry-After, else the reset it states (the IETF RateLimit's t, then
// RateLimit-Reset, X-RateLimit-Reset, X-Rate-Limit-Reset); nil for any
// other response.
func fromResponse(q quota.Info, status int) error {
	if !q.RateLimited {
		return nil
	}
	return &RateLimitedError{RetryAfter: q.Wait(), StatusCode: status}
}
