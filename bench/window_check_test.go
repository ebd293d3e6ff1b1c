package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bucketAdmissions admits as a saturated token bucket would: the burst at
// 0, then one every 1/rate, with the limits changing per steps (switching at
// their at).
func bucketAdmissions(s tierSchedule, until float64) []admission {
	var out []admission
	tokens, last := s.steps[0].burst, 0.0
	k := 0
	for n := 0; float64(n)*0.0005 <= until; n++ {
		t := float64(n) * 0.0005
		for k+1 < len(s.steps) && t >= s.steps[k+1].at {
			tokens = min(tokens+s.steps[k].rate*(t-last), s.steps[k+1].burst)
			last = t
			k++
		}
		tokens = min(tokens+s.steps[k].rate*(t-last), s.steps[k].burst)
		last = t
		for tokens >= 1 {
			tokens--
			out = append(out, admission{t: t, w: 0.0001})
		}
	}
	return out
}

func TestWorstWindowFindsAnyAdmissionAboveTheBound(t *testing.T) {
	steady := tierSchedule{name: "1s", steps: []tierStep{{rate: 100, burst: 20}}}
	changing := tierSchedule{name: "1s", steps: []tierStep{
		// Each change is known to within 1 ms, the simulation's step.
		{rate: 100, burst: 20}, {at: 3, late: 3.001, rate: 200, burst: 40}, {at: 6, late: 6.001, rate: 50, burst: 10},
	}}
	for _, s := range []tierSchedule{steady, changing} {
		adm := bucketAdmissions(s, 9)
		require.NotEmpty(t, adm)
		r := worstWindow(adm, s)
		assert.LessOrEqual(t, r.Excess, 1e-6, "a saturated bucket stays within the bound: %+v", r)
		assert.Greater(t, r.Excess, -1.0, "and reaches it: %+v", r)
		assert.LessOrEqual(t, r.Certain, 1e-6, "%+v", r)
		assert.LessOrEqual(t, r.Window1s, 1e-6, "%+v", r)

		// One admission too many, anywhere, is found.
		extra := append(append([]admission(nil), adm...), admission{t: 4.5, w: 0.0001})
		r = worstWindow(extra, s)
		assert.Greater(t, r.Excess, 0.0, "one admission above the bucket: %+v", r)
		assert.Greater(t, r.Certain, 0.0, "%+v", r)
	}

	// A raise grants no sudden burst: the old bucket's tokens carry over,
	// so a full new burst on top of a drained old one is over the bound.
	adm := bucketAdmissions(steady, 3)
	for range 40 {
		adm = append(adm, admission{t: 3.01, w: 0.0001})
	}
	r := worstWindow(adm, changing)
	assert.Greater(t, r.Excess, 10.0, "a fresh burst of 40 right after raising: %+v", r)

	// Wide brackets make the certain excess smaller than the midpoint one.
	wide := bucketAdmissions(steady, 2)
	for i := range wide {
		wide[i].w = 0.02
	}
	wide = append(wide, admission{t: 1, w: 0.02})
	r = worstWindow(wide, steady)
	assert.Greater(t, r.Excess, 0.0, "%+v", r)
	assert.Less(t, r.Certain, r.Excess, "%+v", r)
}

func TestTierScheduleCountsARaiseEarlyAndALoweringLate(t *testing.T) {
	s := tierSchedule{steps: []tierStep{{rate: 100, burst: 20}, {at: 1, late: 1.5, rate: 200, burst: 40}, {at: 3, late: 3.5, rate: 50, burst: 10}}}
	assert.InDelta(t, 100.0, s.integral(1), 1e-9, "before the raise")
	assert.InDelta(t, 300.0, s.integral(2), 1e-9, "a raise counts from its earliest moment")
	assert.InDelta(t, 100+200*2.5+50*0.5, s.integral(4), 1e-9, "a lowering from its latest")
	assert.Equal(t, 40.0, s.burst(1.2), "the larger burst while the change may be under way")
	assert.Equal(t, 40.0, s.burst(2))
	assert.Equal(t, 10.0, s.burst(3.6))
}
