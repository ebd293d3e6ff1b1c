package throttle_test

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// This file checks costs, slots in flight and tiers (buckets and windows)
// against a reference model in plain Go, under random sequences of
// SetLimits, TakeN, Release, Extend, Adjust and clock moves on miniredis
// (its TIME set by the test, its key expiry moved with it).

// slotsRefBucket is a token bucket of the model. owed is what it lacks of
// its burst as of the model's now, in tokens x perUS (whole numbers: a
// take adds cost x perUS, each microsecond refills rate, as the script
// counts, so the model is exact).
type slotsRefBucket struct{ rate, perUS, burst, owed int64 }

// slotsRefWindow is a window of the model: calls counted per sub-window
// of perUS/20, keyed by the sub-window's index (time / sub), with the
// latest instant counted in each.
type slotsRefWindow struct {
	n, perUS, sub int64
	counts        map[int64]int64
	latest        map[int64]int64
}

// add counts c calls at instant at.
func (w *slotsRefWindow) add(at, c int64) {
	i := floorDiv(at, w.sub)
	w.counts[i] += c
	w.latest[i] = max(w.latest[i], at)
}

// floorDiv is the floor of a/b for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// count is what the window holds for a decision at at: the sub-windows
// from the one holding at - per to the one holding at, the first of them
// only while its latest instant is within per of at (so any window of
// length per, whatever its phase, sees at most n).
func (w *slotsRefWindow) count(at int64) int64 {
	var n int64
	first, last := floorDiv(at-w.perUS, w.sub), floorDiv(at, w.sub)
	for i, c := range w.counts {
		if i > first && i <= last || i == first && w.latest[i] > at-w.perUS {
			n += c
		}
	}
	return n
}

// wait is how long until the window has room for c more calls (0: now),
// counting only what it holds now: its calls leave a sub-window at a time,
// at the sub-window's latest instant + per.
func (w *slotsRefWindow) wait(now, c int64) int64 {
	if w.count(now)+c <= w.n {
		return 0
	}
	var leaves []int64
	for i, n := range w.counts {
		if at := w.latest[i] + w.perUS; n > 0 && at > now {
			leaves = append(leaves, at)
		}
	}
	slices.Sort(leaves)
	for _, at := range leaves {
		if w.count(at)+c <= w.n {
			return at - now
		}
	}
	return 0 // unreachable while c <= n
}

// slotsRefTier is one rate tier, in the order SetLimits was given them
// (without the InFlight limit), as Decision.Tier numbers them.
type slotsRefTier struct {
	window bool
	perUS  int64
}

// slotsRefModel is the reference: buckets, windows, and the slots in flight
// as the sorted set of holders scored by the end of their lease. Holders
// whose lease ended are swept by the next decision on a key with an
// InFlight limit; Extend does not renew them (a lease that ended is over).
// The set itself expires a whole number of
// milliseconds after the last decision or renewal that saw a holder.
type slotsRefModel struct {
	now      int64
	tiers    []slotsRefTier
	buckets  map[int64]*slotsRefBucket
	windows  map[int64]*slotsRefWindow
	inflight int64
	lease    int64 // us a slot is held without renewal
	leaseTTL int64 // us the set lives after a touch: lease in whole ms, rounded up
	holders  map[string]int64
	expiry   int64 // when the set expires (us), 0: no set
	gen      int64 // bumped by every setLimits, as the script's generation
}

func newSlotsRefModel(now, lease int64) *slotsRefModel {
	return &slotsRefModel{
		now: now, lease: lease, leaseTTL: (lease + 999) / 1000 * 1000,
		buckets: map[int64]*slotsRefBucket{}, windows: map[int64]*slotsRefWindow{}, holders: map[string]int64{},
	}
}

// advance moves the model's clock forward: buckets refill, the set expires.
func (m *slotsRefModel) advance(now int64) {
	for _, b := range m.buckets {
		b.owed = max(0, b.owed-(now-m.now)*b.rate)
	}
	m.now = now
	if m.expiry != 0 && now >= m.expiry {
		clear(m.holders)
		m.expiry = 0
	}
}

// setLimits: each new tier takes over the state of the old tier of its
// kind and period (a bucket's tokens clamped to the new burst, a window's
// calls); new ones start full or empty; the slots held stay held.
func (m *slotsRefModel) setLimits(limits []throttle.Limit) {
	buckets, windows := map[int64]*slotsRefBucket{}, map[int64]*slotsRefWindow{}
	m.tiers, m.inflight = nil, 0
	m.gen++
	for _, l := range limits {
		per := l.Per.Microseconds()
		switch l.Kind {
		case throttle.KindInFlight:
			m.inflight = int64(l.N)
		case throttle.KindWindow:
			w := &slotsRefWindow{n: int64(l.N), perUS: per, sub: per / 20, counts: map[int64]int64{}, latest: map[int64]int64{}}
			if old := m.windows[per]; old != nil {
				w.counts, w.latest = old.counts, old.latest
			}
			windows[per] = w
			m.tiers = append(m.tiers, slotsRefTier{window: true, perUS: per})
		default:
			burst := int64(l.Burst)
			if burst == 0 {
				burst = int64(l.N)
			}
			b := &slotsRefBucket{rate: int64(l.N), perUS: per, burst: burst}
			if old := m.buckets[per]; old != nil {
				b.owed = max(0, old.owed-(old.burst-burst)*per)
			}
			buckets[per] = b
			m.tiers = append(m.tiers, slotsRefTier{perUS: per})
		}
	}
	m.buckets, m.windows = buckets, windows
}

// slotsRefDecision is what the model decides for one TakeN.
type slotsRefDecision struct {
	tooHigh   bool
	allowed   bool
	reason    throttle.Reason
	tier      int   // refusing tier (RefusedByTier)
	retryUS   int64 // RefusedByTier: exact
	remaining int64
	heldAt    int64 // holders counted by the decision (InFlight only)
}

// take decides a call of cost c at the model's now; an admitted call on a
// key with an InFlight limit holds the slot named hold.
func (m *slotsRefModel) take(c int64, hold func() string) slotsRefDecision {
	var d slotsRefDecision
	if m.inflight > 0 {
		for h, end := range m.holders {
			if end < m.now {
				delete(m.holders, h)
			}
		}
		d.heldAt = int64(len(m.holders))
	}
	defer func() {
		if len(m.holders) == 0 {
			m.expiry = 0
		} else if m.inflight > 0 {
			m.expiry = m.now + m.leaseTTL
		}
	}()
	for _, t := range m.tiers {
		if (!t.window && c > m.buckets[t.perUS].burst) || (t.window && c > m.windows[t.perUS].n) {
			d.tooHigh = true
			return d
		}
	}
	for i, t := range m.tiers {
		var w int64
		if t.window {
			w = m.windows[t.perUS].wait(m.now, c)
		} else {
			b := m.buckets[t.perUS]
			if need := b.owed - (b.burst-c)*b.perUS; need > 0 {
				w = (need + b.rate - 1) / b.rate
			}
		}
		if w > d.retryUS {
			d.tier, d.retryUS = i+1, w
		}
	}
	switch {
	case d.tier != 0:
		d.reason = throttle.RefusedByTier
		return d
	case m.inflight > 0 && d.heldAt >= m.inflight:
		d.reason = throttle.RefusedBySlots
		return d
	}
	d.allowed = true
	remaining := new(big.Rat).SetInt64(1 << 62)
	for _, t := range m.tiers {
		var left *big.Rat
		if t.window {
			w := m.windows[t.perUS]
			w.add(m.now, c)
			left = new(big.Rat).SetInt64(w.n - w.count(m.now))
		} else {
			b := m.buckets[t.perUS]
			b.owed += c * b.perUS
			left = big.NewRat(b.burst*b.perUS-b.owed, b.perUS)
		}
		if left.Cmp(remaining) < 0 {
			remaining = left
		}
	}
	d.remaining = max(0, new(big.Int).Div(remaining.Num(), remaining.Denom()).Int64())
	if m.inflight > 0 {
		m.holders[hold()] = m.now + m.lease
	}
	return d
}

// surcharge takes delta more calls' worth of every tier as of now.
func (m *slotsRefModel) surcharge(delta int64) {
	for _, b := range m.buckets {
		b.owed += delta * b.perUS
	}
	for _, w := range m.windows {
		w.add(m.now, delta)
	}
}

// refund gives back r units of call c, only under the limits it was
// admitted under: a bucket what is left of the call's own debit after the
// refill since it; a window from the sub-window the call was counted in.
func (m *slotsRefModel) refund(r int64, c *takenCall) {
	if c.gen != m.gen {
		return
	}
	for _, b := range m.buckets {
		if back := min(r, c.left)*b.perUS - max(0, m.now-c.at)*b.rate; back > 0 {
			b.owed = max(0, b.owed-back)
		}
	}
	for _, w := range m.windows {
		i := floorDiv(c.at, w.sub)
		w.counts[i] -= min(w.counts[i], r)
	}
}

// takenCall is an admission, for refunds: its decision, instant and what
// of its cost was not refunded yet, and its place in each bound log.
type takenCall struct {
	d    throttle.Decision
	at   int64
	left int64
	gen  int64 // the model's generation of limits when it was admitted
	idx  map[*boundLog]int
}

// extend renews the holders whose lease has not ended (one ending this
// microsecond still counts); it returns how many moved.
func (m *slotsRefModel) extend(holds []string) int {
	n := 0
	for _, h := range holds {
		if end, ok := m.holders[h]; ok && end >= m.now && m.now+m.lease > end {
			m.holders[h] = m.now + m.lease
			n++
		}
	}
	if len(m.holders) > 0 {
		m.expiry = m.now + m.leaseTTL
	}
	return n
}

func (m *slotsRefModel) release(holds []string) {
	for _, h := range holds {
		delete(m.holders, h)
	}
	if len(m.holders) == 0 {
		m.expiry = 0
	}
}

// inFlight is what Inspect counts: holders whose lease has not ended (as
// decide counts them: one ending this microsecond still holds its slot).
func (m *slotsRefModel) inFlight() int {
	if m.inflight == 0 {
		return 0
	}
	n := 0
	for _, end := range m.holders {
		if end >= m.now {
			n++
		}
	}
	return n
}

// boundLog checks the bound on what a tier admitted, independently of the
// model: within one configuration of a bucket, the units taken net (calls'
// costs, charges, less refunds) in any span that ends with an admission
// never exceed burst + rate x span; for a window, never more than n in the
// period that ends with an admission. A refund counts as asked for: one
// capped (a bucket never holds more than its burst, a window never counts
// below zero) gave back less, so the tier really let through more than the
// sum, and the sum is still bounded.
type boundLog struct {
	rate, perUS, burst int64 // a bucket
	n                  int64 // a window
	window             bool
	at, units          []int64
}

func (b *boundLog) add(at, units int64) {
	b.at = append(b.at, at)
	b.units = append(b.units, units)
}

// check is called right after an admission was added.
func (b *boundLog) check(t *rapid.T, call string) {
	j := len(b.at) - 1
	var sum int64
	for i := j; i >= 0; i-- {
		if b.window && b.at[i] <= b.at[j]-b.perUS {
			break
		}
		sum += b.units[i]
		if b.window {
			require.LessOrEqual(t, sum, b.n, "%s: %d units in the last %v of a window of %d", call, sum, time.Duration(b.perUS)*time.Microsecond, b.n)
			continue
		}
		span := b.at[j] - b.at[i]
		require.LessOrEqual(t, sum*b.perUS, b.burst*b.perUS+b.rate*span,
			"%s: %d units in %v under %d per %v burst %d", call, sum, time.Duration(span)*time.Microsecond, b.rate, time.Duration(b.perUS)*time.Microsecond, b.burst)
	}
}

var (
	slotsBucketPers = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute}
	slotsWindowPers = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second}
	// Slot leases with a fraction of a millisecond: the set of holders
	// expires on whole milliseconds, so it always outlives its leases.
	slotsLeases = []time.Duration{1_000_300 * time.Microsecond, 2_000_500 * time.Microsecond}
)

// drawSlotLimits draws 1 or 2 buckets, maybe a window, maybe an InFlight
// limit, in a random order.
func drawSlotLimits(t *rapid.T, label string) []throttle.Limit {
	nb := rapid.IntRange(1, 2).Draw(t, label+"Buckets")
	pers := rapid.SliceOfNDistinct(rapid.SampledFrom(slotsBucketPers), nb, nb, rapid.ID[time.Duration]).Draw(t, label+"Pers")
	var limits []throttle.Limit
	for i, per := range pers {
		l := throttle.Limit{
			N:     rapid.IntRange(1, 10).Draw(t, fmt.Sprintf("%sRate%d", label, i+1)),
			Per:   per,
			Burst: rapid.IntRange(0, 8).Draw(t, fmt.Sprintf("%sBurst%d", label, i+1)),
		}
		if rapid.Bool().Draw(t, fmt.Sprintf("%sGenerous%d", label, i+1)) {
			// Rarely short: the slots are what refuses.
			l = throttle.Limit{N: rapid.IntRange(20, 60).Draw(t, fmt.Sprintf("%sLargeRate%d", label, i+1)), Per: per}
		}
		limits = append(limits, l)
	}
	if rapid.Bool().Draw(t, label+"HasWindow") {
		limits = append(limits, throttle.Window(rapid.IntRange(1, 10).Draw(t, label+"WindowN"),
			rapid.SampledFrom(slotsWindowPers).Draw(t, label+"WindowPer")))
	}
	if rapid.Bool().Draw(t, label+"HasInFlight") {
		at := rapid.IntRange(0, len(limits)).Draw(t, label+"InFlightAt")
		limits = slices.Insert(limits, at, throttle.InFlight(rapid.IntRange(1, 3).Draw(t, label+"InFlight")))
	}
	return limits
}

// TestPropertySlotsCostsAndTiersMatchTheModel drives TakeN (with costs), Release, Extend,
// Adjust, SetLimits and the clock at random, on the real scripts and on the
// reference model, and checks every decision against the model; that a
// slot is admitted only while fewer than n holders' leases last; that
// every bucket admits at most burst + rate x span units and every window n
// per period; and what Inspect reports.
func TestPropertySlotsCostsAndTiersMatchTheModel(t *testing.T) {
	env := newPropEnv(t)
	ctx := context.Background()
	rapid.Check(t, func(t *rapid.T) {
		env.mr.FlushAll()
		lease := rapid.SampledFrom(slotsLeases).Draw(t, "lease")
		lim := throttle.NewLimiter(env.rdb, throttle.WithSlotExpiry(lease))
		start := epoch().UnixMicro()
		env.mr.SetTime(time.UnixMicro(start))
		m := newSlotsRefModel(start, lease.Microseconds())

		logs := map[string]*boundLog{} // by tier kind and period
		var limits []throttle.Limit
		setLimits := func(t *rapid.T, label string) {
			limits = drawSlotLimits(t, label)
			require.NoError(t, lim.SetLimits(ctx, "k", limits...), "SetLimits(%v)", limits)
			m.setLimits(limits)
			next := map[string]*boundLog{}
			for _, l := range limits {
				per := l.Per.Microseconds()
				switch l.Kind {
				case throttle.KindWindow:
					id := fmt.Sprintf("w%d", per)
					if old := logs[id]; old != nil {
						old.n = int64(l.N) // a window keeps its calls
						next[id] = old
					} else {
						next[id] = &boundLog{window: true, perUS: per, n: int64(l.N)}
					}
				case throttle.KindBucket:
					b := m.buckets[per]
					id := fmt.Sprintf("b%d", per)
					if old := logs[id]; old != nil && old.rate == b.rate && old.burst == b.burst {
						next[id] = old
					} else {
						next[id] = &boundLog{rate: b.rate, perUS: per, burst: b.burst}
					}
				}
			}
			logs = next
		}
		setLimits(t, "initial")

		var holds, stale []string // slots taken and not released; released or lost
		var calls []*takenCall    // admissions, for refunds
		since := func() time.Duration { return time.Duration(m.now-start) * time.Microsecond }
		setNow := func(us int64) {
			d := time.Duration(us-m.now) * time.Microsecond
			env.mr.SetTime(time.UnixMicro(us))
			env.mr.FastForward(d) // key expiry moves with TIME
			m.advance(us)
		}
		// pick draws one or two slots, held ones mostly, sometimes one
		// already given back or lost.
		pick := func(t *rapid.T, label string) []string {
			pool := holds
			if len(pool) == 0 || rapid.IntRange(0, 3).Draw(t, label+"Stale") == 0 {
				pool = append(slices.Clone(holds), stale...)
			}
			if len(pool) == 0 {
				return nil
			}
			n := rapid.IntRange(1, min(2, len(pool))).Draw(t, label+"N")
			var out []string
			for range n {
				out = append(out, rapid.SampledFrom(pool).Draw(t, label))
			}
			return out
		}
		forget := func(hs []string) {
			for _, h := range hs {
				if i := slices.Index(holds, h); i >= 0 {
					holds = slices.Delete(holds, i, i+1)
					stale = append(stale, h)
				}
			}
		}
		// lost forgets the holders the model no longer has (their lease
		// ended and a decision swept them, or the set expired).
		lost := func() {
			for _, h := range slices.Clone(holds) {
				if _, ok := m.holders[h]; !ok {
					forget([]string{h})
				}
			}
		}

		// take runs one TakeN of a random cost: mostly 1 to 3 within what
		// every tier can hold, sometimes up to 2 more than the smallest
		// tier can ever hold (ErrCostTooHigh).
		take := func(t *rapid.T) {
			most := int64(1 << 30)
			for _, b := range m.buckets {
				most = min(most, b.burst)
			}
			for _, w := range m.windows {
				most = min(most, w.n)
			}
			cost := rapid.IntRange(1, int(min(3, most))).Draw(t, "cost")
			if rapid.IntRange(0, 7).Draw(t, "large") == 0 {
				cost = rapid.IntRange(1, int(most)+2).Draw(t, "largeCost")
			}
			call := fmt.Sprintf("TakeN(%d) at epoch+%v under %v", cost, since(), limits)
			got, err := lim.Take(ctx, "k", throttle.Cost(cost))
			want := m.take(int64(cost), func() string { return got.Slot })
			defer lost()
			if want.tooHigh {
				require.ErrorIs(t, err, throttle.ErrCostTooHigh, "%s: a cost above a tier's burst", call)
				return
			}
			require.NoError(t, err, call)
			require.Equal(t, want.allowed, got.Allowed, "%s: Allowed (model %+v, script %+v)", call, want, got)
			if !got.Allowed {
				require.Equal(t, want.reason, got.Reason, "%s: Reason (model %+v, script %+v)", call, want, got)
				require.Empty(t, got.Slot, "%s: a refusal holds no slot", call)
				if want.reason == throttle.RefusedByTier {
					require.Equal(t, want.tier, got.Tier, "%s: Tier (model %+v, script %+v)", call, want, got)
					require.Equal(t, want.retryUS, got.RetryAfter.Microseconds(), "%s: RetryAfter (model %+v, script %+v)", call, want, got)
				} else {
					require.GreaterOrEqual(t, got.RetryAfter, time.Millisecond, "%s: RetryAfter of a slot refusal", call)
				}
				return
			}
			require.Equal(t, want.remaining, int64(got.Remaining), "%s: Remaining (model %+v, script %+v)", call, want, got)
			if m.inflight > 0 {
				require.NotEmpty(t, got.Slot, "%s: an admission under InFlight holds a slot", call)
				require.Less(t, want.heldAt, m.inflight, "%s: admitted with %d slots held of %d", call, want.heldAt, m.inflight)
				require.NotContains(t, holds, got.Slot, "%s: a slot name already held", call)
				holds = append(holds, got.Slot)
			} else {
				require.Empty(t, got.Slot, "%s: no InFlight limit, no slot", call)
			}
			c := &takenCall{d: got, at: m.now, left: int64(cost), gen: m.gen, idx: map[*boundLog]int{}}
			for _, l := range logs {
				l.add(m.now, int64(cost))
				l.check(t, call)
				c.idx[l] = len(l.at) - 1
			}
			calls = append(calls, c)
		}

		t.Repeat(map[string]func(*rapid.T){
			"take": take,
			"takeSome": func(t *rapid.T) {
				for n := rapid.IntRange(2, 3).Draw(t, "takes"); n > 0; n-- {
					take(t)
				}
			},
			"release": func(t *rapid.T) {
				hs := pick(t, "release")
				if hs == nil {
					t.Skip("no slot to release")
				}
				require.NoError(t, lim.Release(ctx, "k", hs...), "Release(%v)", hs)
				m.release(hs)
				forget(hs)
			},
			"extend": func(t *rapid.T) {
				hs := pick(t, "extend")
				if hs == nil {
					t.Skip("no slot to renew")
				}
				n, err := throttle.Extend(lim, ctx, "k", hs...)
				require.NoError(t, err, "Extend(%v)", hs)
				require.Equal(t, m.extend(hs), n, "Extend(%v) at epoch+%v: renewed", hs, since())
			},
			"adjust": func(t *rapid.T) {
				// A surcharge, or a refund of what a call did not use (as
				// Used settles it: never more than the call cost).
				delta := int64(rapid.IntRange(-4, 4).Draw(t, "delta"))
				if delta < 0 && len(calls) > 0 && rapid.Bool().Draw(t, "ofACall") {
					c := rapid.SampledFrom(calls).Draw(t, "call")
					delta = -min(-delta, c.left)
					require.NoError(t, throttle.AdjustCall(lim, ctx, "k", int(delta), c.d, int(c.left)), "refund %d of a call at epoch+%v", -delta, time.Duration(c.at-start)*time.Microsecond)
					m.refund(-delta, c)
					c.left += delta
					for l, i := range c.idx {
						l.units[i] += delta // the call's real cost, at its instant
					}
					return
				}
				require.NoError(t, throttle.Surcharge(lim, ctx, "k", int(delta)), "Adjust(%d)", delta)
				if delta > 0 {
					m.surcharge(delta)
					for _, l := range logs {
						l.add(m.now, delta)
					}
				}
			},
			"advance": func(t *rapid.T) {
				setNow(m.now + drawStep(t, "advance"))
				lost()
			},
			"leaseEnd": func(t *rapid.T) {
				// To the end of a holder's lease, a moment before or after.
				var ends []int64
				for _, end := range m.holders {
					if end >= m.now+1 {
						ends = append(ends, end)
					}
				}
				if len(ends) == 0 {
					t.Skip("no lease ahead")
				}
				slices.Sort(ends)
				end := rapid.SampledFrom(ends).Draw(t, "end")
				off := rapid.SampledFrom([]int64{-1, 0, 1, 1000}).Draw(t, "offset")
				setNow(max(m.now, end+off))
				lost()
			},
			"setLimits": func(t *rapid.T) { setLimits(t, "new") },
			"inspect": func(t *rapid.T) {
				st, err := lim.Inspect(ctx, "k")
				require.NoError(t, err, "Inspect")
				call := fmt.Sprintf("Inspect at epoch+%v under %v", since(), limits)
				require.Equal(t, m.inFlight(), st.InFlight, "%s: InFlight", call)
				wantTiers := len(m.tiers)
				if m.inflight > 0 {
					wantTiers++
				}
				require.Len(t, st.Tokens, wantTiers, "%s: tokens per tier", call)
				for i, tier := range m.tiers {
					var want float64
					if tier.window {
						w := m.windows[tier.perUS]
						want = float64(max(0, w.n-w.count(m.now))) // (none admitted now, never negative)
					} else {
						b := m.buckets[tier.perUS]
						want = float64(b.burst) - float64(b.owed)/float64(b.perUS)
					}
					assert.InDelta(t, want, st.Tokens[i], 1e-6, "%s: tokens of tier %d", call, i+1)
				}
				if m.inflight > 0 {
					assert.Equal(t, throttle.InFlight(int(m.inflight)), st.Limits[len(st.Limits)-1], "%s: the InFlight limit", call)
				}
			},
		})
	})
}
