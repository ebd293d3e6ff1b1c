package throttle_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// This file checks quotas in several units (issue 24): a decision takes
// every unit of a call from every tier of that unit, all or nothing, and a
// settlement (Used) moves its unit alone, so that per unit what was taken
// less what was refunded is what was used.
//
// TestPropertyUnitsMatchTheModel drives Take with random Uses and
// settlements on miniredis (its TIME set by the test, its key expiry moved
// with it, as the other property tests) and checks every decision and,
// after every step, every tier's tokens against a reference model in plain
// Go. TestUnitsAtomicUnderConcurrentWorkers runs 16 workers on a real
// redis-server and on a 3-master Cluster and checks the totals exactly.

// unitsMaxSkewUS is lib.lua's MAX_SKEW: after the clock stepped back more
// than this, a bucket is read as owing at least its burst (no freeze).
const unitsMaxSkewUS = 3600 * 1_000_000

// unitsMaxDebt is lib.lua's MAX_BURST: a bucket owing more than its burst
// plus this many calls is garbage, read as owing its burst.
const unitsMaxDebt = 1_000_000_000

// unitsRefTier is one rate tier of the model, in the order SetLimits was
// given them (as Decision.Tier and Status.Tokens number them).
type unitsRefTier struct {
	limit throttle.Limit
	kind  throttle.Kind
	unit  string // "" for requests
	perUS int64
	// A bucket: stored is what it owed (tokens x perUS, a whole number: a
	// take adds cost x perUS, each microsecond refills rate) as of the
	// model's ts, when the buckets were last written.
	rate, burst, stored int64
	// A window: calls per sub-window (perUS/20 for a sliding window, the
	// aligned window itself for a fixed one), keyed by the sub-window's
	// index (time / sub), with the latest instant counted in each.
	n, sub         int64
	counts, latest map[int64]int64
	// A bucket of a key with units: what it owed at least in each of its
	// intervals (lib.lua's M), oldest first: each one's start and least
	// (math.MaxInt64 when nothing was sampled in it).
	hasM          bool
	starts, least []int64
}

// lib.lua's M_KEEP, M_SLICE and M_SLICES.
const (
	unitsKeepUS   = 60_000_000
	unitsSliceUS  = 50_000
	unitsMaxSlice = 12
)

// sample records that bucket t owes v at now, before any change at now
// (sample_M), in its latest interval; a decision (open) then opens another
// at now when the latest is unitsSliceUS old, drops those that ended
// unitsKeepUS ago, and merges the two neighbours whose union is shortest
// for its age when there are more than unitsMaxSlice. A bucket without M
// starts it.
func (t *unitsRefTier) sample(v, now int64, open bool) {
	v = max(v, 0)
	if !t.hasM {
		t.hasM, t.starts, t.least = true, []int64{now}, []int64{math.MaxInt64}
		return
	}
	n := len(t.starts)
	t.least[n-1] = min(t.least[n-1], v)
	if !open || now-t.starts[n-1] < unitsSliceUS {
		return
	}
	t.starts, t.least = append(t.starts, now), append(t.least, v)
	for len(t.starts) >= 2 && t.starts[1] <= now-unitsKeepUS {
		t.starts, t.least = t.starts[1:], t.least[1:]
	}
	if len(t.starts) > unitsMaxSlice {
		best, at := math.Inf(1), 0
		for j := 0; j+1 < len(t.starts); j++ {
			ends := now
			if j+2 < len(t.starts) {
				ends = t.starts[j+2]
			}
			if r := float64(ends-t.starts[j]) / float64(now-t.starts[j]); r < best {
				best, at = r, j
			}
		}
		t.least[at] = min(t.least[at], t.least[at+1])
		t.starts = append(t.starts[:at+1:at+1], t.starts[at+2:]...)
		t.least = append(t.least[:at+1:at+1], t.least[at+2:]...)
	}
}

// room is what bucket t may give back of a call admitted at at beyond
// the refill rule (refund_room): the least it owed in the intervals from
// the one holding at to now, and now.
func (t *unitsRefTier) room(at, owedNow int64) int64 {
	if !t.hasM || at < t.starts[0] {
		return 0
	}
	least := owedNow
	for j := len(t.starts) - 1; j >= 0; j-- {
		least = min(least, t.least[j])
		if t.starts[j] <= at {
			break
		}
	}
	return max(0, least)
}

// given lowers the least owed of the intervals from the one holding at to
// now by what a refund of a call admitted at at gave back, and records
// what the bucket owes after it in the latest (refund_given).
func (t *unitsRefTier) given(at, given, owedNow int64) {
	if given > 0 {
		for j := len(t.starts) - 1; j >= 0; j-- {
			if t.least[j] != math.MaxInt64 {
				t.least[j] = max(0, t.least[j]-given)
			}
			if t.starts[j] <= at {
				break
			}
		}
	}
	n := len(t.starts)
	t.least[n-1] = min(t.least[n-1], max(0, owedNow))
}

func (t *unitsRefTier) window() bool { return t.kind != throttle.KindBucket }

// most is the largest cost the tier can ever admit.
func (t *unitsRefTier) most() int64 {
	if t.window() {
		return t.n
	}
	return t.burst
}

// add counts c calls at instant at.
func (t *unitsRefTier) add(at, c int64) {
	i := floorDiv(at, t.sub)
	t.counts[i] += c
	t.latest[i] = max(t.latest[i], at)
}

// count is what a window holds for a decision at at. A fixed window: its
// aligned window's calls. A sliding one: the sub-windows from the one
// holding at - per to the one holding at, the first of them only while its
// latest instant is within per of at.
func (t *unitsRefTier) count(at int64) int64 {
	if t.kind == throttle.KindFixedWindow {
		return t.counts[floorDiv(at, t.perUS)]
	}
	var n int64
	first, last := floorDiv(at-t.perUS, t.sub), floorDiv(at, t.sub)
	for i, c := range t.counts {
		if i > first && i <= last || i == first && t.latest[i] > at-t.perUS {
			n += c
		}
	}
	return n
}

// windowWait is how long until a window has room for c more calls (0:
// now). A fixed window's next window is empty (the clock only moves
// forward); a sliding window's calls leave a sub-window at a time, at its
// latest instant + per.
func (t *unitsRefTier) windowWait(now, c int64) int64 {
	if t.count(now)+c <= t.n {
		return 0
	}
	if t.kind == throttle.KindFixedWindow {
		return (floorDiv(now, t.perUS)+1)*t.perUS - now
	}
	var leaves []int64
	for i, n := range t.counts {
		if at := t.latest[i] + t.perUS; n > 0 && at > now {
			leaves = append(leaves, at)
		}
	}
	slices.Sort(leaves)
	for _, at := range leaves {
		if t.count(at)+c <= t.n {
			return at - now
		}
	}
	return 0 // unreachable while c <= n
}

// unitsRefModel is the reference: each tier counts its own unit, and a
// task takes from a tier what it uses of the tier's unit (its Cost, 1
// without one, for requests; 0 for a unit it does not say).
type unitsRefModel struct {
	now, ts int64
	tiers   []*unitsRefTier
	units   bool // a tier counts another unit than requests: buckets keep M
}

func newUnitsRefModel(now int64, limits []throttle.Limit) *unitsRefModel {
	m := &unitsRefModel{now: now}
	for _, l := range limits {
		per := l.Per.Microseconds()
		t := &unitsRefTier{limit: l, kind: l.Kind, unit: l.Unit, perUS: per}
		switch l.Kind {
		case throttle.KindBucket:
			t.rate, t.burst = int64(l.N), int64(l.Burst)
			if t.burst == 0 {
				t.burst = t.rate
			}
		case throttle.KindWindow, throttle.KindFixedWindow:
			t.n, t.sub = int64(l.N), per/20
			if l.Kind == throttle.KindFixedWindow {
				t.sub = per
			}
			t.counts, t.latest = map[int64]int64{}, map[int64]int64{}
		}
		m.tiers = append(m.tiers, t)
		m.units = m.units || l.Unit != ""
	}
	return m
}

// owed is what bucket t owes as the scripts read it at the model's now:
// what it stored less the refill since, never below nothing; a debt (a
// surcharge's) is kept however large, up to garbage; after a step back of
// the clock beyond an hour, at least its burst.
func (m *unitsRefModel) owed(t *unitsRefTier) int64 {
	full := t.burst * t.perUS
	switch {
	case t.stored > full+unitsMaxDebt*t.perUS:
		return full
	case m.now-m.ts < -unitsMaxSkewUS:
		return max(t.stored, full)
	}
	return max(t.stored-(m.now-m.ts)*t.rate, 0)
}

// writeBuckets stores every bucket as read now, owed[i] for those given: a
// decision that admits and a settlement write every bucket of the key.
func (m *unitsRefModel) writeBuckets(owed map[*unitsRefTier]int64) {
	for _, t := range m.tiers {
		if t.window() {
			continue
		}
		v, ok := owed[t]
		if !ok {
			v = m.owed(t)
		}
		t.stored = v
	}
	m.ts = m.now
}

// unitsCost is what a call takes of each unit, by the model's unit name
// ("" for requests).
type unitsCost map[string]int64

type unitsRefDecision struct {
	tooHigh   bool
	allowed   bool
	tier      int   // the refusing tier, 1-based
	retryUS   int64 // exact
	remaining int64
}

// take decides a call of cost c at the model's now: refused for good when
// a tier's share of it is above what the tier can ever hold; admitted when
// every tier with a positive share has room for it, taking every share at
// once; otherwise refused by the tier that makes it wait longest (the
// first of equals), changing nothing.
func (m *unitsRefModel) take(c unitsCost) unitsRefDecision {
	var d unitsRefDecision
	for _, t := range m.tiers {
		if c[t.unit] > t.most() {
			d.tooHigh = true
			return d
		}
	}
	for i, t := range m.tiers {
		ci := c[t.unit]
		if ci == 0 {
			continue // a call that uses none of the tier's unit
		}
		var w int64
		if t.window() {
			w = t.windowWait(m.now, ci)
		} else if need := m.owed(t) - (t.burst-ci)*t.perUS; need > 0 {
			w = (need + t.rate - 1) / t.rate
		}
		if w > d.retryUS {
			d.tier, d.retryUS = i+1, w
		}
	}
	if d.tier != 0 {
		return d
	}
	d.allowed = true
	if m.units {
		for _, t := range m.tiers {
			if !t.window() && t.unit != "" {
				t.sample(m.owed(t), m.now, true)
			}
		}
	}
	remaining := new(big.Rat).SetInt64(1 << 62)
	owed := map[*unitsRefTier]int64{}
	for _, t := range m.tiers {
		ci := c[t.unit]
		var left *big.Rat
		if t.window() {
			if ci > 0 {
				t.add(m.now, ci)
			}
			left = new(big.Rat).SetInt64(t.n - t.count(m.now))
		} else {
			v := m.owed(t) + ci*t.perUS
			owed[t] = v
			left = big.NewRat(t.burst*t.perUS-v, t.perUS)
		}
		if left.Cmp(remaining) < 0 {
			remaining = left
		}
	}
	m.writeBuckets(owed)
	q := new(big.Int).Div(remaining.Num(), remaining.Denom()) // floor
	d.remaining = max(0, q.Int64())
	return d
}

// unitsCall is an admitted call: its decision and instant, and what it
// was charged of each unit so far (by the name Used takes).
type unitsCall struct {
	d       throttle.Decision
	at      int64
	charged map[string]int64
}

// settle settles unit (the model's name) of call c by delta: a surcharge
// is taken as of now by every tier of the unit (a bucket into debt, a
// window over its n); a refund gives a bucket back what is left of the
// call's own debit after the refill since it, and a window what it can
// from the sub-window the call was counted in while that is still loaded.
// Every bucket of the key is written, whatever its unit.
func (m *unitsRefModel) settle(unit string, delta int64, c *unitsCall, charged int64) {
	if delta == 0 {
		return // the script changes nothing
	}
	owed := map[*unitsRefTier]int64{}
	for _, t := range m.tiers {
		if t.unit != unit {
			continue
		}
		if !t.window() {
			v := m.owed(t)
			if m.units && t.hasM {
				t.sample(v, m.now, false)
			}
			var given int64
			if delta > 0 {
				v += delta * t.perUS
			} else {
				want := min(-delta, charged) * t.perUS
				back := want - max(0, m.now-c.at)*t.rate
				if m.units {
					back = max(back, min(want, t.room(c.at, v)))
				}
				if back > 0 {
					before := max(v, 0)
					v = max(v-back, 0)
					given = before - v
				}
			}
			if m.units && t.hasM {
				t.given(c.at, given, v)
			}
			owed[t] = v
			continue
		}
		if delta > 0 {
			t.add(m.now, delta)
			continue
		}
		i := floorDiv(c.at, t.sub)
		if oldest := floorDiv(m.now-t.perUS, t.sub) - 1; i >= oldest {
			t.counts[i] -= min(t.counts[i], -delta)
		}
	}
	m.writeBuckets(owed)
}

// tokens is what Inspect reports of tier t: a bucket's tokens (negative in
// debt), computed as the script does in floating point; a window's calls
// left, never negative.
func (m *unitsRefModel) tokens(t *unitsRefTier) float64 {
	if t.window() {
		return float64(max(0, t.n-t.count(m.now)))
	}
	return float64(t.burst) - float64(m.owed(t))/float64(t.perUS)
}

var (
	unitsBucketPers = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute}
	unitsWindowPers = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second}
	unitsFixedPers  = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute}
	// The units tiers may count ("" is requests), and the units a task may
	// say it uses: "audio" never has a tier.
	unitsTierUnits = []string{"", "tokens", "images"}
	unitsTaskUnits = []string{"requests", "tokens", "images", "audio"}
)

// modelUnit is the model's name of a unit as Uses and Used take it.
func modelUnit(u string) string {
	if u == "requests" {
		return ""
	}
	return u
}

// drawUnitsLimits draws 1 to 8 rate tiers, each a bucket, a sliding or a
// fixed window in one of up to 3 units, no two of one kind, period and
// unit.
func drawUnitsLimits(t *rapid.T) []throttle.Limit {
	type combo struct {
		kind throttle.Kind
		per  time.Duration
		unit string
	}
	var combos []combo
	for _, u := range unitsTierUnits {
		for _, p := range unitsBucketPers {
			combos = append(combos, combo{throttle.KindBucket, p, u})
		}
		for _, p := range unitsWindowPers {
			combos = append(combos, combo{throttle.KindWindow, p, u})
		}
		for _, p := range unitsFixedPers {
			combos = append(combos, combo{throttle.KindFixedWindow, p, u})
		}
	}
	n := rapid.IntRange(1, throttle.MaxTiers).Draw(t, "tiers")
	picks := rapid.SliceOfNDistinct(rapid.IntRange(0, len(combos)-1), n, n, rapid.ID[int]).Draw(t, "combos")
	limits := make([]throttle.Limit, n)
	for i, k := range picks {
		c := combos[k]
		var l throttle.Limit
		switch c.kind {
		case throttle.KindBucket:
			l = throttle.Limit{
				N:     rapid.IntRange(1, 20).Draw(t, fmt.Sprintf("rate%d", i+1)),
				Per:   c.per,
				Burst: rapid.IntRange(0, 20).Draw(t, fmt.Sprintf("burst%d", i+1)),
			}
		case throttle.KindWindow:
			l = throttle.Window(rapid.IntRange(1, 20).Draw(t, fmt.Sprintf("windowN%d", i+1)), c.per)
		default:
			l = throttle.FixedWindow(rapid.IntRange(1, 20).Draw(t, fmt.Sprintf("fixedN%d", i+1)), c.per)
		}
		limits[i] = l.In(c.unit)
	}
	return limits
}

// drawUses draws what one Take uses: its requests (no option: 1, or
// Cost(n), or Uses("requests", n)) and, for each other unit, nothing, 0 or
// a count, mostly within what every tier of the unit can hold, sometimes
// up to 2 more (ErrCostTooHigh).
func drawUses(t *rapid.T, m *unitsRefModel) ([]asynq.Option, unitsCost, []string) {
	most := func(unit string) int64 {
		v := int64(6)
		for _, tier := range m.tiers {
			if tier.unit == unit {
				v = min(v, tier.most())
			}
		}
		return v
	}
	count := func(unit string, lo int64) int64 {
		hi := most(unit)
		if rapid.IntRange(0, 9).Draw(t, "large"+unit) == 0 {
			return rapid.Int64Range(lo, hi+2).Draw(t, "largeUses"+unit)
		}
		return rapid.Int64Range(lo, max(lo, min(hi, 4))).Draw(t, "uses"+unit)
	}
	cost := unitsCost{"": 1}
	var opts []asynq.Option
	var said []string
	switch rapid.IntRange(0, 2).Draw(t, "requestsAs") {
	case 1:
		cost[""] = count("", 1)
		opts = append(opts, throttle.Cost(int(cost[""])))
		said = append(said, fmt.Sprintf("Cost(%d)", cost[""]))
	case 2:
		cost[""] = count("", 1)
		opts = append(opts, throttle.Uses("requests", int(cost[""])))
		said = append(said, fmt.Sprintf("Uses(requests, %d)", cost[""]))
	}
	for _, u := range unitsTaskUnits[1:] {
		if !rapid.Bool().Draw(t, "says"+u) {
			continue
		}
		n := count(u, 0)
		if rapid.IntRange(0, 4).Draw(t, "zero"+u) == 0 {
			n = 0
		}
		cost[u] = n
		opts = append(opts, throttle.Uses(u, int(n)))
		said = append(said, fmt.Sprintf("Uses(%s, %d)", u, n))
	}
	return opts, cost, said
}

// TestPropertyUnitsMatchTheModel drives Take with random Cost and Uses
// (units with tiers, units without, 0), settlements of admitted calls
// (surcharges and refunds, in any unit) and the clock at random, on the
// real scripts and on the reference model, and checks every decision
// (admitted, refusing tier, retry-after, remaining) and after every step
// what Inspect reports of every tier, which a refused call must leave as
// it was in every unit.
func TestPropertyUnitsMatchTheModel(t *testing.T) {
	// No deadline a loaded machine could miss: a call that timed out
	// after its script ran would part the model from Redis.
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	env := propEnv{mr: mr, rdb: rdb}
	ctx := context.Background()
	rapid.Check(t, func(t *rapid.T) {
		env.mr.FlushAll()
		lim := throttle.NewLimiter(env.rdb, throttle.WithTimeout(time.Minute))
		start := epoch().UnixMicro()
		env.mr.SetTime(time.UnixMicro(start))
		limits := drawUnitsLimits(t)
		require.NoError(t, lim.SetLimits(ctx, "k", limits...), "SetLimits(%v)", limits)
		m := newUnitsRefModel(start, limits)
		var calls []*unitsCall
		var lastRetry int64 // us, of the last refusal

		since := func() time.Duration { return time.Duration(m.now-start) * time.Microsecond }
		setNow := func(us int64) {
			d := time.Duration(us-m.now) * time.Microsecond
			env.mr.SetTime(time.UnixMicro(us))
			env.mr.FastForward(d) // key expiry moves with TIME
			m.now = us
		}
		// check compares every tier's tokens with the model's, exactly.
		check := func(t *rapid.T, after string) {
			st, err := lim.Inspect(ctx, "k")
			require.NoError(t, err, "Inspect after %s", after)
			require.Len(t, st.Tokens, len(m.tiers), "Inspect after %s: tokens per tier under %v", after, limits)
			for i, tier := range m.tiers {
				require.Equal(t, m.tokens(tier), st.Tokens[i], "after %s: tokens of tier %d (%v) under %v (all: %v)",
					after, i+1, tier.limit, limits, st.Tokens)
			}
		}
		take := func(t *rapid.T) {
			opts, cost, said := drawUses(t, m)
			call := fmt.Sprintf("Take(%s) at epoch+%v", strings.Join(said, ", "), since())
			got, err := lim.Take(ctx, "k", opts...)
			want := m.take(cost)
			if want.tooHigh {
				require.ErrorIs(t, err, throttle.ErrCostTooHigh, "%s under %v: a unit above a tier's burst", call, limits)
				check(t, call)
				return
			}
			require.NoError(t, err, call)
			require.Equal(t, want.allowed, got.Allowed, "%s under %v: Allowed (model %+v, script %+v)", call, limits, want, got)
			if got.Allowed {
				require.Equal(t, want.remaining, int64(got.Remaining), "%s under %v: Remaining (model %+v, script %+v)", call, limits, want, got)
				charged := map[string]int64{}
				for _, u := range unitsTaskUnits {
					charged[u] = cost[modelUnit(u)]
				}
				require.Equal(t, m.now, throttle.AdmittedAt(got).UnixMicro(), "%s: admitted at", call)
				calls = append(calls, &unitsCall{d: got, at: m.now, charged: charged})
			} else {
				require.Equal(t, throttle.RefusedByTier, got.Reason, "%s under %v: Reason (model %+v, script %+v)", call, limits, want, got)
				require.Equal(t, want.tier, got.Tier, "%s under %v: Tier (model %+v, script %+v)", call, limits, want, got)
				require.Equal(t, want.retryUS, got.RetryAfter.Microseconds(), "%s under %v: RetryAfter (model %+v, script %+v)", call, limits, want, got)
				lastRetry = want.retryUS
			}
			check(t, call)
		}

		t.Repeat(map[string]func(*rapid.T){
			"take": take,
			"takeSome": func(t *rapid.T) {
				for n := rapid.IntRange(2, 4).Draw(t, "takes"); n > 0; n-- {
					take(t)
				}
			},
			"settle": func(t *rapid.T) {
				if len(calls) == 0 {
					t.Skip("no call admitted")
				}
				c := rapid.SampledFrom(calls).Draw(t, "call")
				unit := rapid.SampledFrom(unitsTaskUnits).Draw(t, "unit")
				charged := c.charged[unit]
				// A refund or a surcharge, as often.
				used := rapid.Int64Range(0, charged).Draw(t, "refundTo")
				if charged == 0 || rapid.Bool().Draw(t, "surcharge") {
					used = rapid.Int64Range(charged, charged+4).Draw(t, "surchargeTo")
				}
				call := fmt.Sprintf("Used(%s, %d) of a call admitted at epoch+%v charged %d, at epoch+%v",
					unit, used, time.Duration(c.at-start)*time.Microsecond, charged, since())
				require.NoError(t, throttle.AdjustUnit(lim, ctx, "k", unit, int(used-charged), c.d, int(charged)), call)
				m.settle(modelUnit(unit), used-charged, c, charged)
				c.charged[unit] = used
				check(t, call)
			},
			"advance": func(t *rapid.T) {
				setNow(m.now + drawStep(t, "advance"))
				check(t, fmt.Sprintf("the clock moved to epoch+%v", since()))
			},
			"takeOverSlices": func(t *rapid.T) {
				// Takes a few of M's intervals apart (lib.lua's M_SLICE),
				// so that buckets open, merge and drop intervals.
				for n := rapid.IntRange(2, 8).Draw(t, "takes"); n > 0; n-- {
					setNow(m.now + rapid.Int64Range(0, 3*unitsSliceUS).Draw(t, "apart"))
					take(t)
				}
			},
			"advanceByRetryAfter": func(t *rapid.T) {
				// To when the last refusal said, a moment before or after.
				off := rapid.SampledFrom([]int64{-1, 0, 0, 1}).Draw(t, "offset")
				setNow(m.now + max(0, lastRetry+off))
				take(t)
			},
		})
	})
}

// unitsMonth is the longest period: tiers that refill about nothing while
// the workers run.
const unitsMonth = 30 * 24 * time.Hour

// unitsFleetLimits is the key of the concurrency test: 6 tiers in 3 units,
// none refilling more than a few millionths of a token while it runs. Two
// buckets large enough never to refuse count every request and token
// taken; the windows refuse (a window over its n after surcharges simply
// admits nothing more); the input-tokens bucket refuses too, and is only
// ever refunded (a surcharge could put a bucket in debt, see
// TestUnitsSurchargeDebtIsKept).
func unitsFleetLimits(windows int) []throttle.Limit {
	reqWindow, tokWindow, tokFixed := 800, 400_000, 360_000
	if windows > 0 {
		reqWindow, tokWindow, tokFixed = windows, windows, windows
	}
	return []throttle.Limit{
		{N: 1, Per: unitsMonth, Burst: 1_000_000},
		throttle.Window(reqWindow, unitsMonth),
		throttle.Limit{N: 1, Per: unitsMonth, Burst: 1_000_000_000}.In("tokens"),
		throttle.Window(tokWindow, unitsMonth).In("tokens"),
		throttle.FixedWindow(tokFixed, unitsMonth).In("tokens"),
		throttle.Limit{N: 1, Per: unitsMonth, Burst: 45_000}.In("input-tokens"),
	}
}

// unitsTally is what the workers admitted: per unit, the sum of what each
// admitted call finally used (its estimate, or what Used said last), and
// how many admitted calls used some of it.
type unitsTally struct {
	mu                sync.Mutex
	used, users       map[string]int64
	admitted, refused int64
	refusedBy         map[string]int64
}

func (a *unitsTally) admit(final map[string]int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.admitted++
	for u, n := range final {
		a.used[u] += n
		if n > 0 {
			a.users[u]++
		}
	}
}

func (a *unitsTally) refuse(by string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refused++
	a.refusedBy[by]++
}

// TestUnitsAtomicUnderConcurrentWorkers runs 16 workers on one key of 3
// units, on a real redis-server and on a 3-master Cluster: each takes
// random Cost and Uses, through Limiter.Take or as a task through the
// middleware, whose handler settles random units with Used (twice, or a
// unit it did not estimate, at times). At the end every tier has taken,
// exactly, what the admitted calls used of its unit: a refused call took
// nothing of any unit, an admitted one all of every unit.
func TestUnitsAtomicUnderConcurrentWorkers(t *testing.T) {
	// Clients that wait as long as it takes: a call that timed out after
	// its script ran would leave the totals unknown.
	const wait = 30 * time.Second
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		runUnitsFleet(t, func() redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: wait, WriteTimeout: wait})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t)
		runUnitsFleet(t, func() redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ReadTimeout: wait, WriteTimeout: wait})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
}

func runUnitsFleet(t *testing.T, client func() redis.UniversalClient) {
	const (
		workers    = 16
		processes  = 4 // limiters, 4 workers each: decisions of one process share script runs
		opsEach    = 200
		runFor     = 4 * time.Second
		key        = "llm"
		widened    = 1_000_000_000
		windowSubs = 20
	)
	ctx := context.Background()
	rdb := client()
	// A refund comes out of the sub-window its call was counted in
	// (1.5 days here): start well clear of a boundary, so that every call
	// of the run is counted in one.
	sub := unitsMonth.Microseconds() / windowSubs
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	if left := time.Duration(sub-now.UnixMicro()%sub) * time.Microsecond; left < 2*runFor {
		t.Logf("waiting %v for the next sub-window", left)
		time.Sleep(left + 100*time.Millisecond)
	}
	limits := unitsFleetLimits(0)
	lims := make([]*throttle.Limiter, processes)
	var failed atomic.Int64
	for i := range lims {
		lims[i] = throttle.NewLimiter(client(), quietLog, throttle.WithTimeout(time.Minute))
		lims[i].OnEvent(func(ev throttle.Event) {
			if ev.Outcome == throttle.Failed || ev.Outcome == throttle.Rejected {
				failed.Add(1)
				t.Errorf("task %s: outcome %v: %v", ev.TaskID, ev.Outcome, ev.Err)
			}
		})
	}
	require.NoError(t, lims[0].SetLimits(ctx, key, limits...))

	tally := &unitsTally{used: map[string]int64{}, users: map[string]int64{}, refusedBy: map[string]int64{}}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	deadline := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for w := range workers {
		lim := lims[w%processes]
		mw := lim.Middleware()
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := 0; i < opsEach && time.Now().Before(deadline) && !t.Failed(); i++ {
				est := map[string]int64{"requests": 1 + rng.Int64N(3)}
				var opts []asynq.Option
				if est["requests"] > 1 || rng.IntN(2) == 0 {
					opts = append(opts, throttle.Cost(int(est["requests"])))
				}
				if rng.IntN(4) != 0 {
					est["tokens"] = rng.Int64N(2001)
					opts = append(opts, throttle.Uses("tokens", int(est["tokens"])))
				}
				if rng.IntN(3) != 0 {
					est["input-tokens"] = rng.Int64N(401)
					opts = append(opts, throttle.Uses("input-tokens", int(est["input-tokens"])))
				}
				if rng.IntN(5) == 0 { // a unit the key has no tier of
					opts = append(opts, throttle.Uses("images", rng.IntN(50)))
				}
				rng.Shuffle(len(opts), func(i, j int) { opts[i], opts[j] = opts[j], opts[i] })

				if rng.IntN(4) == 0 {
					d, err := lim.Take(ctx, key, opts...)
					if err != nil {
						t.Errorf("Take(%v): %v", opts, err)
						return
					}
					if d.Allowed {
						tally.admit(est)
					} else {
						tally.refuse(fmt.Sprintf("tier %d", d.Tier))
					}
					continue
				}

				task, err := throttle.NewTask("llm:call", nil, append([]asynq.Option{throttle.Key(key)}, opts...)...)
				if err != nil {
					t.Errorf("NewTask(%v): %v", opts, err)
					return
				}
				final, ran := map[string]int64{}, false
				for u, n := range est {
					final[u] = n
				}
				h := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
					ran = true
					for k := rng.IntN(4); k > 0; k-- {
						unit := []string{"requests", "tokens", "input-tokens", "images"}[rng.IntN(4)]
						var n int64
						switch unit {
						case "requests":
							n = rng.Int64N(5)
						case "tokens":
							n = rng.Int64N(3001) // estimated or not
						case "input-tokens":
							n = rng.Int64N(final[unit] + 1) // refunds only: that bucket never in debt
						default:
							n = rng.Int64N(100) // no tier: nothing moves
						}
						if err := throttle.Used(ctx, unit, int(n)); err != nil {
							t.Errorf("Used(%s, %d): %v", unit, n, err)
							return err
						}
						if unit != "images" {
							final[unit] = n
						}
					}
					return nil
				})
				err = mw(h).ProcessTask(ctx, task)
				switch {
				case ran:
					tally.admit(final)
				case err == nil:
					tally.refuse("middleware")
				default:
					// A refusal whose deferred copy could not be enqueued:
					// still a refusal.
					tally.refuse("middleware, copy not enqueued")
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "a worker failed")
	require.Zero(t, failed.Load(), "decisions that failed")
	t.Logf("admitted %d, refused %d %v; used %v by %v admitted calls", tally.admitted, tally.refused, tally.refusedBy, tally.used, tally.users)
	require.Positive(t, tally.admitted, "calls admitted")
	require.Positive(t, tally.refused, "calls refused")
	for _, u := range []string{"requests", "tokens", "input-tokens"} {
		require.Positive(t, tally.users[u], "admitted calls that used some %s", u)
	}

	// The buckets: what each took, rounded (refill and the refunds' share
	// of it are below a thousandth of a token).
	st, err := lims[0].Inspect(ctx, key)
	require.NoError(t, err)
	require.Len(t, st.Tokens, len(limits))
	taken := func(i int, tokens float64) int64 {
		l := limits[i]
		v := float64(l.Burst) - tokens
		if l.Kind != throttle.KindBucket {
			v = widened - tokens
		}
		r := math.Round(v)
		require.InDelta(t, r, v, 1e-3, "tier %d (%v): %v taken, not a whole number", i+1, l, v)
		return int64(r)
	}
	unitOf := func(l throttle.Limit) string {
		if l.Unit == "" {
			return "requests"
		}
		return l.Unit
	}
	for i, l := range limits {
		if l.Kind != throttle.KindBucket {
			// Inspect shows a window's calls left, never below 0: before
			// it is widened, what it shows; widened, what it counts.
			want := float64(max(0, int64(l.N)-tally.used[unitOf(l)]))
			assert.Equal(t, want, st.Tokens[i], "tier %d (%v): calls left", i+1, l)
			continue
		}
		assert.Equal(t, tally.used[unitOf(l)], taken(i, st.Tokens[i]),
			"tier %d (%v): taken less refunded, against what the %d admitted calls used of %s", i+1, l, tally.admitted, unitOf(l))
	}
	// Each window widened keeps its calls (SetLimits keeps a tier of one
	// kind, period and unit): its calls left now tell its count.
	require.NoError(t, lims[0].SetLimits(ctx, key, unitsFleetLimits(widened)...))
	st, err = lims[0].Inspect(ctx, key)
	require.NoError(t, err)
	for i, l := range limits {
		if l.Kind != throttle.KindBucket {
			assert.Equal(t, tally.used[unitOf(l)], taken(i, st.Tokens[i]),
				"tier %d (%v): counted less refunded, against what the %d admitted calls used of %s", i+1, l, tally.admitted, unitOf(l))
		}
	}
}

// Bugs the tests above found (fixed; these keep them fixed).

// A call that takes nothing of a key whose tiers are all full buckets (a
// task that says nothing of tokens, or Uses 0, on a key of a tokens tier
// alone) is admitted. (Regression: the script's fast path had no bucket
// state to write and failed the call: HSET of false.)
func TestUnitsTakeOfNothingOnFullBuckets(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "tpm", throttle.PerMinute(30000).In("tokens")))
	for _, opts := range [][]asynq.Option{nil, {throttle.Uses("tokens", 0)}, {throttle.Uses("images", 5)}} {
		d, err := lim.Take(ctx, "tpm", opts...)
		if !assert.NoError(t, err, "Take(%v) of nothing of a full tokens bucket", opts) {
			continue
		}
		assert.True(t, d.Allowed, "Take(%v): nothing to take, nothing to refuse", opts)
	}
	ran := false
	err := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil })).
		ProcessTask(ctx, newTask(t, "call", nil, throttle.Key("tpm")))
	require.NoError(t, err)
	assert.True(t, ran, "a task that uses no tokens runs on a key of tokens")
}

// A surcharge puts a bucket in debt, which must be repaid before it admits
// again (docs/guarantees.md), however large. (Regression: every script read
// a bucket owing more than its burst plus an hour of refill as owing its
// burst, a guard against clock steps that forgave real debt: an hour of
// refill is 60 times a per-minute quota but 1/24 of a per-day one. On 1,000
// tokens a day, a call estimated at 900 that used 1,500 left the bucket at
// 0 tokens, not -500, and the next call of 100 tokens waited 2h24m instead
// of 14h24m.)
func TestUnitsSurchargeDebtIsKept(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "tpd", throttle.Limit{N: 1000, Per: 24 * time.Hour}.In("tokens")))
	err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Used(ctx, "tokens", 1500)
	})).ProcessTask(ctx, newTask(t, "call", nil, throttle.Key("tpd"), throttle.Uses("tokens", 900)))
	require.NoError(t, err)
	st, err := lim.Inspect(ctx, "tpd")
	require.NoError(t, err)
	assert.InDelta(t, -500, st.Tokens[0], 0.01, "1,500 tokens used of 1,000: 500 owed")
	d, err := lim.Take(ctx, "tpd", throttle.Uses("tokens", 100))
	require.NoError(t, err)
	require.False(t, d.Allowed)
	assert.InDelta(t, (14*time.Hour + 24*time.Minute).Seconds(), d.RetryAfter.Seconds(), 1, "600 tokens at 1,000 a day")
}
