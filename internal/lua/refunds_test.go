package lua

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenTiers are 1,000 requests and 1,000 tokens a second, each a bucket
// holding a second: a key with units, whose refunds M bounds.
var tokenTiers = []Tier{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Rate: 1000, PerMS: 1000, Burst: 1000, Unit: "tokens"}}

// tokensLeft is what the tokens tier holds now.
func (e *env) tokensLeft() float64 {
	e.t.Helper()
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(e.t, err)
	return r.Tokens[1]
}

// A bucket full before a call does not cut the call's refund: only what it
// owed since the call counts (issue 29, item 9). At 1 s the bucket is full
// again after a first call; D takes 900, and 60 ms later (M's interval
// then is over) C takes 160; at 1.26 s C gives all of it back: the bucket
// owed 800 or more all the while since C, so it all comes back (360 left).
// Counted since the first call, the full bucket at 1 s cut the refund to
// what had not refilled: nothing.
func TestARefundIsNotCutByAFullBucketBeforeItsCall(t *testing.T) {
	e := newEnv(t)
	e.setLimits(tokenTiers...)
	take := func(n int) DecideReply {
		t.Helper()
		r := e.decide(DecideArgs{Units: fmt.Sprintf("tokens=%d", n)})
		require.Equal(t, StatusAllowed, r.Status)
		return r
	}
	take(100)
	e.at(time.Second)
	take(900)
	e.at(1060 * time.Millisecond)
	c := take(160)
	e.at(1260 * time.Millisecond)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -160, Call{At: c.At, Charged: 160, Generation: c.Generation, Unit: "tokens"}, nil))
	assert.Equal(t, 360.0, e.tokensLeft(), "1,000 taken at 1 s and 1.06 s, 260 refilled, 160 back")
}

// A refund while a queue of reservations is outstanding brings its
// latest reservations forward, one for each charge's worth given back,
// and moves the schedule back by what it gave (issue 29, item 9). A
// bucket of 2,000 tokens refilling 1,000 a second, emptied at 0 (1,000,
// then five calls of 200), 20 tasks of 200 booked at 1, 2, 3 and 4 s,
// five a second; c's refund of all 200 at 0.1 s (the bucket owed 800 or
// more since c: all of it comes back)
// brings the last (r19, at 4 s) forward to now, and the next booking
// lands at 4 s (where r19 was) instead of 5 s. A refund of 100 brings
// nothing, another call's 100 (200 in all) brings r20; without Forward
// nothing is brought.
func TestARefundBringsTheLatestReservationsForward(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 1000, PerMS: 1000, Burst: 1000}, Tier{Rate: 1000, PerMS: 1000, Burst: 2000, Unit: "tokens"})
	take := func(n int) DecideReply {
		t.Helper()
		r := e.decide(DecideArgs{Units: fmt.Sprintf("tokens=%d", n)})
		require.Equal(t, StatusAllowed, r.Status)
		return r
	}
	take(1000)
	c, c2, c3, c4 := take(200), take(200), take(200), take(200)
	take(200)
	book := func(id string) time.Duration {
		t.Helper()
		r := e.decide(DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Book: true,
			TaskID: id, Units: "tokens=200"})
		require.Equal(t, StatusDenied, r.Status, "booking %s: %+v", id, r)
		return r.Reserved.Sub(testEpoch())
	}
	reserved0 := map[string]time.Duration{}
	for i := range 20 {
		id := fmt.Sprintf("r%d", i)
		reserved0[id] = book(id)
		assert.Equal(t, time.Duration(1+i/5)*time.Second, reserved0[id], "r%d's instant: five tasks' worth refills a second", i)
	}
	reserved := func(id string) time.Duration {
		t.Helper()
		s, err := e.rdb.ZScore(e.ctx, e.k.Reservations, id).Result()
		require.NoError(t, err, "ZSCORE %s", id)
		return time.UnixMicro(int64(s)).Sub(testEpoch())
	}
	settle := func(r DecideReply, delta int, forward bool) []string {
		t.Helper()
		fw, err := Settle(e.ctx, e.run, e.k, delta, Call{At: r.At, Charged: 200, Generation: r.Generation, Unit: "tokens", Forward: forward}, nil)
		require.NoError(t, err)
		var ids []string
		for _, f := range fw {
			ids = append(ids, f.ID)
			assert.Equal(t, reserved0[f.ID], f.At.Sub(testEpoch()), "%s: its old instant", f.ID)
		}
		return ids
	}

	e.at(100 * time.Millisecond)
	assert.Empty(t, settle(c2, -200, false), "Adjust brings nothing forward")
	assert.Equal(t, 4*time.Second, reserved("r19"))
	assert.Equal(t, []string{"r19"}, settle(c, -200, true), "the latest reservation, for 200 given back")
	assert.Equal(t, 100*time.Millisecond, reserved("r19"), "r19's instant is now")
	assert.Equal(t, 4*time.Second, reserved("r18"))
	reserved0["r20"] = book("r20")
	assert.Equal(t, 4*time.Second, reserved0["r20"], "the schedule is 200 tokens shorter: r20 takes r19's place")

	e.at(200 * time.Millisecond)
	assert.Empty(t, settle(c3, -100, true), "100 given back: half a charge")
	assert.Equal(t, []string{"r20"}, settle(c4, -100, true), "100 more: a charge's worth in all")
	assert.Equal(t, 200*time.Millisecond, reserved("r20"))
}

// A booked task's worth is its estimate, not what the settling call was
// charged so far: a task that calls Used several times (100, then 1, then
// 0 of an estimate of 200) brings one task forward for the 200 it gave
// back in all, not the whole backlog for its last token; and a call of a
// small estimate brings no more 200-token tasks forward than its refund
// and the credit left are worth. A task brought forward that does not fit
// would be booked again behind the queue, later than its first instant.
func TestABookedTasksWorthIsAnEstimate(t *testing.T) {
	setup := func(t *testing.T, first ...int) (*env, []DecideReply, map[string]time.Duration, func(string) DecideReply) {
		e := newEnv(t)
		e.setLimits(Tier{Rate: 1000, PerMS: 1000, Burst: 1000}, Tier{Rate: 1000, PerMS: 1000, Burst: 2000, Unit: "tokens"})
		var calls []DecideReply
		for _, n := range first {
			r := e.decide(DecideArgs{Units: fmt.Sprintf("tokens=%d", n)})
			require.Equal(t, StatusAllowed, r.Status)
			calls = append(calls, r)
		}
		decide := func(id string) DecideReply {
			return e.decide(DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Book: true, TaskID: id, Units: "tokens=200"})
		}
		orig := map[string]time.Duration{}
		for i := range 20 {
			id := fmt.Sprintf("r%d", i)
			r := decide(id)
			require.Equal(t, StatusDenied, r.Status)
			orig[id] = r.Reserved.Sub(testEpoch())
		}
		return e, calls, orig, decide
	}
	settle := func(t *testing.T, e *env, c DecideReply, delta, charged, estimate int) []Forwarded {
		t.Helper()
		fw, err := Settle(e.ctx, e.run, e.k, delta, Call{At: c.At, Charged: charged, Generation: c.Generation, Unit: "tokens", Forward: true, Estimate: estimate}, nil)
		require.NoError(t, err)
		return fw
	}
	// noneBehind: the tasks brought forward come back now; none refused is
	// booked later than it first was.
	noneBehind := func(t *testing.T, fw []Forwarded, orig map[string]time.Duration, decide func(string) DecideReply) {
		t.Helper()
		for _, f := range fw {
			if r := decide(f.ID); r.Status != StatusAllowed {
				assert.LessOrEqual(t, r.Reserved.Sub(testEpoch()), orig[f.ID], "%s: brought forward, refused, and booked behind its first instant", f.ID)
			}
		}
	}

	t.Run("several Used of one task", func(t *testing.T) {
		e, calls, orig, decide := setup(t, 1000, 200, 200, 200, 200, 200)
		e.at(100 * time.Millisecond)
		var fw []Forwarded
		fw = append(fw, settle(t, e, calls[1], -100, 200, 200)...)
		fw = append(fw, settle(t, e, calls[1], -99, 100, 200)...)
		fw = append(fw, settle(t, e, calls[1], -1, 1, 200)...)
		assert.Len(t, fw, 1, "200 tokens given back in all: one task of 200")
		noneBehind(t, fw, orig, decide)
	})
	t.Run("a small estimate after a large one", func(t *testing.T) {
		e, calls, orig, decide := setup(t, 1000, 200, 10, 790)
		e.at(100 * time.Millisecond)
		assert.Empty(t, settle(t, e, calls[1], -150, 200, 200), "150 given back: less than a task of 200")
		fw := settle(t, e, calls[2], -10, 10, 10)
		assert.LessOrEqual(t, len(fw), 1, "160 given back in all: at most one task of 200, not 16")
		noneBehind(t, fw, orig, decide)
	})
}

// A refund settles on a key whose schedule (V) lacks a bucket of the
// limits in force: processes that disagree on a key's default limits (a
// rolling deploy changing WithDefaultLimits) write each other's
// schedules. It failed with a script error on the request bucket, which
// the refund of tokens does not touch, and every Used went unsettled.
func TestARefundSettlesOnAScheduleOfOtherLimits(t *testing.T) {
	e := newEnv(t)
	defA := []Tier{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Rate: 1000, PerMS: 1000, Burst: 2000, Unit: "tokens"}}
	defB := []Tier{{Rate: 60000, PerMS: 60000, Burst: 1000}, {Rate: 1000, PerMS: 1000, Burst: 2000, Unit: "tokens"}}
	var c DecideReply
	for i := range 6 {
		n := 200
		if i == 0 {
			n = 1000
		}
		r := e.decide(DecideArgs{Units: fmt.Sprintf("tokens=%d", n), Defaults: defA})
		require.Equal(t, StatusAllowed, r.Status)
		if i == 1 {
			c = r
		}
	}
	for i := range 10 {
		r := e.decide(DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Book: true, TaskID: fmt.Sprintf("r%d", i), Units: "tokens=200", Defaults: defA})
		require.Equal(t, StatusDenied, r.Status)
	}
	e.at(100 * time.Millisecond)
	fw, err := Settle(e.ctx, e.run, e.k, -200, Call{At: c.At, Charged: 200, Generation: c.Generation, Unit: "tokens", Forward: true, Estimate: 200}, defB)
	require.NoError(t, err)
	assert.Len(t, fw, 1, "200 given back under the other limits: a task of 200 brought forward")
}

// A refund is not given back from room a holder counted ahead makes (the
// lone late 429 of bench L6, issue 29 item 10). A paced holder admitted
// before its instant is counted at it: the bucket owes as of now what the
// holder will take then, and the refill it would lose full until then.
// What the bucket owed at least since a call (M) must be what its calls
// made so far owed, not that: else the refund of a call made after the
// holder was admitted finds room in the holder's cost, and the bucket,
// full in fact before the holder's instant, keeps the refund after it.
// Tokens 1,000 a second, a bucket of 1,000, a headroom of 20 ms: C0
// takes 980 at 0; C (100) and H (1,000) book their instants, 0.1 s and
// 1.08 s; both come back at once and are admitted at them, paced; X (a
// request alone) is decided at 60 ms; C's call, at 0.1 s, gives its 100
// back at 0.3 s. Whatever C cost, the bucket is full by 1.08 s and H's
// 1,000 leave it empty: a refund of C's 100 there is 100 tokens admitted
// beyond what the bucket holds had C asked for nothing, and a provider
// metering the same bucket refuses the call it admits (bench L6's lone
// 429 a few seconds into the drain, once the limits were learned).
func TestARefundIsNotGivenFromAHolderCountedAhead(t *testing.T) {
	for _, refund := range []bool{false, true} {
		t.Run(fmt.Sprintf("refund=%v", refund), func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(Tier{Rate: 100000, PerMS: 1000, Burst: 100000}, Tier{Rate: 1000, PerMS: 1000, Burst: 1000, Unit: "tokens"})
			const headroom = 20 * time.Millisecond
			q := func(id, units string) DecideArgs {
				return DecideArgs{TaskID: id, Units: units, Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true, Headroom: headroom}
			}
			require.Equal(t, StatusAllowed, e.decide(DecideArgs{Units: "tokens=980", Headroom: headroom}).Status)
			for _, b := range []struct {
				id, units string
				at        time.Duration
			}{{"c", "tokens=100", 100 * time.Millisecond}, {"h", "tokens=1000", 1100 * time.Millisecond}} {
				r := e.decide(q(b.id, b.units))
				require.Equal(t, StatusDenied, r.Status, "%s books: %+v", b.id, r)
				require.Equal(t, b.at, r.Reserved.Sub(testEpoch()), "%s's instant", b.id)
			}
			e.at(time.Millisecond)
			c := e.decide(q("c", "tokens=100"))
			require.Equal(t, StatusAllowed, c.Status, "c, paced: %+v", c)
			require.Equal(t, 100*time.Millisecond, c.At.Sub(testEpoch()))
			e.at(2 * time.Millisecond)
			h := e.decide(q("h", "tokens=1000"))
			require.Equal(t, StatusAllowed, h.Status, "h, paced: %+v", h)
			require.Equal(t, 1100*time.Millisecond, h.At.Sub(testEpoch()))
			e.at(60 * time.Millisecond)
			e.decide(q("x", ""))
			if refund {
				e.at(300 * time.Millisecond)
				require.NoError(t, Adjust(e.ctx, e.run, e.k, -100, Call{At: c.At, Charged: 100, Generation: c.Generation, Unit: "tokens"}, nil))
			}
			e.at(1101 * time.Millisecond)
			assert.InDelta(t, 1.0, e.tokensLeft(), 1e-6, "1 ms after H's instant: H's 1,000 left the bucket empty, whatever C cost")
		})
	}
}

// A hold ("~" + ID: a task of several keys holding here the instant
// booked in another key) is not a booking of this key: a refund brings
// the latest booking forward, not a hold further ahead.
func TestARefundBringsABookingForwardNotAHold(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 1000, PerMS: 1000, Burst: 1000}, Tier{Rate: 1000, PerMS: 1000, Burst: 2000, Unit: "tokens"})
	var c DecideReply
	for i, n := range []int{1000, 200, 200, 200, 200, 200} {
		r := e.decide(DecideArgs{Units: fmt.Sprintf("tokens=%d", n)})
		require.Equal(t, StatusAllowed, r.Status)
		if i == 1 {
			c = r
		}
	}
	for i := range 10 {
		r := e.decide(DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Book: true, TaskID: fmt.Sprintf("r%d", i), Units: "tokens=200"})
		require.Equal(t, StatusDenied, r.Status)
	}
	// Two holds past every booking.
	for i, at := range []time.Duration{5 * time.Second, 6 * time.Second} {
		require.NoError(t, e.rdb.ZAdd(e.ctx, e.k.Reservations, redis.Z{Score: float64(testEpoch().Add(at).UnixMicro()), Member: fmt.Sprintf("~h%d", i)}).Err())
	}
	e.at(100 * time.Millisecond)
	fw, err := Settle(e.ctx, e.run, e.k, -200, Call{At: c.At, Charged: 200, Generation: c.Generation, Unit: "tokens", Forward: true}, nil)
	require.NoError(t, err)
	var ids []string
	for _, f := range fw {
		ids = append(ids, f.ID)
	}
	assert.Equal(t, []string{"r9"}, ids, "the latest booking, past the holds")
	for _, h := range []string{"~h0", "~h1"} {
		s, err := e.rdb.ZScore(e.ctx, e.k.Reservations, h).Result()
		require.NoError(t, err)
		assert.Greater(t, s, float64(testEpoch().Add(4*time.Second).UnixMicro()), "%s stays where it was", h)
	}
}
