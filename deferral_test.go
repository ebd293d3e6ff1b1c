package throttle_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A task deferred on asynq's retry path keeps the deferral as its last
// error, which asynqmon shows even once the task completed: it reads as
// throttling with the (wall clock) time the task was due again, never as a
// failure.
func TestE2EDeferralReadsAsThrottling(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{servers: 1})
	f.setLimits("crm", throttle.PerSecond(2))
	start := time.Now()
	ids := f.enqueue("crm", "job", 6)
	f.waitDone(6, 30*time.Second)
	f.audit(6)
	end := time.Now()

	deferred := 0
	for _, id := range ids {
		info, err := f.insp.GetTaskInfo("default", id)
		require.NoError(t, err, "task %s", id)
		require.Equal(t, asynq.TaskStateCompleted, info.State, id)
		if info.LastErr == "" {
			continue
		}
		deferred++
		msg := info.LastErr
		rest, ok := strings.CutPrefix(msg, `throttled (not a failure): key "crm" deferred until `)
		require.True(t, ok, "last error of a completed task: %q", msg)
		at, err := time.Parse(time.RFC3339, rest[:strings.IndexByte(rest, ' ')])
		require.NoError(t, err, "the time in %q", msg)
		assert.Equal(t, time.UTC, at.Location(), "%q: UTC", msg)
		assert.True(t, !at.Before(start.Truncate(time.Second)) && !at.After(end.Add(time.Second)),
			"%q: due between the enqueue (%v) and the end (%v)", msg, start.UTC(), end.UTC())
		assert.Regexp(t, `\((tier|queued|before slot|in flight)\)$`, msg, "ends with the reason")
		assert.NotContains(t, strings.ToLower(msg), "error")
	}
	assert.Positive(t, deferred, "no task was deferred: the test proves nothing")
}
