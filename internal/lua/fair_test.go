package lua

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fairArgs is a fair decision of tenant for task id at cost 1, reserving
// up to a minute ahead, exact instants.
func fairArgs(tenant, id string) DecideArgs {
	a := DecideArgs{Fair: true, Tenant: tenant, TaskID: id, Horizon: time.Minute, Lapse: time.Minute}
	if fairArgsHook != nil {
		fairArgsHook(&a)
	}
	return a
}

// fairArgsHook, when set, changes every fairArgs (the middleware's options).
var fairArgsHook func(*DecideArgs)

// A tenant alone gets the key's burst and then its whole rate: tenants cost
// nothing while there is no one to share with.
func TestFairTenantAloneGetsTheBurstThenTheRate(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	for i := range 10 {
		r := e.decide(fairArgs("a", fmt.Sprintf("a%d", i)))
		require.Equal(t, StatusAllowed, r.Status, "the burst, decision %d: %+v", i, r)
	}
	for i := range 5 {
		r := e.decide(fairArgs("a", fmt.Sprintf("a%d", 10+i)))
		require.Equal(t, StatusDenied, r.Status)
		assert.Equal(t, testEpoch().Add(time.Duration(i+1)*100*time.Millisecond), r.Reserved, "reservation %d: one every 100 ms", i)
	}
}

// A second tenant arriving behind the first one's backlog is served from
// its own place in line: its tasks are reserved at half the rate from now
// on, interleaved with the first tenant's, not behind them.
func TestFairSecondTenantIsNotQueuedBehindTheFirst(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	var a []time.Time
	for i := range 31 {
		r := e.decide(fairArgs("a", fmt.Sprintf("a%d", i)))
		if r.Status == StatusDenied {
			a = append(a, r.Reserved)
		}
	}
	require.Len(t, a, 30, "a's backlog is reserved")
	assert.Equal(t, testEpoch().Add(3*time.Second), a[29], "a alone: 10/s")

	e.at(10 * time.Millisecond)
	var b []time.Time
	for i := range 5 {
		r := e.decide(fairArgs("b", fmt.Sprintf("b%d", i)))
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		b = append(b, r.Reserved)
	}
	assert.Less(t, b[0].Sub(testEpoch()), 300*time.Millisecond, "b's first task waits for its own turn, not behind a's 3 s: %v", b)
	// (b's first task waits only for the bucket's next token; then b's
	// share, half the rate, spaces them.)
	for i := 2; i < len(b); i++ {
		assert.InDelta(t, 200*time.Millisecond, b[i].Sub(b[i-1]), float64(time.Millisecond), "b's tasks 200 ms apart (half of 10/s): %v", b)
	}

	// a's holders booked at the whole rate come back early: they are moved
	// back to their new turn.
	e.at(1 * time.Second)
	r := e.decide(fairArgs("a", "a10"))
	require.Equal(t, StatusDenied, r.Status, "a's task reserved at 1 s is not due: b shares the rate now: %+v", r)
	assert.Greater(t, r.Reserved, testEpoch().Add(time.Second), "moved back")
	assert.Equal(t, "queue", r.RefusedBy)
}

// fairTask is one task of a simulated backlog: its tenant and ID, when it
// comes back (its reservation), and when it was admitted.
type fairTask struct {
	tenant, id   string
	cost         int // 0: 1
	units        string
	back, ranAt  time.Duration
	ran, reached bool
	deferrals    int
}

var fairTrace func(now time.Duration, k *fairTask, r DecideReply)

// runFair drives tasks as a fleet would, on the env's clock: each task is
// decided when it arrives (at its back instant) and again whenever it comes
// back to its reservation, in steps of 5 ms, until every task ran or until
// limit. Tasks coming back in one step come back in ID order.
func runFair(t *testing.T, e *env, tasks []*fairTask, limit time.Duration) {
	t.Helper()
	for now := time.Duration(0); now <= limit; now += 5 * time.Millisecond {
		e.at(now)
		left := 0
		for _, k := range tasks {
			if k.ran {
				continue
			}
			left++
			if k.back > now {
				continue
			}
			a := fairArgs(k.tenant, k.id)
			if k.cost > 0 {
				a.Cost = k.cost
			}
			a.Units = k.units
			r := e.decide(a)
			if fairTrace != nil {
				fairTrace(now, k, r)
			}
			switch r.Status {
			case StatusAllowed:
				k.ran, k.ranAt = true, r.At.Sub(testEpoch())
			case StatusDenied:
				k.deferrals++
				k.back = now + r.RetryAfter
				if !r.Reserved.IsZero() {
					k.back = r.Reserved.Sub(testEpoch())
				}
			default:
				t.Fatalf("task %s: %+v", k.id, r)
			}
		}
		if left == 0 {
			return
		}
	}
	t.Fatalf("not every task ran by %v", limit)
}

// Weights divide the rate while both tenants wait: 3:1.
func TestFairWeightsDivideTheRate(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 1})
	_, err := SetWeights(e.ctx, e.run, e.k, map[string]int{"gold": 3})
	require.NoError(t, err)
	// Both enqueue a backlog at the same instant, alternately.
	var tasks []*fairTask
	for i := range 80 {
		for _, tn := range []string{"gold", "plain"} {
			tasks = append(tasks, &fairTask{tenant: tn, id: fmt.Sprintf("%s%d", tn, i)})
		}
	}
	runFair(t, e, tasks, 10*time.Second)
	// While both wait (the first two seconds), gold gets 3 of every 4 runs.
	g, p := 0, 0
	for _, k := range tasks {
		if k.ranAt < 2*time.Second {
			if k.tenant == "gold" {
				g++
			} else {
				p++
			}
		}
	}
	share := float64(g) / float64(g+p)
	assert.InDelta(t, 0.75, share, 0.05, "gold's share of the first two seconds' runs (%d of %d)", g, g+p)
}

// Once a tenant's backlog is done, the others' tasks are not left at the
// share they had while it waited: the key drains at its whole rate
// (work conserving), and a task is moved back at most once.
func TestFairDrainsAtTheWholeRateOnceATenantIsDone(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 1})
	// 10 tasks of "small" spread among 200 of "big", all enqueued at once.
	var tasks []*fairTask
	for i := range 210 {
		if i%21 == 10 {
			tasks = append(tasks, &fairTask{tenant: "small", id: fmt.Sprintf("small%d", i)})
		} else {
			tasks = append(tasks, &fairTask{tenant: "big", id: fmt.Sprintf("big%d", i)})
		}
	}
	runFair(t, e, tasks, 30*time.Second)
	var last, smallLast time.Duration
	most := 0
	for _, k := range tasks {
		last = max(last, k.ranAt)
		if k.tenant == "small" {
			smallLast = max(smallLast, k.ranAt)
		}
		most = max(most, k.deferrals)
	}
	ideal := time.Duration(float64(len(tasks)-1) / 40 * float64(time.Second))
	assert.Less(t, last, ideal+500*time.Millisecond, "drained in %v, ideal %v: at the whole rate once small is done", last, ideal)
	assert.Less(t, smallLast, time.Second, "small's 10 tasks at half the rate: done within 0.5 s, not behind big's backlog")
	assert.LessOrEqual(t, most, 2, "no task deferred more than twice (once, and moved once)")
}

// A tenant whose work is done leaves the active set: the other gets the
// whole rate again.
func TestFairIdleTenantLeavesItsShareToTheOthers(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	e.decide(fairArgs("a", "a0"))
	e.decide(fairArgs("b", "b0"))
	r := e.decide(fairArgs("a", "a1"))
	require.Equal(t, StatusDenied, r.Status)
	require.Equal(t, int64(2), e.rdb.ZCard(e.ctx, e.k.Tenants).Val(), "two tenants active")

	e.at(5 * time.Second) // every booked task long due: both tenants idle
	e.decide(fairArgs("b", "b1"))
	r = e.decide(fairArgs("b", "b2"))
	require.Equal(t, StatusDenied, r.Status)
	assert.Equal(t, testEpoch().Add(5*time.Second+100*time.Millisecond), r.Reserved, "b alone again: 10/s")
	names, err := e.rdb.ZRange(e.ctx, e.k.Tenants, 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"b"}, names, "a left the active set")
	assert.False(t, e.mr.Exists(e.k.Bucket) && e.mr.HGet(e.k.Bucket, "t:a") != "", "a's record is gone")
}

// A caller that does not say its tenant, on a key whose tenants are
// active, is told to ask again as a tenant.
func TestFairKeyAsksCallersWithoutATenantToAskAgain(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	e.decide(fairArgs("a", "a0"))
	e.decide(fairArgs("a", "a1"))
	r := e.decide(DecideArgs{TaskID: "x", Horizon: time.Minute, Lapse: time.Minute})
	assert.Equal(t, StatusFair, r.Status)
	r = e.decide(fairArgs("", "x"))
	assert.Equal(t, StatusDenied, r.Status, "as the default tenant: %+v", r)
}

// Whatever tenants, costs and times, the tiers hold: at most burst + rate
// x elapsed admitted, and W is the sum of the weights of the active set.
func TestFairSharesNeverBreakTheBound(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			e := newEnv(t)
			tier := Tier{Rate: 20, PerMS: 1000, Burst: 5}
			e.setLimits(tier)
			_, err := SetWeights(e.ctx, e.run, e.k, map[string]int{"t1": 2, "t3": 5})
			require.NoError(t, err)
			var admitted []time.Duration
			at := time.Duration(0)
			for i := range 600 {
				at += time.Duration(rng.IntN(40_000)) * time.Microsecond
				e.at(at)
				a := fairArgs(fmt.Sprintf("t%d", rng.IntN(4)), fmt.Sprintf("task%d", rng.IntN(60)))
				a.Cost = 1 + rng.IntN(3)
				r := e.decide(a)
				if r.Status == StatusAllowed {
					for range a.Cost {
						admitted = append(admitted, r.At.Sub(testEpoch()))
					}
				}
				if i%50 == 0 {
					checkFairSum(t, e)
				}
			}
			sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
			for i := range admitted {
				for j := i; j < len(admitted); j++ {
					span := (admitted[j] - admitted[i]).Seconds()
					bound := float64(tier.Burst) + float64(tier.Rate)*span
					require.LessOrEqual(t, float64(j-i+1), bound+1e-9, "admitted %d in %.3f s", j-i+1, span)
				}
			}
			assert.Greater(t, len(admitted), 100, "something was admitted")
		})
	}
}

// checkFairSum checks that the clock's W is the sum of the weights of the
// tenants in the active set, as their records say.
func checkFairSum(t *testing.T, e *env) {
	t.Helper()
	G := e.mr.HGet(e.k.Bucket, "G")
	if G == "" {
		return
	}
	g := decodeT(t, G)
	names, err := e.rdb.ZRange(e.ctx, e.k.Tenants, 0, -1).Result()
	require.NoError(t, err)
	sum := 0.0
	for _, n := range names {
		rec := e.mr.HGet(e.k.Bucket, "t:"+n)
		require.NotEmpty(t, rec, "active tenant %q has a record", n)
		sum += decodeT(t, rec)[1]
	}
	assert.InDelta(t, sum, g[2], 1e-9, "W against the active set %v", names)
}

// A backlog's start tags live in their own sorted set, not in the key's
// hash (where every HMGET of the key would search hundreds of fields), and
// every key the fair path writes expires.
func TestFairTagsLiveOutsideTheHashAndExpire(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	for i := range 200 {
		e.decide(fairArgs(fmt.Sprintf("t%d", i%2), fmt.Sprintf("j%d", i)))
	}
	n, err := e.rdb.HLen(e.ctx, e.k.Bucket).Result()
	require.NoError(t, err)
	assert.Less(t, n, int64(16), "the hash holds the key's state and two tenants, not a field per reservation")
	tags, err := e.rdb.ZCard(e.ctx, e.k.Tags).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(199), tags, "a start tag per reservation")
	for _, k := range []string{e.k.Bucket, e.k.Reservations, e.k.Tenants, e.k.Tags} {
		assert.Greater(t, e.mr.TTL(k), time.Duration(0), "%s expires", k)
	}
}

// The active tenants expiring before the hash that counts them (a key
// kept alive by something else) does not leave their weights in force:
// once the clock passes their finish tags, no tenant is active, and a new
// tenant alone gets the whole rate.
func TestFairLostActiveSetHealsOnceTheWorkIsPast(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	for i := range 20 {
		e.decide(fairArgs(fmt.Sprintf("t%d", i%2), fmt.Sprintf("j%d", i)))
	}
	require.Equal(t, StatusFair, e.decide(DecideArgs{}).Status, "shared while tenants are active")
	e.mr.Del(e.k.Tenants)
	e.at(time.Minute)
	require.Equal(t, StatusAllowed, e.decide(fairArgs("x", "x0")).Status)
	r := e.decide(fairArgs("x", "x1"))
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	assert.Equal(t, testEpoch().Add(time.Minute+100*time.Millisecond), r.Reserved, "x alone: the whole rate, not a third of it")
}

// SetLimits drops the reservations and the fair state they booked: a task
// brought back to be decided anew is not queued behind its own tenant's
// dropped work.
func TestFairSetLimitsDropsTheWorkTheQueueBooked(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	for i := range 30 {
		e.decide(fairArgs("a", fmt.Sprint("a", i)))
	}
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 2})
	assert.False(t, e.mr.Exists(e.k.Tags), "the start tags went with the queue")
	r := e.decide(fairArgs("a", "a29"))
	if r.Status == StatusDenied {
		assert.Less(t, r.Reserved.Sub(testEpoch()), 500*time.Millisecond, "a29 decided anew at its tenant's turn now, not after the 3 s the dropped queue booked: %+v", r)
	}
}

// Shares are in cost units: a tenant whose tasks cost 4 gets a quarter of
// the tasks of a tenant whose tasks cost 1, and the same units.
func TestFairSharesCountCostUnits(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 4})
	var tasks []*fairTask
	for i := range 60 {
		tasks = append(tasks, &fairTask{tenant: "big", id: fmt.Sprint("big", i), cost: 4})
		tasks = append(tasks, &fairTask{tenant: "small", id: fmt.Sprint("small", i)})
	}
	runFair(t, e, tasks, 30*time.Second)
	units := map[string]int{}
	for _, k := range tasks {
		if k.ranAt >= 500*time.Millisecond && k.ranAt < 2500*time.Millisecond {
			units[k.tenant] += max(k.cost, 1)
		}
	}
	share := float64(units["big"]) / float64(units["big"]+units["small"])
	assert.InDelta(t, 0.5, share, 0.08, "big's share of the units while both wait (%v)", units)
}

// With tiers in several units, a tenant's share is of its dominant unit:
// on 100 requests and 1,000 tokens a second, a tenant of 200-token calls
// and one of 10-token calls each get half the tokens while both wait (2.5
// and 50 calls a second), instead of equal calls, which would leave the
// small calls 5 a second behind the big ones' tokens.
func TestFairSharesCountTheDominantUnit(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 5}, Tier{Rate: 1000, PerMS: 1000, Burst: 500, Unit: "tokens"})
	var tasks []*fairTask
	for i := range 40 {
		tasks = append(tasks, &fairTask{tenant: "big", id: fmt.Sprint("big", i), units: "tokens=200"})
	}
	for i := range 400 {
		tasks = append(tasks, &fairTask{tenant: "small", id: fmt.Sprint("small", i), units: "tokens=10"})
	}
	runFair(t, e, tasks, 60*time.Second)
	calls, tokens := map[string]int{}, map[string]int{}
	for _, k := range tasks {
		if k.ranAt >= time.Second && k.ranAt < 5*time.Second {
			calls[k.tenant]++
			tokens[k.tenant] += map[string]int{"big": 200, "small": 10}[k.tenant]
		}
	}
	share := float64(tokens["big"]) / float64(tokens["big"]+tokens["small"])
	assert.InDelta(t, 0.5, share, 0.1, "big's share of the tokens while both wait (calls %v, tokens %v)", calls, tokens)
	assert.Greater(t, calls["small"], 10*calls["big"], "the small calls run far more often (calls %v)", calls)
}

// A paced holder is never admitted at an instant further ahead than the
// middleware waits for one (a granule and PACE_EARLY): on a key with a
// long window, the window's tolerance (54 s of a 10-a-minute window)
// admitted a holder back early seconds before its instant, and its worker,
// waiting at most about a second, started its call before the instant the
// window counted it at (issue 29, item 6). The same for a bucket with a
// large burst.
func TestFairPacedHolderIsNeverAdmittedFurtherAheadThanAPacedWait(t *testing.T) {
	maxWait := time.Second + PaceEarly
	for name, tiers := range map[string][]Tier{
		"window": {{Kind: KindWindow, Rate: 10, PerMS: 60_000}},
		"bucket": {{Rate: 1, PerMS: 1000, Burst: 30}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(tiers...)
			paced := func(tenant, id string) DecideArgs {
				a := fairArgs(tenant, id)
				a.Pace, a.Granule = true, time.Second
				return a
			}
			reserved := map[string]time.Time{}
			for i := range 40 {
				for _, tenant := range []string{"a", "b"} {
					id := fmt.Sprintf("%s%d", tenant, i)
					r := e.decide(paced(tenant, id))
					if r.Status == StatusDenied && !r.Reserved.IsZero() {
						reserved[id] = r.Reserved
					}
				}
			}
			require.NotEmpty(t, reserved)
			// The holders come back early (brought back by an operator's
			// run-now, or SetLimits): each is admitted at most a paced
			// wait ahead, or deferred.
			step := 500 * time.Millisecond
			if raceOn {
				step = 900 * time.Millisecond // (see race_on_test.go; every tenth of the second is still met)
			}
			for now := time.Second; now < 3*time.Minute; now += step {
				e.at(now)
				for id, at := range reserved {
					a := paced(id[:1], id)
					r := e.decide(a)
					if r.Status == StatusAllowed {
						assert.LessOrEqual(t, r.Wait, maxWait, "%s (reserved at +%v) admitted at +%v to start %v later", id, at.Sub(testEpoch()), now, r.Wait)
						delete(reserved, id)
					} else if !r.Reserved.IsZero() {
						reserved[id] = r.Reserved
					}
				}
			}
		})
	}
}

// Raising a tenant's weight while its tasks are booked moves its place in
// line forward, and its booked tasks with it (its shift). Its work then
// comes due at once and its record, which holds that shift, ends; its tasks
// coming back later are not sent to the places they had at the old weight:
// c1, back at 3 s, was booked again and ran at 17 s on a key that drains by
// 2.5 s.
func TestFairRaisingAWeightKeepsBookedTasksInLine(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	first := []*fairTask{
		{tenant: "d", id: "d0", cost: 2}, {tenant: "c", id: "c0", cost: 2},
		{tenant: "d", id: "d1"}, {tenant: "d", id: "d2"}, {tenant: "c", id: "c1"},
	}
	var tasks []*fairTask
	for _, k := range first {
		a := fairArgs(k.tenant, k.id)
		a.Cost = max(k.cost, 1)
		r := e.decide(a)
		if r.Status == StatusAllowed {
			continue
		}
		require.Equal(t, StatusDenied, r.Status, "%s: %+v", k.id, r)
		k.back = r.Reserved.Sub(testEpoch())
		tasks = append(tasks, k)
	}
	require.Len(t, tasks, 4, "d0 runs on the burst, the others are booked")
	_, err := SetWeights(e.ctx, e.run, e.k, map[string]int{"c": 9})
	require.NoError(t, err)
	runFair(t, e, tasks, 30*time.Second)
	for _, k := range tasks {
		assert.Less(t, k.ranAt, 4*time.Second, "%s ran at %v: 7 units at 2/s, 2 of them on the burst, drain by 2.5 s", k.id, k.ranAt)
	}
}
