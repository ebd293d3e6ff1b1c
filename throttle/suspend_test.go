package throttle_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestSuspendRefusesUntilItEndsAndIsCapped(t *testing.T) {
	type step struct {
		advance time.Duration
		suspend time.Duration // 0: none
		resume  bool
		// expectation for a Take after the step
		allowed bool
		retry   time.Duration
	}
	tests := []struct {
		name  string
		opts  []throttle.Option
		steps []step
	}{
		{"refuses for d then allows", nil, []step{
			{suspend: 5 * time.Second, retry: 5 * time.Second},
			{advance: 2 * time.Second, retry: 3 * time.Second},
			{advance: 3*time.Second - time.Microsecond, retry: time.Microsecond},
			{advance: time.Microsecond, allowed: true},
		}},
		{"extends, never shortens", nil, []step{
			{suspend: 10 * time.Second, retry: 10 * time.Second},
			{advance: time.Second, suspend: time.Second, retry: 9 * time.Second},
			{suspend: 20 * time.Second, retry: 20 * time.Second},
		}},
		{"resume ends it", nil, []step{
			{suspend: time.Minute, retry: time.Minute},
			{resume: true, allowed: true},
		}},
		{"capped at DefaultMaxSuspension", nil, []step{
			{suspend: 48 * time.Hour, retry: throttle.DefaultMaxSuspension},
		}},
		{"capped by WithMaxSuspension", []throttle.Option{throttle.WithMaxSuspension(time.Minute)}, []step{
			{suspend: time.Hour, retry: time.Minute},
			{advance: 30 * time.Second, suspend: time.Hour, retry: time.Minute},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			r.setLimits("k", throttle.PerSecond(100))
			for i, s := range tt.steps {
				r.advance(s.advance)
				if s.suspend > 0 {
					r.suspend("k", s.suspend)
				}
				if s.resume {
					require.NoError(t, resumed(r.lim.Resume(r.ctx, "k")), "Resume")
				}
				call := fmt.Sprintf("step %d: Take at epoch+%v", i, r.since())
				d := r.take("k")
				if s.allowed {
					assertAllowed(t, d, call)
					continue
				}
				assertRefused(t, d, throttle.RefusedBySuspension, s.retry, call)
				assert.Equal(t, s.retry, r.inspect("k").SuspendedFor, "step %d: Inspect.Suspended", i)
			}
		})
	}
}

func TestSuspendRetryAfterCoversAnEmptyBucket(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerMinute(1))
	assertAllowed(t, r.take("k"), "Take")
	r.suspend("k", 5*time.Second)
	// Suspended for 5 s but the bucket needs 60 s: wait for the later.
	assertRefused(t, r.take("k"), throttle.RefusedBySuspension, time.Minute, "Take while suspended with an empty bucket")
}

func TestSuspendRefusesANonPositiveDuration(t *testing.T) {
	r := newRig(t)
	for _, d := range []time.Duration{0, -time.Second} {
		assert.Error(t, r.lim.Suspend(r.ctx, "k", d), "Suspend(k, %v)", d)
	}
	assert.False(t, r.mr.Exists(redisKey("k", "suspend")), "a refused Suspend wrote the suspend key")
}
