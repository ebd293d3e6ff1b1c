package deferral

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// asynqmon and the asynq CLI show a deferral as the task's last error, even
// once the task completed: it must read as throttling, with the time the
// task is due, not as a failure.
func TestErrorReadsAsThrottling(t *testing.T) {
	until := time.Date(2026, 12, 1, 16, 4, 5, 2_000_000, time.FixedZone("CET", 3600))
	e := &Error{Key: "slack", Reason: "tier", Delay: 3 * time.Second, Until: until}
	assert.Equal(t, `throttled (not a failure): key "slack" deferred until 2026-12-01T15:04:05Z (tier)`, e.Error())
	for _, word := range []string{"error", "fail:", "failed"} {
		assert.NotContains(t, strings.ToLower(e.Error()), word, "%q", e.Error())
	}
	e.Until = time.Time{}
	assert.Equal(t, `throttled (not a failure): key "slack" deferred for 3s (tier)`, e.Error(), "without a due time")
}

func TestParseReadsBackWhatErrorWrites(t *testing.T) {
	until := time.Date(2026, 12, 1, 15, 4, 5, 0, time.UTC)
	for _, e := range []*Error{
		{Key: "slack", Reason: "suspended", Delay: time.Minute, Until: until},
		{Key: "slack", Reason: "redis unavailable", Delay: time.Minute},
		{Key: `odd "key" (x): deferred until`, Reason: "before slot", Delay: 1500 * time.Millisecond, Until: until},
	} {
		key, reason, ok := Parse(e.Error())
		assert.True(t, ok, "Parse(%q)", e.Error())
		assert.Equal(t, e.Key, key, "Parse(%q): key", e.Error())
		assert.Equal(t, e.Reason, reason, "Parse(%q): reason", e.Error())
	}
	for _, msg := range []string{
		"", "boom",
		`throttled (not a failure): key slack deferred for 1s (tier)`,
		`throttled (not a failure): key "unterminated`,
		`throttled (not a failure): key "slack" deferred for 1s`,
		`throttled (not a failure): key "slack" deferred for 1s ()x`,
		`throttled (not a failure): key "slack" for 1s (tier)`,
	} {
		_, _, ok := Parse(msg)
		assert.False(t, ok, "Parse(%q)", msg)
	}
}
