package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Found while adding refunds to TestPropertyMultiKey (issue 30): a task of
// several keys holds its instant in a key whose schedule it did not book
// as '~' and its ID (multi.lua's hold); a refund that brings the latest
// reservations forward (adjust.lua) took the hold for one. On app, a1 (100
// tokens) runs, a2 is booked for 2 s, and x of [w1 app], refused while w1
// is suspended for 10 s, holds 10 s in app. a1 uses none of its tokens:
// the credit of one task's worth brought "~x" forward, a task ID nothing
// runs (Limiter.forward finds no such task), and a2, which the refund had
// room for, still waited for 2 s. Fails before the fix with "~x" brought
// forward.
func TestRefundDoesNotBringAHoldOfATaskOfSeveralKeysForward(t *testing.T) {
	r := newRig(t)
	const horizon = time.Minute
	r.setLimits("app", throttle.PerSecond(1).WithBurst(1), throttle.PerSecond(50).WithBurst(100).In("tokens"))
	r.setLimits("w1", throttle.PerSecond(10))
	d1, err := throttle.ReserveUses(r.lim, r.ctx, "app", "a1", "", "tokens=100", horizon, time.Second)
	require.NoError(t, err)
	require.True(t, d1.Allowed)
	d2, err := throttle.ReserveUses(r.lim, r.ctx, "app", "a2", "", "tokens=100", horizon, time.Second)
	require.NoError(t, err)
	require.True(t, throttle.Reserved(d2), "a2 is booked: %+v", d2)
	r.suspend("w1", 10*time.Second)
	dx, err := throttle.ReserveKeys(r.lim, r.ctx, []string{"w1", "app"}, "x", horizon, time.Second, true)
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, dx.RetryAfter, "x waits for w1's suspension: %+v", dx)
	held, err := r.mr.ZMembers(redisKey("app", "r"))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a2", "~x"}, held, "x holds its instant in app without booking it")

	fw, err := throttle.SettleKeys(r.lim, r.ctx, []string{"app"}, d1, "tokens=100", "tokens", 0)
	require.NoError(t, err)
	var ids []string
	for _, f := range fw["app"] {
		ids = append(ids, f.ID)
	}
	require.Equal(t, []string{"a2"}, ids, "the refund brings the booked a2 forward, not x's hold")
	at, err := r.mr.ZScore(redisKey("app", "r"), "~x")
	require.NoError(t, err)
	require.Equal(t, float64(epoch().Add(10*time.Second).UnixMicro()), at, "x's hold keeps its instant")
}
