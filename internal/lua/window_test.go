package lua

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// windowAdmissions drives Decide at the given times (us after testEpoch)
// under limits, and returns the times that were admitted.
func windowAdmissions(t *testing.T, e *env, a DecideArgs, times []int64) []int64 {
	t.Helper()
	var got []int64
	for _, at := range times {
		e.at(time.Duration(at) * time.Microsecond)
		r := e.decide(a)
		if r.Status == StatusAllowed {
			got = append(got, at)
		}
	}
	return got
}

// maxIn returns the most times in any half-open window [t, t+w).
func maxIn(ts []int64, w int64) int {
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j]-ts[i] < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// A window admits at most N calls in any window of its length, whatever
// its phase, and a steady backlog gets at least 95 % of N per window.
func TestWindowAdmitsAtMostNInAnyWindow(t *testing.T) {
	const n, per = 10, int64(1_000_000)
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: n, PerMS: per / 1000})
	// A caller every 7 ms for 20 s: far more than the window allows.
	var times []int64
	for at := int64(0); at < 20*per; at += 7_000 {
		times = append(times, at)
	}
	got := windowAdmissions(t, e, DecideArgs{}, times)
	assert.LessOrEqual(t, maxIn(got, per), n, "calls in any window of 1 s")
	share := float64(len(got)) / (20 * n)
	assert.GreaterOrEqual(t, share, 0.95, "share of the quota a steady backlog gets (%d calls in 20 s)", len(got))

	// Beside a bucket: both hold.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 5}, Tier{Kind: KindWindow, Rate: n, PerMS: per / 1000})
	got = windowAdmissions(t, e2, DecideArgs{}, times)
	assert.LessOrEqual(t, maxIn(got, per), n, "window beside a bucket")
	assert.LessOrEqual(t, maxIn(got, 10_000), 5, "the bucket's burst beside a window")
}

// Headroom keeps room for dispatch jitter: a call is admitted only when it
// would still be d later, so calls shifted by up to d never exceed the
// bucket (or the window) at the provider.
func TestHeadroomKeepsRoomForDispatchJitter(t *testing.T) {
	const d = 20 * time.Millisecond
	t.Run("bucket", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 10})
		r := e.decide(DecideArgs{Headroom: d})
		assert.Equal(t, StatusAllowed, r.Status, "a bucket full for long")
		n := 1
		for e.decide(DecideArgs{Headroom: d}).Status == StatusAllowed {
			n++
		}
		assert.Equal(t, 10-2, n, "a burst of 10 less 100/s x 20 ms")
		r = e.decide(DecideArgs{})
		assert.Equal(t, StatusAllowed, r.Status, "without headroom the exact bucket still holds 2")
	})
	t.Run("window", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 1000})
		var times []int64
		for at := int64(0); at < 10_000_000; at += 3_000 {
			times = append(times, at)
		}
		got := windowAdmissions(t, e, DecideArgs{Headroom: d}, times)
		assert.LessOrEqual(t, maxIn(got, 1_000_000+d.Microseconds()), 10, "calls in any window of 1 s + the headroom")
	})
}

// TestWindowCountsCallsAdmittedAhead: a paced admission is counted at
// the instant its worker was told to call, which may be after the instant a
// later decision is made. That decision counts it: a window that holds both
// instants must see at most N. (Found by scenario E: 30 admitted now beside
// 3 paced ones 300 ms ahead drew 429s from a strict 30 per second window.)
func TestWindowCountsCallsAdmittedAhead(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 3, PerMS: 1000})
	now := testEpoch().UnixMicro()
	sub := int64(1_000_000 / 20)
	// Three calls admitted for 500 ms from now (a paced admission's instant).
	e.mr.HSet(e.k.Bucket, "Ww1000", fmt.Sprintf("%d 3", (now+500_000)/sub))
	r := e.decide(DecideArgs{})
	assert.Equal(t, StatusDenied, r.Status, "a call now beside 3 admitted 500 ms ahead, at most 3 in any 1 s: %+v", r)
	assert.Equal(t, "tier:1", r.RefusedBy)
	// Its wait is until those three have left a window that holds now's
	// successor: 1 s after their sub-window ends.
	assert.GreaterOrEqual(t, r.RetryAfter, 1500*time.Millisecond, "wait")
	e.at(r.RetryAfter)
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{}).Status, "once they have left the window")
}

// Inspect tells the calls a window would still admit now: none while its
// room is reserved, never a negative number (a batch reserved in the
// sub-window of now while the last batch's calls are still in the window
// read as -60 in bench scenario E's traces).
func TestInspectWindowWithReservationsAdmitsNone(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 2, PerMS: 1000})
	// 2 calls admitted 10 ms ago, 2 reserved for 10 ms from now: the same
	// sub-window (50 ms) as now.
	sub := testEpoch().UnixMicro() / 50_000
	e.at(25 * time.Millisecond)
	e.mr.HSet(e.k.Bucket, "Ww1000", fmt.Sprintf("%d 2+15000|%d:2+35000", sub, sub))
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{0}, r.Tokens, "calls the window admits now")
}

// A cost the configured window holds, above a window lowered by a learned
// quota (10 per 5 s learned as 1: 12 a minute, converted), waits for the
// learned quota's end, then runs under the configured window; it is never
// refused as too high, nor told to wait the longest wait (it was: 116
// days, the lowered window holding 2 at no instant). Booked, it reserves
// the learned quota's end; beyond the horizon, it comes back when that
// end can be reserved.
func TestCostAboveALearnedWindowWaitsForTheLearnedEnd(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		kind := byte(KindWindow)
		if fixed {
			kind = KindFixed
		}
		e := newEnv(t)
		e.setLimits(Tier{Kind: kind, Rate: 10, PerMS: 5000})
		got := e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 12, PerMS: 60_000}}})
		require.Len(t, got, 1, "fixed %v", fixed)
		require.Equal(t, int64(1), e.inspect().Tiers[0].Rate, "fixed %v: learned as 1 per 5 s", fixed)
		end := e.inspect().LearnedFor[0]
		require.Greater(t, end, 9*time.Minute)

		r := e.decide(DecideArgs{Cost: 2, Granule: time.Second})
		assert.Equal(t, StatusDenied, r.Status, "fixed %v", fixed)
		assert.Equal(t, "tier:1", r.RefusedBy, "fixed %v", fixed)
		assert.GreaterOrEqual(t, r.RetryAfter, end, "fixed %v: not before the learned quota ends", fixed)
		assert.LessOrEqual(t, r.RetryAfter, end+5*time.Second, "fixed %v: then the configured window", fixed)

		b := e.decide(DecideArgs{TaskID: "t", Cost: 2, Granule: time.Second, Horizon: time.Hour, Lapse: time.Minute})
		assert.Equal(t, StatusDenied, b.Status, "fixed %v", fixed)
		assert.False(t, b.Reserved.IsZero(), "fixed %v: reserved", fixed)
		in := b.Reserved.Sub(testEpoch())
		assert.GreaterOrEqual(t, in, end, "fixed %v", fixed)
		assert.LessOrEqual(t, in, end+6*time.Second, "fixed %v", fixed)

		s := e.decide(DecideArgs{TaskID: "u", Cost: 2, Granule: time.Second, Horizon: time.Minute, Lapse: time.Minute})
		assert.Equal(t, StatusDenied, s.Status, "fixed %v", fixed)
		assert.True(t, s.Reserved.IsZero(), "fixed %v: beyond the horizon", fixed)
		assert.GreaterOrEqual(t, s.RetryAfter, end-time.Minute, "fixed %v", fixed)
		assert.LessOrEqual(t, s.RetryAfter, end-time.Minute+6*time.Second, "fixed %v: when the end can be reserved", fixed)

		// At its instant, the learned quota ended: the configured window
		// of 10 admits it.
		e.at(in)
		assert.Equal(t, StatusAllowed, e.decide(DecideArgs{TaskID: "t", Cost: 2, Granule: time.Second, Horizon: time.Hour, Lapse: time.Minute}).Status, "fixed %v", fixed)
	}
}

// The same for a window lowered by Adaptive: a cost the configured window
// holds and the halved one cannot waits until the rate is won back (it
// was told to wait 116 days).
func TestCostAboveAnAdaptedWindowWaitsForTheRateWonBack(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 5000}, Tier{Kind: KindAdaptive, PerMS: 10_000})
	_, err := SuspendKey(e.ctx, e.run, e.k, 2*time.Second, time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(5), e.inspect().Tiers[0].Rate, "halved")
	e.at(3 * time.Second)
	r := e.decide(DecideArgs{Cost: 6, Granule: time.Second})
	assert.Equal(t, StatusDenied, r.Status)
	assert.Positive(t, r.RetryAfter)
	assert.LessOrEqual(t, r.RetryAfter, time.Minute, "won back in 5 clean periods of 10 s")
	e.at(3*time.Second + r.RetryAfter)
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 6, Granule: time.Second}).Status, "back at the configured window")
}
