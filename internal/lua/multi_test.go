package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// Tests of the decision across several keys (multi.lua, issue 30). Most run
// twice: on a real redis-server (the function library, FCALL) and on
// miniredis (EVAL, a clock the test sets). On the real one the clock moves:
// those tests use limits slow enough (per hour) that the milliseconds a
// test takes change nothing they assert.

// hour is a period long enough that nothing refills while a test runs.
const hour = int64(3_600_000)

// multiKeys are the keys of limiter keys names, as keyspace derives them.
func multiKeys(names ...string) []Keys {
	ks := make([]Keys, len(names))
	for i, n := range names {
		b := "t:{" + n + "}:"
		ks[i] = Keys{Bucket: b + "b", Reservations: b + "r", Slots: b + "f", Tenants: b + "a", Tags: b + "t", Config: b + "c"}
	}
	return ks
}

type multiEnv struct {
	t   *testing.T
	ctx context.Context
	rdb *redis.Client
	run *Runner
	mr  *miniredis.Miniredis // nil on a real Redis
	ks  []Keys               // keys "a", "b", "c"
}

// onBoth runs f on miniredis and on a real redis-server.
func onBoth(t *testing.T, f func(t *testing.T, e *multiEnv)) {
	t.Run("miniredis", func(t *testing.T) { f(t, newMultiEnv(t, false)) })
	t.Run("redis", func(t *testing.T) {
		redistest.Require(t)
		f(t, newMultiEnv(t, true))
	})
}

func newMultiEnv(t *testing.T, real bool) *multiEnv {
	t.Helper()
	e := &multiEnv{t: t, ctx: context.Background(), ks: multiKeys("a", "b", "c")}
	if real {
		e.rdb = redistest.Start(t).Client(t)
	} else {
		e.mr = miniredis.RunT(t)
		e.mr.SetTime(testEpoch())
		e.rdb = redis.NewClient(&redis.Options{Addr: e.mr.Addr()})
		t.Cleanup(func() { _ = e.rdb.Close() })
	}
	e.run = NewRunner(e.rdb)
	return e
}

func (e *multiEnv) limits(i int, tiers ...Tier) {
	e.t.Helper()
	r, err := SetLimits(e.ctx, e.run, e.ks[i], tiers, nil)
	require.NoError(e.t, err, "SetLimits(%d, %+v)", i, tiers)
	require.Empty(e.t, r.Field, "SetLimits(%d, %+v): reason %q", i, tiers, r.Reason)
}

// multi decides a over keys at positions idx (none: a and b).
func (e *multiEnv) multi(a DecideArgs, idx ...int) MultiReply {
	e.t.Helper()
	if len(idx) == 0 {
		idx = []int{0, 1}
	}
	ks := make([]Keys, len(idx))
	for j, i := range idx {
		ks[j] = e.ks[i]
	}
	r, err := DecideMulti(e.ctx, e.run, ks, a)
	require.NoError(e.t, err, "DecideMulti(%+v)", a)
	return r
}

// one decides a on key i alone (the one-key script).
func (e *multiEnv) one(i int, a DecideArgs) DecideReply {
	e.t.Helper()
	r, err := Decide(e.ctx, e.run, e.ks[i], a)
	require.NoError(e.t, err, "Decide(%d, %+v)", i, a)
	return r
}

// admits counts how many one-key calls key i admits now (at most max).
func (e *multiEnv) admits(i, max int) int {
	e.t.Helper()
	for n := range max + 1 {
		if e.one(i, DecideArgs{}).Status != StatusAllowed {
			return n
		}
	}
	return max + 1
}

// reserved is task id's reserved instant in key i, booked in its schedule
// or held (0: none).
func (e *multiEnv) reserved(i int, id string) int64 {
	e.t.Helper()
	if at := e.booked(i, id); at != 0 {
		return at
	}
	return e.booked(i, "~"+id)
}

// booked is member m's score in key i's reservations (0: none).
func (e *multiEnv) booked(i int, m string) int64 {
	e.t.Helper()
	v, err := e.rdb.ZScore(e.ctx, e.ks[i].Reservations, m).Result()
	if err == redis.Nil {
		return 0
	}
	require.NoError(e.t, err)
	return int64(v)
}

func (e *multiEnv) at(d time.Duration) {
	require.NotNil(e.t, e.mr, "only miniredis's clock is the test's")
	e.mr.SetTime(testEpoch().Add(d))
}

func bucket(rate, perMS, burst int64) Tier { return Tier{Rate: rate, PerMS: perMS, Burst: burst} }

// The one-key script and the library load together: the function library
// on a real Redis holds both functions, and the multi-key one runs there.
func TestMultiRunsAsAFunctionOfTheLibrary(t *testing.T) {
	redistest.Require(t)
	e := newMultiEnv(t, true)
	e.limits(0, bucket(5, hour, 5))
	e.limits(1, bucket(5, hour, 5))
	r := e.multi(DecideArgs{})
	require.Equal(t, StatusAllowed, r.Status, "%+v", r)
	assert.Equal(t, ModeFunction, e.run.Mode(), "a real Redis 7 runs the library's functions")
	assert.Equal(t, -1, r.Key)
	assert.Equal(t, int64(4), r.Remaining)
}

// All or nothing: key b refuses, so key a's tokens are untouched (no
// counter pollution), and the reply names b and its tier.
func TestMultiTakesFromNoKeyWhenOneRefuses(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(10, hour, 10))
		e.limits(1, bucket(100, 1000, 100), bucket(2, hour, 2))
		for i := range 2 {
			r := e.multi(DecideArgs{})
			require.Equal(t, StatusAllowed, r.Status, "call %d: %+v", i, r)
			require.Len(t, r.Keys, 2)
			assert.Equal(t, StatusAllowed, r.Keys[0].Status)
			assert.Equal(t, StatusAllowed, r.Keys[1].Status)
		}
		for i := range 5 {
			r := e.multi(DecideArgs{})
			require.Equal(t, StatusDenied, r.Status, "call %d after b's quota: %+v", i, r)
			assert.Equal(t, 1, r.Key, "b (position 1) refused")
			assert.Equal(t, "tier:2", r.RefusedBy, "b's hourly tier refused")
			assert.Equal(t, "", r.Keys[0].RefusedBy, "a admitted")
			assert.Equal(t, "tier:2", r.Keys[1].RefusedBy)
		}
		assert.Equal(t, 8, e.admits(0, 10), "a gave two calls, to the two admitted; none to the five refused")
	})
}

// The same with b's limit a window, and a's an in-flight limit: a refused
// call holds no slot of a.
func TestMultiWindowOnTheSecondKeyTakesNothingFromTheFirst(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(10, hour, 10), Tier{Kind: KindInFlight, Rate: 20})
		e.limits(1, Tier{Kind: KindWindow, Rate: 1, PerMS: 60_000}) // (a window of an hour: slow to refuse in gopher-lua)
		r := e.multi(DecideArgs{TaskID: "x", SlotExpiry: time.Minute})
		require.Equal(t, StatusAllowed, r.Status, "%+v", r)
		require.NotEmpty(t, r.Keys[0].Slot, "a slot of a is held")
		r = e.multi(DecideArgs{TaskID: "y", SlotExpiry: time.Minute})
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		assert.Equal(t, 1, r.Key)
		assert.Equal(t, "tier:1", r.RefusedBy)
		n, err := e.rdb.ZCard(e.ctx, e.ks[0].Slots).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "a holds the admitted call's slot only")
		assert.Equal(t, 9, e.admits(0, 10), "a's bucket gave one call")
	})
}

// Units: b counts tokens, and refuses the call a's requests would admit.
func TestMultiUnitsOnTheSecondKey(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(10, hour, 10))
		e.limits(1, Tier{Rate: 100, PerMS: hour, Burst: 100, Unit: "tokens"})
		a := DecideArgs{Units: "tokens=60"}
		r := e.multi(a)
		require.Equal(t, StatusAllowed, r.Status, "%+v", r)
		assert.Equal(t, int64(40), r.Keys[1].Remaining, "b: 100 tokens less 60")
		assert.Equal(t, int64(9), r.Keys[0].Remaining, "a: one request")
		r = e.multi(a)
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		assert.Equal(t, 1, r.Key)
		r = e.multi(DecideArgs{Units: "tokens=40"})
		assert.Equal(t, StatusAllowed, r.Status, "40 tokens fit: %+v", r)
		assert.Equal(t, 8, e.admits(0, 10), "a gave two calls, none to the refused one")
	})
}

// A cost above what one key can ever hold is refused for good, naming
// the key and the tier.
func TestMultiCostTooHighNamesTheKey(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(10, hour, 10))
		e.limits(1, bucket(3, hour, 3))
		r := e.multi(DecideArgs{Cost: 5})
		assert.Equal(t, StatusCostTooHigh, r.Status, "%+v", r)
		assert.Equal(t, 1, r.Key)
		assert.Equal(t, "1", r.Field, "b's first tier")
		assert.Equal(t, 10, e.admits(0, 10), "a untouched")
	})
}

// A suspension of any key refuses, until the latest suspension's end.
func TestMultiLatestSuspensionWins(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		for i := range 3 {
			e.limits(i, bucket(10, hour, 10))
		}
		_, err := Suspend(e.ctx, e.run, e.ks[0], 3*time.Second, time.Hour)
		require.NoError(t, err)
		_, err = Suspend(e.ctx, e.run, e.ks[2], 10*time.Second, time.Hour)
		require.NoError(t, err)
		r := e.multi(DecideArgs{}, 0, 1, 2)
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		assert.Equal(t, 2, r.Key, "c's suspension ends last")
		assert.Equal(t, "suspended", r.RefusedBy)
		assert.InDelta(t, 10*time.Second, r.RetryAfter, float64(time.Second), "until c's end")
		assert.Equal(t, "suspended", r.Keys[0].RefusedBy)
		assert.Equal(t, "", r.Keys[1].RefusedBy)
		for i := range 3 {
			assert.Equal(t, r.RetryAfter, r.Keys[i].RetryAfter, "one retry for every key")
		}
		// With a reservation: one instant, after the latest end, in every key.
		r = e.multi(DecideArgs{TaskID: "t", Horizon: time.Minute, Lapse: time.Minute}, 0, 1, 2)
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		require.False(t, r.Reserved.IsZero(), "reserved: %+v", r)
		for i := range 3 {
			assert.Equal(t, r.Reserved.UnixMicro(), e.reserved(i, "t"), "key %d holds the instant", i)
		}
		assert.Equal(t, 10, e.admits(1, 10), "b untouched")
	})
}

// A caller refused reserves one instant that every key admits, held in
// every key: the latest of each key's earliest, spaced by the slower key.
func TestMultiReservesOneInstantInEveryKey(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(4, hour, 1)) // one per 900 s
		e.limits(1, bucket(1, hour, 1)) // one per 3600 s
		e.limits(2, bucket(2, hour, 2)) // one per 1800 s, two at once
		a := func(id string) DecideArgs {
			return DecideArgs{TaskID: id, Horizon: 24 * time.Hour, Lapse: time.Hour}
		}
		r := e.multi(a("t0"), 0, 1, 2)
		require.Equal(t, StatusAllowed, r.Status, "%+v", r)
		var prev int64
		for i := 1; i <= 4; i++ {
			id := fmt.Sprintf("t%d", i)
			r := e.multi(a(id), 0, 1, 2)
			require.Equal(t, StatusDenied, r.Status, "%s: %+v", id, r)
			at := r.Reserved.UnixMicro()
			require.NotZero(t, at, "%s reserved", id)
			for k := range 3 {
				assert.Equal(t, at, e.reserved(k, id), "%s: key %d holds the same instant", id, k)
				assert.Equal(t, r.Reserved, r.Keys[k].Reserved)
			}
			if prev != 0 {
				assert.InDelta(t, 3600e6, at-prev, 1e3, "%s: spaced by b's interval, the slowest", id)
			}
			assert.Equal(t, 1, r.Key, "b makes it wait: %+v", r)
			prev = at
		}
		// A one-key caller of a is not held behind the booking across keys
		// beyond a's own schedule: a's queue holds the four bookings.
		one := e.one(0, DecideArgs{TaskID: "solo", Horizon: 24 * time.Hour, Lapse: time.Hour})
		require.Equal(t, StatusDenied, one.Status)
	})
}

// The holder comes back at its instant and is admitted by every key; its
// reservation leaves every key; a fresh caller then is refused.
func TestMultiHolderAdmittedAtItsInstant(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(1, 1000, 1))
	e.limits(1, bucket(1, 2000, 1))
	a := DecideArgs{TaskID: "h", Horizon: time.Minute, Lapse: time.Minute}
	require.Equal(t, StatusAllowed, e.multi(DecideArgs{TaskID: "first"}).Status)
	r := e.multi(a)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	assert.Equal(t, testEpoch().Add(2*time.Second), r.Reserved, "b's next token")
	assert.Equal(t, 1, r.Key)

	e.at(time.Second)
	early := e.multi(a)
	assert.Equal(t, StatusDenied, early.Status, "before its instant: %+v", early)
	assert.Equal(t, "reserved", early.RefusedBy)
	assert.Equal(t, r.Reserved, early.Reserved, "keeps its instant")
	fresh := e.multi(DecideArgs{TaskID: "f", Horizon: time.Minute, Lapse: time.Minute})
	require.Equal(t, StatusDenied, fresh.Status, "a fresh caller queues behind it")
	assert.Equal(t, testEpoch().Add(4*time.Second), fresh.Reserved, "the next instant b admits")

	e.at(2 * time.Second)
	got := e.multi(a)
	require.Equal(t, StatusAllowed, got.Status, "at its instant: %+v", got)
	assert.Equal(t, testEpoch().Add(2*time.Second), got.At)
	assert.Zero(t, e.reserved(0, "h"), "reservation left a")
	assert.Zero(t, e.reserved(1, "h"), "reservation left b")
	late := e.multi(DecideArgs{})
	assert.Equal(t, StatusDenied, late.Status, "the holder took the instant's tokens: %+v", late)

	e.at(4 * time.Second)
	got = e.multi(DecideArgs{TaskID: "f", Horizon: time.Minute, Lapse: time.Minute})
	assert.Equal(t, StatusAllowed, got.Status, "the second holder at its instant: %+v", got)
}

// Slots: each key's slot is held on admission, and released on each key
// they free there; a refused call holds none.
func TestMultiSlotsHeldAndReleasedOnEveryKey(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(100, hour, 100), Tier{Kind: KindInFlight, Rate: 1})
		e.limits(1, bucket(100, hour, 100), Tier{Kind: KindInFlight, Rate: 2})
		a := DecideArgs{TaskID: "s1", SlotExpiry: time.Minute}
		r := e.multi(a)
		require.Equal(t, StatusAllowed, r.Status, "%+v", r)
		require.NotEmpty(t, r.Keys[0].Slot)
		require.NotEmpty(t, r.Keys[1].Slot)
		r2 := e.multi(DecideArgs{TaskID: "s2", SlotExpiry: time.Minute})
		require.Equal(t, StatusDenied, r2.Status, "a's one slot is held: %+v", r2)
		assert.Equal(t, 0, r2.Key)
		assert.Equal(t, "inflight", r2.RefusedBy)
		n, err := e.rdb.ZCard(e.ctx, e.ks[1].Slots).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "b holds no slot for the refused call")
		for k := range 2 {
			got, err := Release(e.ctx, e.run, e.ks[k], r.Keys[k].Slot)
			require.NoError(t, err)
			assert.Equal(t, int64(1), got, "key %d's slot released", k)
		}
		r2 = e.multi(DecideArgs{TaskID: "s2", SlotExpiry: time.Minute})
		assert.Equal(t, StatusAllowed, r2.Status, "free again: %+v", r2)
	})
}

// A key without limits limits nothing; bad limits on a key are its error.
func TestMultiKeyWithoutLimitsLimitsNothing(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(1, bucket(1, hour, 1))
		r := e.multi(DecideArgs{})
		require.Equal(t, StatusAllowed, r.Status, "%+v", r)
		assert.Equal(t, StatusNoLimits, r.Keys[0].Status)
		r = e.multi(DecideArgs{})
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		assert.Equal(t, 1, r.Key)
		r = e.multi(DecideArgs{}, 0, 2)
		assert.Equal(t, StatusNoLimits, r.Status, "no key has limits: %+v", r)
	})
}

// The bound per key, over a run of many calls at random instants: tasks
// of a and b together, of b and c, and of a alone (the one-key script)
// arrive, are refused, and come back when told, until each runs. Every key
// admits no more than its burst + rate x elapsed between any two of its
// admissions, a task refused as a whole was taken from no key, and every
// task runs in the end (liveness).
func TestMultiBoundPerKeyOverManyCalls(t *testing.T) {
	seeds := uint64(4)
	if raceOn {
		seeds = 2 // (see race_on_test.go)
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			e := newMultiEnv(t, false)
			rng := rand.New(rand.NewPCG(seed, 30))
			tiers := [][]Tier{
				{bucket(10, 1000, 5)},
				{bucket(4, 1000, 2), Tier{Kind: KindWindow, Rate: 30, PerMS: 10_000}},
				{bucket(6, 1000, 6), Tier{Rate: 50, PerMS: 1000, Burst: 60, Unit: "tokens"}},
			}
			for i, ts := range tiers {
				e.limits(i, ts...)
			}
			rates := []float64{10, 4, 6} // per s: the buckets' (b's window allows 3/s)
			bursts := []float64{5, 2, 6}
			type task struct {
				id    string
				set   []int
				units string
				due   time.Duration
			}
			var admitted [3][]time.Duration // each key's admissions
			var waiting []*task
			now, made, ran := time.Duration(0), 0, 0
			for step := 0; step < 20000 && (made < 300 || len(waiting) > 0); step++ {
				now += time.Duration(rng.IntN(40)) * time.Millisecond
				e.at(now)
				var tk *task
				for i, w := range waiting {
					if w.due <= now {
						tk = w
						waiting = append(waiting[:i], waiting[i+1:]...)
						break
					}
				}
				if tk == nil {
					if made >= 300 {
						continue
					}
					made++
					tk = &task{id: fmt.Sprintf("t%d", made), units: fmt.Sprintf("tokens=%d", rng.IntN(20))}
					switch rng.IntN(3) {
					case 0:
						tk.set = []int{0, 1}
					case 1:
						tk.set = []int{1, 2}
					default:
						tk.set = []int{0}
					}
				}
				a := DecideArgs{TaskID: tk.id, Units: tk.units, Horizon: 30 * time.Second, Lapse: 10 * time.Second}
				var ok bool
				var retry time.Duration
				if len(tk.set) == 1 {
					r := e.one(tk.set[0], a)
					ok, retry = r.Status == StatusAllowed, r.RetryAfter
					if ok {
						admitted[0] = append(admitted[0], now)
					}
				} else {
					r := e.multi(a, tk.set...)
					require.Contains(t, []int{StatusAllowed, StatusDenied}, r.Status, "%+v", r)
					ok, retry = r.Status == StatusAllowed, r.RetryAfter
					for j, k := range tk.set {
						if ok {
							require.Equal(t, StatusAllowed, r.Keys[j].Status, "admitted as a whole, so by each key")
							admitted[k] = append(admitted[k], now)
						} else {
							require.NotEqual(t, StatusAllowed, r.Keys[j].Status, "refused as a whole, so taken from no key: %+v", r)
						}
					}
				}
				if ok {
					ran++
					continue
				}
				tk.due = now + retry
				waiting = append(waiting, tk)
			}
			assert.Equal(t, made, ran, "every task ran (%d still waiting at %v)", len(waiting), now)
			for k := range 3 {
				got := admitted[k]
				require.NotEmpty(t, got, "key %d admitted something", k)
				for i := range got {
					for j := i; j < len(got); j++ {
						bound := bursts[k] + rates[k]*(got[j]-got[i]).Seconds()
						require.LessOrEqual(t, float64(j-i+1), bound+1e-9,
							"key %d admitted %d calls from %v to %v: above burst + rate x elapsed", k, j-i+1, got[i], got[j])
					}
				}
				t.Logf("key %d admitted %d calls over %v", k, len(got), now)
			}
		})
	}
}

// A suspension of one workspace key holds its tasks back, not the app
// key's other workspaces: the instant a task of [ws1 app] reserves after
// ws1's suspension is booked in ws1's schedule and only held in app's, so
// app keeps admitting [ws2 app] now; at its instant the holder runs.
func TestMultiWaitOnOneKeyDoesNotHoldTheOtherKeysCallers(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(10, 1000, 10)) // ws1
	e.limits(1, bucket(10, 1000, 10)) // ws2
	e.limits(2, bucket(15, 1000, 15)) // app
	_, err := Suspend(e.ctx, e.run, e.ks[0], 10*time.Second, time.Hour)
	require.NoError(t, err)
	a := func(id string) DecideArgs { return DecideArgs{TaskID: id, Horizon: time.Minute, Lapse: time.Minute} }
	r := e.multi(a("t1"), 0, 2)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	assert.Equal(t, 0, r.Key, "ws1's suspension")
	assert.Equal(t, testEpoch().Add(10*time.Second), r.Reserved)
	assert.Equal(t, r.Reserved.UnixMicro(), e.booked(0, "t1"), "booked in ws1")
	assert.Zero(t, e.booked(2, "t1"), "not booked in app's schedule")
	assert.Equal(t, r.Reserved.UnixMicro(), e.booked(2, "~t1"), "held in app")
	for i := range 5 {
		got := e.multi(a(fmt.Sprintf("w%d", i)), 1, 2)
		assert.Equal(t, StatusAllowed, got.Status, "[ws2 app] runs now: %+v", got)
	}
	e.at(10 * time.Second)
	got := e.multi(a("t1"), 0, 2)
	assert.Equal(t, StatusAllowed, got.Status, "the holder at its instant: %+v", got)
	assert.Zero(t, e.booked(2, "~t1"), "its hold in app is gone")
	assert.Zero(t, e.booked(0, "t1"), "its booking in ws1 is gone")
}

// A key whose slots are all held never admits, even when its schedule has
// room now behind a queue that is still open (found by TestPropertyMultiKey:
// a fresh caller refused only by b's queue was admitted at once by the
// schedule, past b's one slot).
func TestMultiNeverAdmitsPastHeldSlotsBehindAQueue(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(100, 1000, 5)) // (paced: a burst below a granule's worth)
	e.limits(1, bucket(10, 1000, 1), Tier{Kind: KindInFlight, Rate: 1})
	a := func(id string) DecideArgs {
		return DecideArgs{TaskID: id, Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true, SlotExpiry: time.Minute}
	}
	h1 := e.multi(a("h1"))
	require.Equal(t, StatusAllowed, h1.Status, "%+v", h1)
	h2 := e.multi(a("h2"))
	require.Equal(t, StatusDenied, h2.Status, "%+v", h2)
	require.False(t, h2.Reserved.IsZero(), "h2 reserved: %+v", h2)
	e.at(500 * time.Millisecond) // h2 has not come back; b's queue is open, its schedule free
	f := e.multi(a("f"))
	assert.Equal(t, StatusDenied, f.Status, "b's one slot is held by h1: %+v", f)
	n, err := e.rdb.ZCard(e.ctx, e.ks[1].Slots).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "b's slots held")
}

// Enqueue's booking (Book) across keys: every caller with an ID books one
// instant in every key, even one that could run now; a second booking
// under an ID that holds one in any key changes nothing.
func TestMultiBookingHoldsOneInstantAndRefusesAnIDInUse(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(10, hour, 10))
		e.limits(1, bucket(5, hour, 5))
		a := DecideArgs{TaskID: "b1", Horizon: time.Minute, Lapse: time.Minute, Book: true}
		r := e.multi(a)
		require.Equal(t, StatusDenied, r.Status, "a booking is told its instant: %+v", r)
		require.False(t, r.Reserved.IsZero(), "%+v", r)
		for k := range 2 {
			assert.Equal(t, r.Reserved.UnixMicro(), e.reserved(k, "b1"), "key %d holds it", k)
		}
		again := e.multi(a)
		assert.Equal(t, "booked", again.RefusedBy, "the ID holds a reservation: %+v", again)
		assert.Equal(t, 0, again.Key)
		for k, want := range []float64{10, 5} {
			st, err := Inspect(e.ctx, e.run, e.ks[k], nil, 0)
			require.NoError(t, err)
			assert.InDelta(t, want, st.Tokens[0], 0.01, "key %d: a booking takes no token now", k)
		}
	})
}

// A refund brought a holder's booking forward (adjust.lua moves it to
// now): its hold in another key, still at the old instant, does not make
// it wait; that key's tiers decide, and its queue does not hold it back.
func TestMultiHoldPastABookingBroughtForwardDoesNotWait(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(10, 1000, 1))
	e.limits(1, bucket(10, 1000, 1))
	resv := DecideArgs{Horizon: time.Minute, Lapse: time.Minute}
	// a's queue: 7 bookings to 0.7 s; b's: 10, to 1.0 s.
	for i, n := range []int{7, 10} {
		require.Equal(t, StatusAllowed, e.one(i, DecideArgs{}).Status)
		for j := range n {
			a := resv
			a.TaskID = fmt.Sprintf("q%d-%d", i, j)
			require.Equal(t, StatusDenied, e.one(i, a).Status)
		}
	}
	x := resv
	x.TaskID = "X"
	r := e.multi(x)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	at := testEpoch().Add(1100 * time.Millisecond).UnixMicro()
	require.Equal(t, at, e.booked(1, "X"), "booked in b, behind its queue")
	require.Equal(t, at, e.booked(0, "~X"), "held in a, whose own turn is earlier")

	e.at(500 * time.Millisecond)
	now := float64(testEpoch().Add(500 * time.Millisecond).UnixMicro())
	require.NoError(t, e.rdb.ZAddXX(e.ctx, e.ks[1].Reservations, redis.Z{Score: now, Member: "X"}).Err(), "a refund brings X forward in b")
	got := e.multi(x)
	assert.Equal(t, StatusAllowed, got.Status, "admitted now, not kept for its hold's old instant: %+v", got)
	assert.Zero(t, e.reserved(0, "X"), "the hold left a")
	assert.Zero(t, e.reserved(1, "X"), "the booking left b")
}

// A key whose hash expired with its state (its configuration kept in :c)
// is decided with its limits copied back, on the lean path of a cost of 1
// as on the general one: lean_admit gives the key it could not read to
// key_read, which restores it from the hash fields already read.
func TestMultiRestoresTheLimitsOfAKeyWhoseHashExpired(t *testing.T) {
	onBoth(t, func(t *testing.T, e *multiEnv) {
		e.limits(0, bucket(2, hour, 2))
		e.limits(1, bucket(10, hour, 10))
		require.Equal(t, StatusAllowed, e.multi(DecideArgs{}).Status)
		require.NoError(t, e.rdb.Del(e.ctx, e.ks[0].Bucket).Err())
		for i := range 2 {
			r := e.multi(DecideArgs{})
			require.Equal(t, StatusAllowed, r.Status, "call %d after a's hash expired: its limits back, its bucket full: %+v", i, r)
		}
		r := e.multi(DecideArgs{})
		require.Equal(t, StatusDenied, r.Status, "a's 2 taken: %+v", r)
		assert.Equal(t, 0, r.Key, "a (position 0) refused")
		assert.Equal(t, "tier:1", r.RefusedBy)
		l, err := e.rdb.HGet(e.ctx, e.ks[0].Bucket, "L").Result()
		require.NoError(t, err, "a's limits are in its hash again")
		assert.NotEmpty(t, l)
		assert.Equal(t, 7, e.admits(1, 10), "b gave three calls, to the three admitted")
	})
}
