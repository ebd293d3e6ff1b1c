package throttle_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestEveryKeyHasATTLThatOutlivesItsState(t *testing.T) {
	t.Run("every key written has a TTL", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1))
		assert.Equal(t, throttle.DefaultIdleExpiry, r.mr.TTL(bucket("k")), "key TTL after SetLimits")
		r.take("k")
		d := r.reserve("k", "a", time.Minute, 0)
		require.True(t, throttle.Reserved(d), "Reserve: %+v", d)
		r.suspend("k", 3*time.Second)
		for _, p := range []string{"b", "r"} {
			assert.Positive(t, r.mr.TTL(redisKey("k", p)), "TTL of %s", redisKey("k", p))
		}
		assert.GreaterOrEqual(t, r.mr.TTL(redisKey("k", "r")), time.Second+throttle.DefaultLapse, "reservations TTL covers slot + lapse")
		assert.Equal(t, []string{"throttle:keys", bucket("k"), redisKey("k", "r")}, r.mr.Keys(), "keys")
		assert.Greater(t, r.mr.TTL("throttle:keys"), throttle.DefaultIdleExpiry, "the index outlives the keys it lists")
	})
	t.Run("idle expiry refreshed by Take", func(t *testing.T) {
		r := newRig(t, throttle.WithIdleExpiry(time.Hour))
		r.setLimits("k", throttle.PerSecond(1))
		r.advance(30 * time.Minute)
		r.take("k")
		assert.Equal(t, time.Hour, r.mr.TTL(bucket("k")), "key TTL after a Take 30 min later")
		r.advance(59 * time.Minute)
		_, err := throttle.Limits(r.lim, r.ctx, "k")
		assert.NoError(t, err, "Limits 59 min after the last Take")
		r.advance(time.Minute)
		_, err = throttle.Limits(r.lim, r.ctx, "k")
		assert.ErrorIs(t, err, throttle.ErrNoLimits, "Limits an hour after the last Take")
	})
	t.Run("hand-written limits get a TTL", func(t *testing.T) {
		r := newRig(t)
		r.hset(bucket("k"), "L", "1/1000/1")
		require.Zero(t, r.mr.TTL(bucket("k")), "TTL of the hand-written limits")
		r.take("k")
		assert.Equal(t, throttle.DefaultIdleExpiry, r.mr.TTL(bucket("k")), "key TTL after Take")
	})
	t.Run("a suspension keeps the key alive", func(t *testing.T) {
		r := newRig(t)
		r.suspend("k", 3*time.Second)
		assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), 3*time.Second, "TTL of a suspended key without limits")
	})
	t.Run("state outlives its refill", func(t *testing.T) {
		tests := []struct {
			limit throttle.Limit
			takes int
			full  time.Duration // until the bucket is full again
		}{
			{throttle.PerHour(1).WithBurst(10), 10, 10 * time.Hour},
			{throttle.PerSecond(3), 3, time.Second},
			{throttle.Limit{N: 1, Per: throttle.MaxPer, Burst: 3}, 2, 2 * throttle.MaxPer},
		}
		for _, tt := range tests {
			// On default limits: no idle expiry of limits in Redis keeps the
			// key, only what the bucket needs.
			r := newRig(t, throttle.WithDefaultLimits(tt.limit))
			for i := 0; i < tt.takes; i++ {
				require.True(t, r.take("k").Allowed, "%v: Take #%d", tt.limit, i+1)
			}
			assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), tt.full, "%v: key TTL after %d takes", tt.limit, tt.takes)
		}
	})
	t.Run("state outlives the reservation queue", func(t *testing.T) {
		r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
		r.take("k")
		var last throttle.Decision
		for i := 0; i < 30; i++ {
			last = r.reserve("k", fmt.Sprint(i), time.Minute, 0)
			require.True(t, throttle.Reserved(last), "Reserve(%d): %+v", i, last)
		}
		queue := throttle.ReservedAt(last).Sub(r.now)
		assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), queue, "key TTL with a queue of %v", queue)
		// SetLimits drops the queue (its slots were spaced for the old
		// limits): 3 s later a fresh Take is decided by the buckets alone.
		r.setLimits("k", throttle.PerSecond(1))
		assert.Zero(t, r.mr.Exists(redisKey("k", "r")), "reservations kept after SetLimits")
		r.advance(3 * time.Second)
		d := r.take("k")
		assert.True(t, d.Allowed, "Take 3 s after SetLimits dropped the queue: %+v", d)
	})
}
