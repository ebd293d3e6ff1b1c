package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fixed window admits exactly N calls in each window aligned to the Unix
// epoch, every one of them from the headroom after the window's start to the
// headroom before its end: a call that leaves up to the headroom late still
// lands in the window that counted it.
func TestFixedWindowAdmitsNInEachAlignedWindow(t *testing.T) {
	const n, per = 10, int64(1_000_000)
	const d = 20 * time.Millisecond
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindFixed, Rate: n, PerMS: per / 1000})
	// A caller every 3 ms for 10 s: far more than the window allows.
	var times []int64
	for at := int64(0); at < 10*per; at += 3_000 {
		times = append(times, at)
	}
	got := windowAdmissions(t, e, DecideArgs{Headroom: d}, times)
	perWindow := make([]int, 10)
	for _, at := range got {
		off := at % per // testEpoch is a whole second: at's phase in its aligned window
		assert.GreaterOrEqual(t, off, d.Microseconds(), "a call at %d us: before the headroom after its window's start", at)
		assert.LessOrEqual(t, off, per-d.Microseconds(), "a call at %d us: within the headroom before its window's end", at)
		perWindow[at/per]++
	}
	for i, c := range perWindow {
		assert.Equal(t, n, c, "aligned window %d", i)
	}
}

// A caller refused by a full fixed window, or too close to its end, is told
// to come back when the next window opens (its start plus the headroom).
func TestFixedWindowRefusalWaitsForTheNextOpening(t *testing.T) {
	const d = 20 * time.Millisecond
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindFixed, Rate: 2, PerMS: 1000})
	a := DecideArgs{Headroom: d}

	e.at(5 * time.Millisecond)
	r := e.decide(a)
	require.Equal(t, StatusDenied, r.Status, "5 ms into a window: inside the opening headroom")
	assert.Equal(t, 15*time.Millisecond, r.RetryAfter, "until the window opens")

	e.at(300 * time.Millisecond)
	require.Equal(t, StatusAllowed, e.decide(a).Status)
	require.Equal(t, StatusAllowed, e.decide(a).Status)
	r = e.decide(a)
	require.Equal(t, StatusDenied, r.Status, "the window's 2 are taken")
	assert.Equal(t, "tier:1", r.RefusedBy)
	assert.Equal(t, 720*time.Millisecond, r.RetryAfter, "until the next window opens at 1.02 s")

	e.at(1990 * time.Millisecond)
	r = e.decide(a)
	require.Equal(t, StatusDenied, r.Status, "10 ms before the end of an empty window: the call could land in the next")
	assert.Equal(t, 30*time.Millisecond, r.RetryAfter, "until the next window opens at 2.02 s")
	e.at(2020 * time.Millisecond)
	assert.Equal(t, StatusAllowed, e.decide(a).Status, "at the opening")
}

// A refund goes back to the fixed window the call was counted in, and a
// window never holds more than N real calls: 5 taken whose real cost was 0,
// refunded, then at most 10 more in the same window; none of it reaches
// the next window.
func TestFixedWindowRefundStaysInItsWindow(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindFixed, Rate: 10, PerMS: 1000})
	a := DecideArgs{}
	e.at(100 * time.Millisecond)
	r := e.decide(DecideArgs{Cost: 5})
	require.Equal(t, StatusAllowed, r.Status)
	e.at(200 * time.Millisecond)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -5, Call{At: r.At, Charged: 5, Generation: r.Generation}, nil))
	admitted := 0
	for e.decide(a).Status == StatusAllowed {
		admitted++
	}
	assert.Equal(t, 10, admitted, "after the refund the window holds no real call")

	// A refund of a call from the last window gives nothing to this one.
	e.at(1100 * time.Millisecond)
	r = e.decide(DecideArgs{Cost: 4})
	require.Equal(t, StatusAllowed, r.Status)
	e.at(2100 * time.Millisecond)
	for range 10 {
		require.Equal(t, StatusAllowed, e.decide(a).Status)
	}
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -4, Call{At: r.At, Charged: 4, Generation: r.Generation}, nil))
	assert.Equal(t, StatusDenied, e.decide(a).Status, "a refund from the last window frees nothing in this one")
}

// Inspect names a fixed window's kind and tells the calls it admits now.
func TestInspectShowsAFixedWindow(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindFixed, Rate: 3, PerMS: 60000}, Tier{Kind: KindWindow, Rate: 3, PerMS: 60000})
	e.at(time.Second)
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{}).Status)
	r := e.inspect()
	require.Len(t, r.Tiers, 2)
	assert.Equal(t, byte(KindFixed), r.Tiers[0].Kind)
	assert.Equal(t, byte(KindWindow), r.Tiers[1].Kind, "a fixed and a sliding window of the same period are two tiers")
	assert.Equal(t, []float64{2, 2}, r.Tokens)
}
