package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A clock that steps back never refills: the bucket's state is the time it
// will be full again (on the Redis clock), so a step back makes it look
// emptier, never fuller, and when the clock is back the bucket is exactly
// where it was. The retry-after says when the bucket really has a token.
func TestClockSteppingBackNeverRefills(t *testing.T) {
	t.Run("no refill, no error, no extra tokens when it returns", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1).WithBurst(5))
		r.advance(10 * time.Second)
		n, _ := r.takeAll("k", 10)
		require.Equal(t, 5, n, "burst")
		stored := r.tierState("k")

		r.setClock(epoch()) // 10 s back
		d := r.take("k")
		assertRefused(t, d, throttle.RefusedByTier, 11*time.Second, "Take 10 s in the past")
		assert.Equal(t, stored, r.tierState("k"), "stored state after a refusal in the past")

		r.setClock(epoch().Add(10 * time.Second)) // back where it was
		assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Second, "Take when the clock is back")
		r.setClock(epoch().Add(11 * time.Second))
		assertAllowed(t, r.take("k"), "Take 1 s after the last real take")
	})
	t.Run("tokens taken in the past stay taken", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1).WithBurst(5))
		r.advance(10 * time.Second)
		for i := range 2 {
			require.True(t, r.take("k").Allowed, "Take #%d", i+1)
		}
		r.setClock(epoch().Add(9 * time.Second)) // 1 s back: 2 of the 3 tokens left show
		n, _ := r.takeAll("k", 10)
		assert.Equal(t, 2, n, "takes allowed 1 s in the past")

		r.setClock(epoch().Add(10 * time.Second))
		n, _ = r.takeAll("k", 10)
		assert.Equal(t, 1, n, "takes allowed when the clock is back: the burst's last token")
	})
	t.Run("a step back beyond an hour empties the bucket, without a freeze", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerHour(10))
		r.advance(2 * time.Hour)
		n, _ := r.takeAll("k", 100)
		require.Equal(t, 10, n, "burst")
		r.setClock(epoch().Add(time.Hour - time.Minute)) // 1 h 1 min back
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 0, n, "takes allowed right after the clock stepped back 1 h 1 min")
		assert.Equal(t, 6*time.Minute, d.RetryAfter, "one token of 10/h from the step on")
	})
}

// After the clock stepped back, a write covers the whole time until the
// bucket is full again, measured from the (earlier) clock: the expiry of a
// bucket on default limits never cuts its debt short.
func TestClockSteppedBackStateOutlivesItsRefill(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1).WithBurst(10)))
	r.advance(100 * time.Second)
	for i := range 5 {
		require.True(t, r.take("k").Allowed, "Take #%d", i+1)
	}
	r.setClock(epoch().Add(97 * time.Second)) // 3 s back: full at +105, 8 s away
	assertAllowed(t, r.take("k"), "Take 3 s in the past")
	assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), 9*time.Second, "key TTL after a take 3 s in the past (full at +106 s, now +97 s)")
}
