package throttle_test

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// refTier is one limit of the reference model, in microseconds.
type refTier struct{ rate, perUS, burst int64 }

func refTiers(limits []throttle.Limit) []refTier {
	out := make([]refTier, len(limits))
	for i, l := range limits {
		b := l.Burst
		if b == 0 {
			b = l.N
		}
		out[i] = refTier{rate: int64(l.N), perUS: l.Per.Microseconds(), burst: int64(b)}
	}
	return out
}

// refModel is a pure-Go reference of the limiter without reservations: token
// buckets in exact rational arithmetic, all-or-nothing takes, suspension, and
// SetLimits carrying each tier's tokens to the new tier with the same period,
// clamped to its burst. Time is integer microseconds of the Redis clock; a
// clock that steps back takes tokens away (what a tier owes is counted from
// the time it will be full again), never adds any; a tier that was full
// stays full.
type refModel struct {
	tiers    []refTier
	hasState bool // a bucket was written (an allowed take left a tier short)
	ts       int64
	tokens   []*big.Rat
	until    int64 // suspended until; 0 = never suspended
	maxSusp  int64
}

// refill returns the tokens of each tier at now: the stored tokens plus what
// the time since (negative when the clock stepped back) refilled, at most
// the burst.
func (m *refModel) refill(tiers []refTier, now int64) []*big.Rat {
	out := make([]*big.Rat, len(tiers))
	for i, t := range tiers {
		burst := new(big.Rat).SetInt64(t.burst)
		v := burst
		// A tier full when the state was written stays full: it is not
		// stored, and a step back of the clock finds nothing to take away.
		if m.hasState && i < len(m.tokens) && m.tokens[i].Cmp(burst) < 0 {
			v = new(big.Rat).Add(m.tokens[i], big.NewRat((now-m.ts)*t.rate, t.perUS))
			if v.Cmp(burst) > 0 {
				v = burst
			}
		}
		out[i] = v
	}
	return out
}

type refDecision struct {
	allowed   bool
	retryUS   int64 // exact wait rounded up
	reason    throttle.Reason
	tier      int
	tierClear bool // the refusing tier's wait beats every other tier's by more than 1 us
	remaining int64
}

func ceilRat(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func (m *refModel) take(now int64) refDecision {
	tokens := m.refill(m.tiers, now)
	one := big.NewRat(1, 1)
	waits := make([]*big.Rat, len(m.tiers)) // nil: the tier has a token
	short, wait := 0, new(big.Rat)
	for i, t := range m.tiers {
		w := new(big.Rat).Sub(one, tokens[i])
		w.Mul(w, big.NewRat(t.perUS, t.rate))
		if w.Sign() <= 0 {
			continue
		}
		waits[i] = w
		if w.Cmp(wait) > 0 {
			short, wait = i+1, w
		}
	}
	suspended := m.until > now
	if !suspended && short == 0 {
		remaining := new(big.Rat).SetInt64(1 << 62)
		for i := range tokens {
			tokens[i] = new(big.Rat).Sub(tokens[i], one)
			if tokens[i].Cmp(remaining) < 0 {
				remaining = tokens[i]
			}
		}
		m.tokens, m.ts, m.hasState = tokens, now, true
		q := new(big.Int).Div(remaining.Num(), remaining.Denom()) // floor for remaining >= 0
		return refDecision{allowed: true, remaining: q.Int64()}
	}
	d := refDecision{reason: throttle.RefusedByTier, tier: short, retryUS: ceilRat(wait), tierClear: true}
	// Waits within a microsecond of each other (exact ties included) may
	// come out in either order in floating point.
	for i, w := range waits {
		if w != nil && i+1 != short && new(big.Rat).Sub(wait, w).Cmp(big.NewRat(1, 1)) <= 0 {
			d.tierClear = false
		}
	}
	if suspended {
		d.reason = throttle.RefusedBySuspension
		if left := m.until - now; left > d.retryUS {
			d.retryUS = left
		}
	}
	return d
}

// setLimits gives each new tier the tokens of the old tier with the same
// period (clamped to the new burst); a tier with a new period starts full.
// A full bucket holds the old burst: raising the burst grants no more.
func (m *refModel) setLimits(tiers []refTier, now int64) {
	tokens := m.refill(m.tiers, now)
	kept := make([]*big.Rat, len(tiers))
	for i, t := range tiers {
		burst := new(big.Rat).SetInt64(t.burst)
		v := burst
		for j, old := range m.tiers {
			if old.perUS == t.perUS && tokens[j].Cmp(burst) < 0 {
				v = tokens[j]
			}
		}
		kept[i] = v
	}
	m.tokens, m.ts, m.hasState = kept, now, true
	m.tiers = tiers
}

func (m *refModel) suspend(d, now int64) {
	d = min(d, m.maxSusp)
	m.until = max(m.until, now+d)
}

// propEnv is one miniredis shared by every run of a property (each run starts
// with FLUSHALL), because starting a server per run would dominate.
type propEnv struct {
	mr  *miniredis.Miniredis
	rdb *redis.Client
}

func newPropEnv(t *testing.T) propEnv {
	t.Helper()
	mr := miniredis.RunT(t)
	// Timeouts far beyond any call's: a loaded machine must not turn a slow
	// reply into an error the models do not expect.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	return propEnv{mr: mr, rdb: rdb}
}

var (
	propPers  = []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, time.Second, 2 * time.Second, 10 * time.Second, time.Minute}
	propSteps = []int64{1_000, 1_000_000, 10_000_000} // upper bounds of a clock step, us
)

// drawLimits draws one or two tiers with distinct periods (a tier is
// identified by its period).
func drawLimits(t *rapid.T, label string) []throttle.Limit {
	n := rapid.IntRange(1, 2).Draw(t, label+"Tiers")
	pers := rapid.SliceOfNDistinct(rapid.SampledFrom(propPers), n, n, rapid.ID[time.Duration]).Draw(t, label+"Pers")
	limits := make([]throttle.Limit, n)
	for i := range limits {
		limits[i] = throttle.Limit{
			N:     rapid.IntRange(1, 20).Draw(t, fmt.Sprintf("%sRate%d", label, i+1)),
			Per:   pers[i],
			Burst: rapid.IntRange(0, 10).Draw(t, fmt.Sprintf("%sBurst%d", label, i+1)),
		}
	}
	return limits
}

func drawStep(t *rapid.T, label string) int64 {
	hi := rapid.SampledFrom(propSteps).Draw(t, label+"Scale")
	return rapid.Int64Range(0, hi).Draw(t, label)
}

// TestPropertyScriptsMatchTheReferenceModel drives the real scripts and the reference
// model with the same random operations and compares every decision.
func TestPropertyScriptsMatchTheReferenceModel(t *testing.T) {
	env := newPropEnv(t)
	ctx := context.Background()
	const maxSusp = 10 * time.Second
	rapid.Check(t, func(t *rapid.T) {
		env.mr.FlushAll()
		lim := throttle.NewLimiter(env.rdb, throttle.WithMaxSuspension(maxSusp))
		now := epoch().UnixMicro()
		env.mr.SetTime(time.UnixMicro(now))
		var lastRetry time.Duration

		limits := drawLimits(t, "initial")
		require.NoError(t, lim.SetLimits(ctx, "k", limits...), "SetLimits(%v)", limits)
		m := &refModel{tiers: refTiers(limits), maxSusp: maxSusp.Microseconds()}

		setNow := func(us int64) {
			now = us
			env.mr.SetTime(time.UnixMicro(now))
		}
		take := func(t *rapid.T) {
			got, err := lim.Take(ctx, "k")
			require.NoError(t, err, "Take at %dus", now)
			want := m.take(now)
			call := fmt.Sprintf("Take at epoch+%dus under %v", now-epoch().UnixMicro(), limits)
			require.Equal(t, want.allowed, got.Allowed, "%s: Allowed (model %+v, script %+v)", call, want, got)
			if got.Allowed {
				assert.InDelta(t, want.remaining, got.Remaining, 1, "%s: Remaining", call)
				return
			}
			lastRetry = got.RetryAfter
			require.Equal(t, want.reason, got.Reason, "%s: Reason (model %+v, script %+v)", call, want, got)
			require.Equal(t, want.retryUS, got.RetryAfter.Microseconds(), "%s: RetryAfter us (model %+v, script %+v)", call, want, got)
			if want.reason == throttle.RefusedByTier && want.tierClear {
				require.Equal(t, want.tier, got.Tier, "%s: Tier (model %+v, script %+v)", call, want, got)
			}
		}

		t.Repeat(map[string]func(*rapid.T){
			"take": take,
			"takeSome": func(t *rapid.T) {
				for n := rapid.IntRange(2, 5).Draw(t, "takes"); n > 0; n-- {
					take(t)
				}
			},
			"advance": func(t *rapid.T) { setNow(now + drawStep(t, "advance")) },
			"advanceByRetryAfter": func(t *rapid.T) {
				setNow(now + lastRetry.Microseconds())
				take(t)
			},
			"stepBack": func(t *rapid.T) { setNow(now - rapid.Int64Range(1, 2_000_000).Draw(t, "back")) },
			"setLimits": func(t *rapid.T) {
				limits = drawLimits(t, "new")
				require.NoError(t, lim.SetLimits(ctx, "k", limits...), "SetLimits(%v)", limits)
				m.setLimits(refTiers(limits), now)
			},
			"suspend": func(t *rapid.T) {
				d := time.Duration(rapid.Int64Range(1, 2*maxSusp.Microseconds()).Draw(t, "suspend")) * time.Microsecond
				require.NoError(t, lim.Suspend(ctx, "k", d), "Suspend(%v)", d)
				m.suspend(d.Microseconds(), now)
			},
			"resume": func(t *rapid.T) {
				require.NoError(t, resumed(lim.Resume(ctx, "k")), "Resume")
				m.until = 0
			},
			"inspect": func(t *rapid.T) {
				s, err := lim.Inspect(ctx, "k")
				require.NoError(t, err, "Inspect")
				want := m.refill(m.tiers, now)
				require.Len(t, s.Tokens, len(want), "Inspect tokens under %v", limits)
				for i, w := range want {
					f, _ := w.Float64()
					assert.InDelta(t, f, s.Tokens[i], 1e-6, "Inspect tier %d tokens under %v", i+1, limits)
				}
				wantSusp := time.Duration(max(0, m.until-now)) * time.Microsecond
				assert.Equal(t, wantSusp, s.SuspendedFor, "Inspect suspended")
			},
		})
	})
}

// Limits whose intervals are whole microseconds, so reservation slots are
// exact and the checks below need no rounding slack.
var (
	resvPers   = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute}
	resvRates  = []int{1, 2, 4, 5, 8, 10, 16, 20, 25}
	resvBursts = []int{1, 2, 4, 5, 8, 10}
)

// TestPropertyReservationsKeepTheirInvariants checks the reservation invariants under random
// Take / Reserve / clock traffic: admissions never exceed burst + rate*t in
// any window of any tier; slots are issued in order, spaced, within the
// horizon; fresh callers wait behind outstanding slots; a holder back early
// is told exactly how long to wait; a holder back exactly at its slot, first
// in line, is admitted as long as no holder before it came back late.
func TestPropertyReservationsKeepTheirInvariants(t *testing.T) {
	env := newPropEnv(t)
	ctx := context.Background()
	rapid.Check(t, func(t *rapid.T) {
		env.mr.FlushAll()
		lim := throttle.NewLimiter(env.rdb)
		start := epoch()
		now := start
		env.mr.SetTime(now)

		n := rapid.IntRange(1, 2).Draw(t, "tiers")
		pers := rapid.SliceOfNDistinct(rapid.SampledFrom(resvPers), n, n, rapid.ID[time.Duration]).Draw(t, "pers")
		limits := make([]throttle.Limit, n)
		for i := range limits {
			limits[i] = throttle.Limit{
				N:     rapid.SampledFrom(resvRates).Draw(t, fmt.Sprintf("rate%d", i+1)),
				Per:   pers[i],
				Burst: rapid.SampledFrom(resvBursts).Draw(t, fmt.Sprintf("burst%d", i+1)),
			}
		}
		require.NoError(t, lim.SetLimits(ctx, "k", limits...), "SetLimits(%v)", limits)
		horizon := rapid.SampledFrom([]time.Duration{2 * time.Second, 10 * time.Second, time.Minute}).Draw(t, "horizon")
		granule := rapid.SampledFrom([]time.Duration{0, time.Second}).Draw(t, "granule")

		held := map[string]time.Time{} // id -> reserved slot
		var lastSlot time.Time         // the latest slot issued
		var admitted []time.Time
		// onSchedule: no holder took its token after its slot. A late holder
		// takes a token the schedule gave to the next one, so only while
		// onSchedule is a holder back at its slot sure to find a token.
		onSchedule := true

		admit := func(t *rapid.T, call string) {
			admitted = append(admitted, now)
			j := len(admitted) - 1
			for _, l := range limits {
				for i := 0; i <= j; i++ {
					elapsed := admitted[j].Sub(admitted[i])
					bound := float64(l.Burst) + float64(l.N)*elapsed.Seconds()/l.Per.Seconds()
					require.LessOrEqual(t, float64(j-i+1), bound+1e-9,
						"%s: %d admitted in %v under %v (burst + rate*t = %g)", call, j-i+1, elapsed, l, bound)
				}
			}
		}
		lapse := func() {
			for id, s := range held {
				if now.Sub(s) > throttle.DefaultLapse {
					delete(held, id)
				}
			}
		}
		reserve := func(t *rapid.T, id string, mustAdmit bool) {
			lapse()
			call := fmt.Sprintf("Reserve(%s) at epoch+%v under %v, horizon %v, granule %v", id, now.Sub(start), limits, horizon, granule)
			d, err := throttle.Reserve(lim, ctx, "k", id, horizon, granule)
			require.NoError(t, err, call)
			slot, holds := held[id]
			if mustAdmit {
				require.True(t, d.Allowed, "%s: holder first in line at its slot: %+v", call, d)
			}
			// Within one granule of its slot a holder is decided by the
			// buckets alone (a worker clock slightly behind Redis).
			if holds && now.Before(slot.Add(-granule)) {
				require.False(t, d.Allowed, "%s: admitted before its slot %v: %+v", call, slot.Sub(start), d)
				require.Equal(t, throttle.RefusedReserved, d.Reason, "%s: Reason (%+v)", call, d)
				require.Equal(t, slot.Sub(now), d.RetryAfter, "%s: RetryAfter = slot - now (%+v)", call, d)
				return
			}
			if d.Allowed {
				if holds && !now.Equal(slot) {
					onSchedule = false // it took a token at another time than planned
				}
				delete(held, id)
				admit(t, call)
				return
			}
			require.Positive(t, d.RetryAfter, "%s: RetryAfter of a refusal (%+v)", call, d)
			if !throttle.Reserved(d) {
				delete(held, id)
				return
			}
			require.LessOrEqual(t, throttle.ReservedAt(d).Sub(now), horizon, "%s: slot beyond the horizon (%+v)", call, d)
			require.Equal(t, throttle.ReservedAt(d).Sub(now), d.RetryAfter, "%s: RetryAfter = Slot - now (%+v)", call, d)
			if holds && throttle.ReservedAt(d).Equal(slot) {
				return // told its existing slot again
			}
			if !lastSlot.IsZero() {
				require.False(t, throttle.ReservedAt(d).Before(lastSlot),
					"%s: new slot %v before the last issued %v", call, throttle.ReservedAt(d).Sub(start), lastSlot.Sub(start))
			}
			if granule > 0 {
				require.Zero(t, throttle.ReservedAt(d).UnixMicro()%granule.Microseconds(), "%s: slot %v off the granule", call, throttle.ReservedAt(d).Sub(start))
			}
			lastSlot = throttle.ReservedAt(d)
			held[id] = throttle.ReservedAt(d)
		}
		ids := []string{"a", "b", "c", "d", "e", "f"}
		setNow := func(at time.Time) {
			now = at
			env.mr.SetTime(now)
		}

		t.Repeat(map[string]func(*rapid.T){
			"reserve": func(t *rapid.T) { reserve(t, rapid.SampledFrom(ids).Draw(t, "id"), false) },
			"take": func(t *rapid.T) {
				call := fmt.Sprintf("Take at epoch+%v under %v", now.Sub(start), limits)
				d, err := lim.Take(ctx, "k")
				require.NoError(t, err, call)
				if d.Allowed {
					for id, s := range held {
						require.False(t, s.After(now), "%s: admitted while %s holds the slot %v", call, id, s.Sub(start))
					}
					admit(t, call)
				}
			},
			"advance": func(t *rapid.T) {
				setNow(now.Add(time.Duration(drawStep(t, "advance")) * time.Microsecond))
			},
			"firstHolderAtSlot": func(t *rapid.T) {
				var first string
				for id, s := range held {
					if first == "" || s.Before(held[first]) {
						first = id
					}
				}
				if first == "" || held[first].Before(now) {
					t.Skip("no holder whose slot is ahead")
				}
				setNow(held[first])
				reserve(t, first, onSchedule)
			},
		})
	})
}
