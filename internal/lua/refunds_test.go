package lua

import (
	"fmt"
	"testing"
	"time"

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
	for i := range 20 {
		assert.Equal(t, time.Duration(1+i/5)*time.Second, book(fmt.Sprintf("r%d", i)), "r%d's instant: five tasks' worth refills a second", i)
	}
	reserved := func(id string) time.Duration {
		t.Helper()
		s, err := e.rdb.ZScore(e.ctx, e.k.Reservations, id).Result()
		require.NoError(t, err, "ZSCORE %s", id)
		return time.UnixMicro(int64(s)).Sub(testEpoch())
	}
	settle := func(r DecideReply, delta int, forward bool) []string {
		t.Helper()
		ids, err := Settle(e.ctx, e.run, e.k, delta, Call{At: r.At, Charged: 200, Generation: r.Generation, Unit: "tokens", Forward: forward}, nil)
		require.NoError(t, err)
		return ids
	}

	e.at(100 * time.Millisecond)
	assert.Empty(t, settle(c2, -200, false), "Adjust brings nothing forward")
	assert.Equal(t, 4*time.Second, reserved("r19"))
	assert.Equal(t, []string{"r19"}, settle(c, -200, true), "the latest reservation, for 200 given back")
	assert.Equal(t, 100*time.Millisecond, reserved("r19"), "r19's instant is now")
	assert.Equal(t, 4*time.Second, reserved("r18"))
	assert.Equal(t, 4*time.Second, book("r20"), "the schedule is 200 tokens shorter: r20 takes r19's place")

	e.at(200 * time.Millisecond)
	assert.Empty(t, settle(c3, -100, true), "100 given back: half a charge")
	assert.Equal(t, []string{"r20"}, settle(c4, -100, true), "100 more: a charge's worth in all")
	assert.Equal(t, 200*time.Millisecond, reserved("r20"))
}
