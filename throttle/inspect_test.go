package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestInspectReportsLimitsTokensSuspensionAndQueue(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10), throttle.PerMinute(100))
	for i := 0; i < 3; i++ {
		require.True(t, r.take("k").Allowed, "Take #%d", i+1)
	}
	s := r.inspect("k")
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(10).WithBurst(10), throttle.PerMinute(100).WithBurst(100)}, s.Limits, "Limits")
	assert.InDeltaSlice(t, []float64{7, 97}, s.Tokens, 1e-9, "Tokens after 3 takes")
	assert.Zero(t, s.SuspendedFor, "Suspended")
	assert.Zero(t, s.Reservations, "Reservations")
	assert.Zero(t, s.QueuedFor, "QueuedFor")

	r.suspend("k", 5*time.Second)
	d := r.reserve("k", "a", time.Minute, 0)
	require.True(t, throttle.Reserved(d), "Reserve while suspended: %+v", d)
	s = r.inspect("k")
	assert.Equal(t, 5*time.Second, s.SuspendedFor, "Suspended")
	assert.Equal(t, 1, s.Reservations, "Reservations")
	// Spacing is the slowest tier's interval: 60 s / 100 = 600 ms.
	assert.Equal(t, 5600*time.Millisecond, s.QueuedFor, "QueuedFor")

	r.advance(time.Second)
	s = r.inspect("k")
	assert.InDeltaSlice(t, []float64{10, 97 + 100.0/60}, s.Tokens, 1e-9, "Tokens 1 s later")
	assert.Equal(t, 4*time.Second, s.SuspendedFor, "Suspended 1 s later")

	before := r.mr.Dump()
	r.inspect("k")
	assert.Equal(t, before, r.mr.Dump(), "Inspect changed Redis")

	t.Run("defaults", func(t *testing.T) {
		r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(4)))
		s := r.inspect("x")
		assert.Equal(t, effective([]throttle.Limit{throttle.PerSecond(4)}), s.Limits, "Limits from defaults")
		assert.Equal(t, []float64{4}, s.Tokens, "Tokens of a fresh key")
	})
	t.Run("no limits but suspended", func(t *testing.T) {
		r := newRig(t)
		r.suspend("x", time.Minute)
		s := r.inspect("x")
		assert.Nil(t, s.Limits, "Limits")
		assert.Equal(t, time.Minute, s.SuspendedFor, "Suspended")
		d, err := r.lim.Take(r.ctx, "x")
		require.NoError(t, err, "Take on a suspended key without limits")
		assertRefused(t, d, throttle.RefusedBySuspension, time.Minute, "Take on a suspended key without limits")
	})
}
