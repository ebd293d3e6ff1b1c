package main

import "sort"

// The offline sliding-window check of scenario S: for one tier, over every
// window [t_i, t_j] that starts and ends at an admission (the tightest
// windows do), the admissions in it must not exceed
//
//	burst(t_i) + the tier's rate integrated over [t_i, t_j]
//
// which is burst + rate x span while the limits stay, and across a change
// is the rule docs/guarantees.md states (each tier keeps its tokens, clamped to the
// new burst; a raise grants no sudden burst). Times are seconds on the
// Redis clock since the run's start; each admission is known to within its
// bracket (the decision was sent at t - w/2 and answered by t + w/2).

// admission is one admitted call: the midpoint of its bracket, and the
// bracket's width (seconds).
type admission struct{ t, w float64 }

// tierStep is a tier's limits from a change on. The change happened within
// [at, late] (the SetLimits call's bracket).
type tierStep struct {
	at, late    float64
	rate, burst float64 // tokens per second, tokens
}

// tierSchedule is a tier's limits over the run: steps[0] holds from the
// start (its at and late are ignored), each later one from its change.
type tierSchedule struct {
	name  string
	steps []tierStep
}

// switchAt is when the upper bound takes step k to hold: a raise as early
// as it may have happened, a lowering as late.
func (s tierSchedule) switchAt(k int) float64 {
	if s.steps[k].rate >= s.steps[k-1].rate {
		return s.steps[k].at
	}
	return s.steps[k].late
}

// rate is the tier's rate at t, on the upper bound's schedule.
func (s tierSchedule) rate(t float64) float64 {
	r := s.steps[0].rate
	for k := 1; k < len(s.steps); k++ {
		if t >= s.switchAt(k) {
			r = s.steps[k].rate
		}
	}
	return r
}

// integral is the rate integrated from 0 to t.
func (s tierSchedule) integral(t float64) float64 {
	sum, from, r := 0.0, 0.0, s.steps[0].rate
	for k := 1; k < len(s.steps); k++ {
		at := s.switchAt(k)
		if at >= t {
			break
		}
		sum += r * (max(at, from) - from)
		from, r = max(at, from), s.steps[k].rate
	}
	return sum + r*(t-from)
}

// burst is the bucket size at t: the larger of the two while a change may
// be under way.
func (s tierSchedule) burst(t float64) float64 {
	b := s.steps[0].burst
	for k := 1; k < len(s.steps); k++ {
		st := s.steps[k]
		switch {
		case t > st.late:
			b = st.burst
		case t >= st.at:
			b = max(b, st.burst)
		}
	}
	return b
}

// windowResult is the worst window of one tier.
type windowResult struct {
	Tier string
	// Excess is count - bound of the worst window with admissions at their
	// midpoints (at most 0: the bound holds); Count, Bound, Start and Span
	// describe that window.
	Excess, Bound, Start, Span float64
	Count                      int
	// Certain is the worst excess that holds whatever the admissions' true
	// times within their brackets: above 0 is a violation for sure.
	Certain float64
	// Window1s is the worst excess among windows of at most one second,
	// and its count and bound.
	Window1s        float64
	Count1s         int
	Bound1s, Span1s float64
}

// worstWindow finds the worst window of adm (any order) under s, in O(n):
// excess(i, j) = (j - i + 1) - burst(t_i) - (R(t_j) - R(t_i)) splits into
// f(j) + g(i), so the best i for each j is a running maximum. The worst
// window of at most one second is found separately, with two pointers.
func worstWindow(adm []admission, s tierSchedule) windowResult {
	a := append([]admission(nil), adm...)
	sort.Slice(a, func(i, j int) bool { return a[i].t < a[j].t })
	res := windowResult{Tier: s.name, Excess: -1e18, Certain: -1e18, Window1s: -1e18}
	if len(a) == 0 {
		return res
	}
	R := make([]float64, len(a))
	for i := range a {
		R[i] = s.integral(a[i].t)
	}
	bestG, bestI := -1e18, 0
	bestGC := -1e18
	for j := range a {
		g := -float64(j) + 1 - s.burst(a[j].t) + R[j]
		if g > bestG {
			bestG, bestI = g, j
		}
		gc := g - s.rate(a[j].t)*a[j].w/2
		bestGC = max(bestGC, gc)
		f := float64(j) - R[j]
		if e := f + bestG; e > res.Excess {
			i := bestI
			res.Excess, res.Count = e, j-i+1
			res.Start, res.Span = a[i].t, a[j].t-a[i].t
			res.Bound = s.burst(a[i].t) + R[j] - R[i]
		}
		fc := f - s.rate(a[j].t)*a[j].w/2
		res.Certain = max(res.Certain, fc+bestGC)
	}
	i := 0
	for j := range a {
		for a[j].t-a[i].t > 1 {
			i++
		}
		// Within one second the best start is not always the first; scan
		// the (few) starts in range.
		for k := i; k <= j; k++ {
			bound := s.burst(a[k].t) + R[j] - R[k]
			if e := float64(j-k+1) - bound; e > res.Window1s {
				res.Window1s, res.Count1s, res.Bound1s, res.Span1s = e, j-k+1, bound, a[j].t-a[k].t
			}
		}
	}
	return res
}
