package throttle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/quota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFromResponseTellsARateLimitFromOtherFailures(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	in := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name    string
		status  int
		headers map[string]string
		want    time.Duration // -1: nil error
	}{
		{"200 is not limited", 200, map[string]string{"Retry-After": "5"}, -1},
		{"500 is not limited", 500, nil, -1},
		{"503 without Retry-After is an outage, not a limit", 503, nil, -1},
		{"429 seconds", 429, map[string]string{"Retry-After": "30"}, 30 * time.Second},
		{"429 fractional seconds", 429, map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond},
		{"429 zero", 429, map[string]string{"Retry-After": "0"}, 0},
		{"429 HTTP-date", 429, map[string]string{"Retry-After": in(90 * time.Second)}, 90 * time.Second},
		{"429 HTTP-date in the past", 429, map[string]string{"Retry-After": in(-time.Minute)}, 0},
		{"429 missing", 429, nil, 0},
		{"429 garbage", 429, map[string]string{"Retry-After": "soon"}, 0},
		{"429 negative", 429, map[string]string{"Retry-After": "-5"}, 0},
		{"429 NaN", 429, map[string]string{"Retry-After": "NaN"}, 0},
		{"429 whitespace", 429, map[string]string{"Retry-After": " 7 "}, 7 * time.Second},
		{"503 with Retry-After", 503, map[string]string{"Retry-After": "12"}, 12 * time.Second},
		{"429 RateLimit-Reset seconds", 429, map[string]string{"RateLimit-Reset": "42"}, 42 * time.Second},
		{"429 X-RateLimit-Reset unix time (GitHub)", 429,
			map[string]string{"X-RateLimit-Reset": fmt.Sprint(now.Add(10 * time.Minute).Unix())}, 10 * time.Minute},
		{"429 X-RateLimit-Reset seconds", 429, map[string]string{"X-RateLimit-Reset": "20"}, 20 * time.Second},
		{"429 X-RateLimit-Reset garbage", 429, map[string]string{"X-RateLimit-Reset": "later"}, 0},
		{"429 X-RateLimit-Reset negative", 429, map[string]string{"X-RateLimit-Reset": "-1"}, 0},
		{"Retry-After wins over reset headers", 429,
			map[string]string{"Retry-After": "3", "RateLimit-Reset": "50", "X-RateLimit-Reset": "60"}, 3 * time.Second},
		{"garbage Retry-After falls back to RateLimit-Reset", 429,
			map[string]string{"Retry-After": "x", "RateLimit-Reset": "8"}, 8 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tt.status, Header: http.Header{}}
			for k, v := range tt.headers {
				resp.Header.Set(k, v)
			}
			err := fromResponse(quota.Parse(resp.StatusCode, resp.Header, now), quota.ParseLLM(quota.ProviderUnknown, resp.StatusCode, resp.Header, now), resp.StatusCode)
			if tt.want < 0 {
				assert.NoError(t, err, "fromResponse(%d %v)", tt.status, tt.headers)
				return
			}
			var rl *RateLimitedError
			require.True(t, errors.As(err, &rl), "fromResponse(%d %v) = %v, want a RateLimitedError", tt.status, tt.headers, err)
			assert.Equal(t, tt.want, rl.RetryAfter, "fromResponse(%d %v)", tt.status, tt.headers)
			assert.Equal(t, tt.status, rl.StatusCode)
		})
	}
	assert.NoError(t, Observe(context.Background(), nil))
}

func TestRateLimitedIsFoundThroughWrapping(t *testing.T) {
	err := fmt.Errorf("slack: users.list: %w", RateLimited(3*time.Second))
	var rl *RateLimitedError
	require.True(t, errors.As(err, &rl))
	assert.Equal(t, 3*time.Second, rl.RetryAfter)
	assert.Zero(t, RateLimited(-time.Second).(*RateLimitedError).RetryAfter, "negative means unknown")
	assert.Contains(t, RateLimited(time.Second).Error(), "retry after 1s")
}
