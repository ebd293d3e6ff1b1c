package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Found by TestPropertyMultiKey (issue 30, Resume with tasks of several
// keys; its case is this one, on app at 1/s with fourteen tasks booked
// behind the suspension): a task of [w1 app] refused while app is
// suspended books the suspension's end in app and holds it in w1 (a hold,
// w1 being free sooner). Resume(app) drops app's reservations and brings
// the task back, but its hold in w1 stays, and found (w1's queue is open:
// another task is booked there) it made the task wait for the suspension
// Resume ended, on keys with room from 1 s. Fails before the fix with the
// task told to wait 4.99 s (until 5 s).
func TestResumeDoesNotHoldATaskOfSeveralKeysToTheEndedSuspension(t *testing.T) {
	r := newRig(t)
	const horizon = time.Minute
	r.setLimits("w1", throttle.PerSecond(1).WithBurst(1))
	r.setLimits("app", throttle.PerSecond(10))
	require.True(t, r.reserve("w1", "a1", horizon, time.Second).Allowed)
	d := r.reserve("w1", "a2", horizon, time.Second)
	require.False(t, d.Allowed)
	require.True(t, throttle.Reserved(d), "a2 is booked in w1's schedule (its queue opens): %+v", d)
	r.suspend("app", 5*time.Second)

	keys := []string{"w1", "app"}
	d, err := throttle.ReserveKeys(r.lim, r.ctx, keys, "x", horizon, time.Second, true)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 5*time.Second, d.RetryAfter, "x waits for app's suspension: %+v", d)

	r.advance(10 * time.Millisecond)
	_, err = r.lim.Resume(r.ctx, "app")
	require.NoError(t, err)
	// Resume brings x back (it held a reservation in app).
	d, err = throttle.ReserveKeys(r.lim, r.ctx, keys, "x", horizon, time.Second, true)
	require.NoError(t, err)
	if !d.Allowed {
		require.Less(t, d.RetryAfter, 3*time.Second,
			"x, brought back by Resume, waits for the suspension Resume ended (w1 is queued to 2 s, app has room): %+v", d)
	}
}
