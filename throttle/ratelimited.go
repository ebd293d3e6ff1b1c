package throttle

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
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
// for retryAfter (0: unknown, see WithDefaultSuspension).
func RateLimited(retryAfter time.Duration) error {
	if retryAfter < 0 {
		retryAfter = 0
	}
	return &RateLimitedError{RetryAfter: retryAfter}
}

// FromResponse returns a *RateLimitedError for a 429 response, or a 503 that
// carries Retry-After, and nil for any other response. The wait is read from
// Retry-After (seconds or an HTTP date), else RateLimit-Reset (seconds), else
// X-RateLimit-Reset (seconds, or a Unix time as GitHub sends). Missing,
// negative or garbled headers give RetryAfter 0: the middleware's default.
func FromResponse(resp *http.Response) error {
	return fromResponse(resp, time.Now())
}

func fromResponse(resp *http.Response, now time.Time) error {
	if resp == nil {
		return nil
	}
	retryAfter, has := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
	case resp.StatusCode == http.StatusServiceUnavailable && has:
	default:
		return nil
	}
	if !has {
		retryAfter, has = parseReset(resp.Header.Get("RateLimit-Reset"), now)
	}
	if !has {
		retryAfter, _ = parseReset(resp.Header.Get("X-RateLimit-Reset"), now)
	}
	return &RateLimitedError{RetryAfter: retryAfter, StatusCode: resp.StatusCode}
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s != s || s > 1e9 {
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return 0, false
}

// unixThreshold tells a reset given as a Unix time from one given in seconds.
const unixThreshold = 1_000_000_000

func parseReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	s, err := strconv.ParseFloat(v, 64)
	if v == "" || err != nil || s < 0 || s != s {
		return 0, false
	}
	if s >= unixThreshold {
		d := time.Unix(int64(s), 0).Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return time.Duration(s * float64(time.Second)), true
}
