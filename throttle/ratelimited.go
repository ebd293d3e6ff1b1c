package throttle

import (
	"fmt"
	"net/http"
	"time"
)

// RateLimitedError is the error of a handler whose provider answered "too
// many requests". The middleware suspends the task's key fleet-wide for
// RetryAfter and defers the task without spending its retry budget.
type RateLimitedError struct {
	// RetryAfter is how long the provider asked to wait; 0 when it did not
	// say (the middleware then uses WithDefaultSuspension).
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
// the middleware suspends for WithDefaultSuspension's duration.
func RateLimited(retryAfter time.Duration) error {
	if retryAfter < 0 {
		retryAfter = 0
	}
	return &RateLimitedError{RetryAfter: retryAfter}
}

// FromResponse returns a *RateLimitedError for a 429 response, or a 503 that
// carries Retry-After, and nil for any other response. The wait is read from
// Retry-After (seconds or an HTTP date), else from the reset the response
// states: the IETF RateLimit field's t (of its lowest remaining), else
// RateLimit-Reset (seconds), else X-RateLimit-Reset (seconds, or a Unix time
// as GitHub sends), else X-Rate-Limit-Reset (Twitter/X). Missing, negative,
// garbled headers, and waits beyond 30 days, give RetryAfter 0: the
// middleware's default.
func FromResponse(resp *http.Response) error {
	return fromResponse(resp, time.Now())
}

func fromResponse(resp *http.Response, now time.Time) error {
	if resp == nil {
		return nil
	}
	q := parseQuota(resp.StatusCode, resp.Header, now)
	if !q.RateLimited {
		return nil
	}
	wait := q.Reset
	if q.HasRetryAfter {
		wait = q.RetryAfter
	}
	return &RateLimitedError{RetryAfter: wait, StatusCode: resp.StatusCode}
}
