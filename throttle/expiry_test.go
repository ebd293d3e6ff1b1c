package throttle_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// config is the Redis key of a limiter key's configuration (limits and
// weights, kept until Delete).
func config(name string) string { return redisKey(name, "c") }

func TestEveryKeyHasATTLThatOutlivesItsState(t *testing.T) {
	t.Run("every state key has a TTL, the configuration none", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1))
		assert.Positive(t, r.mr.TTL(bucket("k")), "the hash's TTL after SetLimits")
		assert.Zero(t, r.mr.TTL(config("k")), "the configuration's TTL: none")
		r.take("k")
		d := r.reserve("k", "a", time.Minute, 0)
		require.True(t, throttle.Reserved(d), "Reserve: %+v", d)
		r.suspend("k", 3*time.Second)
		for _, p := range []string{"b", "r"} {
			assert.Positive(t, r.mr.TTL(redisKey("k", p)), "TTL of %s", redisKey("k", p))
		}
		assert.GreaterOrEqual(t, r.mr.TTL(redisKey("k", "r")), time.Second+throttle.DefaultLapse, "reservations TTL covers slot + lapse")
		assert.ElementsMatch(t, []string{"throttle:keys", bucket("k"), redisKey("k", "r"), config("k")}, r.mr.Keys(), "keys")
		assert.Greater(t, r.mr.TTL("throttle:keys"), 24*time.Hour, "the index outlives the keys it lists")
	})
	t.Run("an idle key keeps its limits until Delete", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1).WithBurst(2))
		require.NoError(t, r.lim.SetWeights(r.ctx, "k", map[string]int{"gold": 3}))
		r.take("k")
		r.advance(30 * 24 * time.Hour) // a month without a decision
		assert.Equal(t, []string{config("k")}, r.mr.Keys(), "an idle key shrinks to its configuration")
		got, err := throttle.Limits(r.lim, r.ctx, "k")
		require.NoError(t, err, "Limits a month after the last decision")
		assert.Equal(t, []throttle.Limit{throttle.PerSecond(1).WithBurst(2)}, got)
		st := r.inspect("k")
		require.Len(t, st.Tenants, 1, "the weights stay too")
		assert.Equal(t, 3, st.Tenants[0].Weight)
		n, d := r.takeAll("k", 10)
		assert.Equal(t, 2, n, "a month later the limits still hold: the burst, then a refusal")
		assert.Equal(t, throttle.RefusedByTier, d.Reason)
		require.NoError(t, r.lim.Delete(r.ctx, "k"))
		assert.Empty(t, r.mr.Keys(), "Delete removes the configuration")
	})
	t.Run("limits set before the configuration key existed are kept", func(t *testing.T) {
		r := newRig(t)
		r.hset(bucket("k"), "L", "1/1000/1")
		require.Zero(t, r.mr.TTL(bucket("k")), "TTL of the hand-written limits")
		r.take("k")
		assert.Positive(t, r.mr.TTL(bucket("k")), "key TTL after Take")
		r.advance(30 * 24 * time.Hour)
		got, err := throttle.Limits(r.lim, r.ctx, "k")
		require.NoError(t, err, "Limits a month after the last decision")
		assert.Equal(t, []throttle.Limit{throttle.PerSecond(1).WithBurst(1)}, got)
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
