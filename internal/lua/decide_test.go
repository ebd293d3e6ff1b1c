package lua

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDecideReadsEveryReplyAndRefusesBadOnes(t *testing.T) {
	slot := testEpoch().Add(time.Second)
	tests := []struct {
		name  string
		reply string
		want  DecideReply
		bad   bool
	}{
		{"allowed", "1|0|4||0|0|3", DecideReply{Status: StatusAllowed, Remaining: 4, Generation: 3}, false},
		{"allowed with a lease", "1|0|4||0|7|0", DecideReply{Status: StatusAllowed, Remaining: 4, Lease: 7}, false},
		{"denied by tier", "0|1500|0|tier:2|0|0|1", DecideReply{Status: StatusDenied, RetryAfter: 1500 * time.Microsecond, RefusedBy: "tier:2", Generation: 1}, false},
		{"denied with slot", "0|1000000|0|tier:1|" + strconv.FormatInt(slot.UnixMicro(), 10) + "|0|0", DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "tier:1", Reserved: slot}, false},
		{"float-formatted numbers", "0|1.5e+06|0|queue|0|0|0", DecideReply{Status: StatusDenied, RetryAfter: 1500 * time.Millisecond, RefusedBy: "queue"}, false},
		{"no limits", "-2", DecideReply{Status: StatusNoLimits}, false},
		{"bad config", "-1|limits[0].N|below minimum 1", DecideReply{Status: StatusBadConfig, Field: "limits[0].N", Reason: "below minimum 1"}, false},
		{"empty", "", DecideReply{}, true},
		{"unknown status", "2|0|0||0|0|0", DecideReply{}, true},
		{"bad config too short", "-1", DecideReply{}, true},
		{"too short", "1|0|0||0|0", DecideReply{}, true},
		{"a slot held", "1|0|0||0|0|0|t1@1700000000000000.1", DecideReply{Status: StatusAllowed, Slot: "t1@1700000000000000.1"}, false},
		{"too long", "1|0|0||0|0|0|x|y", DecideReply{}, true},
		{"a refusal does not hold", "0|0|0||0|0|0|x", DecideReply{}, true},
		{"retry not a number", "0|soon|0|tier:1|0|0|0", DecideReply{}, true},
		{"retry negative", "0|-5|0|tier:1|0|0|0", DecideReply{}, true},
		{"retry infinite", "0|+Inf|0|tier:1|0|0|0", DecideReply{}, true},
		{"retry NaN", "0|nan|0|tier:1|0|0|0", DecideReply{}, true},
		{"retry beyond int64", "0|1e300|0|tier:1|0|0|0", DecideReply{}, true},
		{"lease negative", "1|0|0||0|-1|0", DecideReply{}, true},
		{"generation not a number", "1|0|0||0|0|x", DecideReply{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDecide(tt.reply)
			if tt.bad {
				assert.ErrorIs(t, err, ErrBadReply, "ParseDecide(%q) = %+v", tt.reply, got)
				return
			}
			require.NoError(t, err, "ParseDecide(%q)", tt.reply)
			assert.Equal(t, tt.want, got, "ParseDecide(%q)", tt.reply)
		})
	}
}

func TestParseDecideDoesNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseDecide("0|1000000|0|tier:1|1700000001000000|0|2"); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "ParseDecide allocates")
}

func TestDecideAdmitsRefusesReservesAndSuspends(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	for i, want := range []int64{1, 0} {
		r := e.decide(DecideArgs{})
		assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: want, At: testEpoch(), Generation: 1}, r, "Decide #%d", i+1)
	}
	r := e.decide(DecideArgs{})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1", Generation: 1}, r, "Decide #3")

	resv := DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute}
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1", Reserved: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide with a reservation")
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "reserved", Reserved: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide by the holder before its slot")
	r = e.decide(DecideArgs{})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "queue", Generation: 1}, r, "Decide behind the reservation")
	e.at(500 * time.Millisecond)
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: 0, At: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide by the holder at its slot")

	_, err := Suspend(e.ctx, e.run, e.k, 3*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	r = e.decide(DecideArgs{})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 3 * time.Second, RefusedBy: "suspended", Generation: 1}, r, "Decide while suspended")
}

func TestDecideValidatesDefaultsWithoutStoringThem(t *testing.T) {
	tests := []struct {
		name     string
		defaults []Tier
		want     DecideReply
	}{
		{"none", nil, DecideReply{Status: StatusNoLimits}},
		{"valid", []Tier{{Rate: 1, PerMS: 1000, Burst: 3}}, DecideReply{Status: StatusAllowed, Remaining: 2, At: testEpoch()}},
		{"rate 0", []Tier{{Rate: 0, PerMS: 1000, Burst: 3}}, DecideReply{Status: StatusBadConfig, Field: "default limits[0].N", Reason: "below minimum 1"}},
		{"second per_ms 0", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: 1, PerMS: 0, Burst: 1}}, DecideReply{Status: StatusBadConfig, Field: "default limits[1].Per", Reason: "below minimum 1 ms"}},
		{"burst above 1e9", []Tier{{Rate: 1, PerMS: 1000, Burst: 1_000_000_001}}, DecideReply{Status: StatusBadConfig, Field: "default limits[0].Burst", Reason: "above maximum 1000000000"}},
		{"nine tiers", []Tier{{Rate: 1, PerMS: 1, Burst: 1}, {Rate: 1, PerMS: 2, Burst: 1}, {Rate: 1, PerMS: 3, Burst: 1}, {Rate: 1, PerMS: 4, Burst: 1}, {Rate: 1, PerMS: 5, Burst: 1}, {Rate: 1, PerMS: 6, Burst: 1}, {Rate: 1, PerMS: 7, Burst: 1}, {Rate: 1, PerMS: 8, Burst: 1}, {Rate: 1, PerMS: 9, Burst: 1}}, DecideReply{Status: StatusBadConfig, Field: "default limits", Reason: "more than 8 tiers"}},
		{"same period twice", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: 2, PerMS: 1000, Burst: 2}}, DecideReply{Status: StatusBadConfig, Field: "default limits[1].Per", Reason: "same period and unit as limits[0] (a tier is identified by its kind, period and unit)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			got := e.decide(DecideArgs{Defaults: tt.defaults})
			assert.Equal(t, tt.want, got, "Decide with defaults %+v", tt.defaults)
			assert.False(t, e.mr.Exists(e.k.Bucket) && e.mr.HGet(e.k.Bucket, "L") != "", "Decide with defaults wrote limits")
		})
	}
}

// TestGarbageStateStillDecides: the bucket state, suspension and schedule are in Redis
// too. Whatever is found there, a decision is made without a script error
// and a refusal asks for a wait that is positive and finite.
func TestGarbageStateStillDecides(t *testing.T) {
	tier := Tier{Rate: 10, PerMS: 1000, Burst: 10}
	tests := []struct {
		name  string
		field string
		value string
	}{
		{"T abc", "T", "abc"},
		{"T empty", "T", ""},
		{"T value not a number", "T", "1000:abc"},
		{"T huge", "T", "1700000000000000 1000:99999999999999999999999999"},
		{"T ts only", "T", "1700000000000000 "},
		{"T ts huge", "T", "99999999999999999999999 1000:5"},
		{"T far past", "T", "1 1000:1"},
		{"T other tiers only", "T", "1700000000000000 60000:17000000"},
		{"q abc", "q", "abc"},
		{"q far future", "q", "1.0e300"},
		{"a and V garbage", "V", "1000:x 1000:"},
		{"s abc", "s", "abc"},
		{"s far future", "s", "1.0e300"},
		{"x garbage", "x", "1e300"},
		{"g garbage", "g", "abc"},
		{"g huge", "g", "1e300"},
		{"D garbage", "D", "what"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(tier)
			e.mr.HSet(e.k.Bucket, tt.field, tt.value)
			if tt.field == "V" {
				e.mr.HSet(e.k.Bucket, "q", strconv.FormatInt(testEpoch().Add(time.Minute).UnixMicro(), 10), "a", "zz")
			}
			for _, a := range []DecideArgs{{}, {TaskID: "a", Horizon: time.Minute, Lapse: time.Minute}} {
				r, err := Decide(e.ctx, e.run, e.k, a)
				require.NoError(t, err, "Decide(%+v) with %s", a, tt.name)
				require.Contains(t, []int{StatusAllowed, StatusDenied}, r.Status, "Decide(%+v) with %s: %+v", a, tt.name, r)
				if r.Status == StatusDenied {
					assert.Positive(t, r.RetryAfter, "Decide(%+v) with %s: RetryAfter of a refusal (%+v)", a, tt.name, r)
				}
			}
			_, err := Inspect(e.ctx, e.run, e.k, nil, 0)
			assert.NoError(t, err, "Inspect with %s", tt.name)
			r, err := SetLimits(e.ctx, e.run, e.k, []Tier{tier}, nil)
			assert.NoError(t, err, "SetLimits with %s", tt.name)
			assert.Empty(t, r.Field)
			_, err = Suspend(e.ctx, e.run, e.k, time.Second, time.Hour)
			assert.NoError(t, err, "Suspend with %s", tt.name)
		})
	}
}

// TestDecideRetryAfterRoundsUp: the retry-after is the exact wait rounded up
// to a microsecond, never down, for waits that are not whole microseconds.
func TestDecideRetryAfterRoundsUp(t *testing.T) {
	for _, rate := range []int64{3, 7, 9, 11, 13, 17, 19, 23} {
		e := newEnv(t)
		e.setLimits(Tier{Rate: rate, PerMS: 1000, Burst: 1})
		e.decide(DecideArgs{})
		r := e.decide(DecideArgs{})
		want := time.Duration(math.Ceil(1e6/float64(rate))) * time.Microsecond
		assert.Equal(t, want, r.RetryAfter, "Decide at %d/s right after a take: RetryAfter", rate)
	}
}

// One run of decide.lua for several callers decides exactly as the same
// callers one after the other at the same instant: same replies, same state.
func TestDecideManyEqualsOneByOne(t *testing.T) {
	ids := []string{"", "a", "b", "", "c", "a", "d", "", "e", "f", "g", "h"}
	modes := []DecideArgs{
		{},
		{Horizon: time.Minute, Lapse: time.Minute},
		{Horizon: time.Minute, Granule: time.Second, Lapse: time.Minute},
	}
	for _, mode := range modes {
		t.Run(fmt.Sprintf("horizon %v granule %v", mode.Horizon, mode.Granule), func(t *testing.T) {
			one, many := newEnv(t), newEnv(t)
			for _, e := range []*env{one, many} {
				e.setLimits(Tier{Rate: 4, PerMS: 1000, Burst: 3}, Tier{Rate: 30, PerMS: 60000, Burst: 5})
			}
			var want []string
			for _, id := range ids {
				a := mode
				a.TaskID = id
				args := AppendCallers(AppendDecideArgs(nil, ModeEval, one.k, a), id, 1)
				s, err := one.run.Do(one.ctx, DecideScript, args)
				require.NoError(t, err)
				want = append(want, s)
			}
			args := AppendDecideArgs(nil, ModeEval, many.k, mode)
			for _, id := range ids {
				args = append(args, id, 1)
			}
			s, err := many.run.Do(many.ctx, DecideScript, args)
			require.NoError(t, err)
			var got []string
			for s != "" {
				var r string
				r, s = NextReply(s)
				got = append(got, r)
			}
			assert.Equal(t, want, got, "one run for %d callers", len(ids))
			assert.Contains(t, want, fmt.Sprintf("1|0|0||%d|0|1", testEpoch().UnixMicro()), "the limits never bound: the test proves little")
			// The expiry memo (x, T's second double) may differ: one write
			// sets it once.
			noX := func(e *env) string {
				if T := e.mr.HGet(e.k.Bucket, "T"); len(T) >= 24 {
					e.mr.HSet(e.k.Bucket, "T", T[:8]+strings.Repeat("\x00", 8)+T[16:])
				}
				return e.mr.Dump()
			}
			assert.Equal(t, noX(one), noX(many), "Redis after one run vs one by one")
		})
	}
}

// A lease takes extra tokens for the caller's process only while every tier
// keeps at least the lease size behind, and never more than the bucket holds.
func TestDecideLeasesOnlyWhatEveryTierCanSpare(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 20}, Tier{Rate: 1000, PerMS: 60000, Burst: 1000})
	var extras []int64
	taken := int64(0)
	for range 30 {
		r := e.decide(DecideArgs{Lease: 8})
		if r.Status != StatusAllowed {
			break
		}
		extras = append(extras, r.Lease)
		taken += 1 + r.Lease
	}
	// 20 tokens: 1+7 (12 left), 1+3 (8 left), then one at a time.
	assert.Equal(t, []int64{7, 3, 0, 0, 0, 0, 0, 0, 0, 0}, extras, "extra tokens per decision")
	assert.Equal(t, int64(20), taken, "tokens taken from a burst of 20")
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.InDelta(t, 0, r.Tokens[0], 1e-6, "tokens left")

	// Without a lease (or a lease of 1) every decision takes one token.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 20})
	for _, lease := range []int{0, 1} {
		r := e2.decide(DecideArgs{Lease: lease})
		assert.Equal(t, StatusAllowed, r.Status)
		assert.Zero(t, r.Lease, "Lease %d", lease)
	}
}

// A cost takes that many tokens of every tier, all or none; a cost above a
// tier's burst is refused for good.
func TestDecideTakesTheCostFromEveryTier(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	r := e.decide(DecideArgs{Cost: 7})
	assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: 3, At: testEpoch(), Generation: 1}, r)
	r = e.decide(DecideArgs{Cost: 4})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 100 * time.Millisecond, RefusedBy: "tier:1", Generation: 1}, r, "4 of 3")
	r = e.decide(DecideArgs{Cost: 11})
	assert.Equal(t, DecideReply{Status: StatusCostTooHigh, Field: "1", Reason: "10", TooHigh: Tier{Rate: 10, PerMS: 1000, Burst: 10}}, r, "a cost above the burst")
	// Reserved with a cost: the slot is spaced for it.
	r = e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, Cost: 5})
	assert.Equal(t, testEpoch().Add(200*time.Millisecond), r.Reserved, "5 tokens, 3 there, at 10/s")
	r = e.decide(DecideArgs{TaskID: "b", Horizon: time.Minute, Lapse: time.Minute, Cost: 5})
	assert.Equal(t, testEpoch().Add(700*time.Millisecond), r.Reserved, "then 5 more")
}

// Paced, a holder back in the granule before its slot is admitted at the
// slot and told to wait for it; slots are exact instants, so a backlog
// under a burst below its rate per second drains at the rate.
func TestDecidePacesHoldersToExactInstants(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 5})
	a := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true}
	for range 5 {
		require.Equal(t, StatusAllowed, e.decide(a).Status)
	}
	var slots []time.Time
	for i := range 40 {
		a.TaskID = fmt.Sprint(i)
		r := e.decide(a)
		require.Equal(t, StatusDenied, r.Status)
		slots = append(slots, r.Reserved)
	}
	assert.Equal(t, testEpoch().Add(25*time.Millisecond), slots[0], "the first slot: one token at 40/s")
	assert.Equal(t, testEpoch().Add(time.Second), slots[39], "40 more in the next second, not 5")
	// The holders of one granule come back together on its whole second,
	// in any order, and take their turns first come first served: the
	// holder of slot 20 first, then the holder of slot 3.
	e.at(0)
	a.TaskID = "20"
	r := e.decide(a)
	assert.Equal(t, StatusAllowed, r.Status, "holder back before its paced slot: %+v", r)
	assert.Equal(t, 25*time.Millisecond, r.Wait, "told to wait for the first instant every tier admits it")
	a.TaskID = "3"
	r = e.decide(a)
	assert.Equal(t, StatusAllowed, r.Status, "the next holder: %+v", r)
	assert.Equal(t, 50*time.Millisecond, r.Wait, "and the next instant")
}

// A holder that waits in its worker and asks again (Near, the middleware)
// is admitted at most NearAhead before the instant its call is counted
// at, on a key with units: back earlier, it is told to wait for its
// instant, and nothing of the key is counted for it, so the room before
// that instant stays usable. In TestDecidePacesHoldersToExactInstants's
// backlog (here with a tokens tier that never binds), holder 20 back at 0
// was admitted at 25 ms, ahead of the holder of that slot (pushed to
// 50 ms); with Near it waits for its own slot (525 ms) and the holder of
// 25 ms takes it. A holder due whose tiers have room only later than
// NearAhead is told how long until they do. On a key without units, Near
// changes nothing.
func TestDecideNearHolderWaitsForItsInstantAndAsksAgain(t *testing.T) {
	tokens := Tier{Rate: 1_000_000, PerMS: 1000, Burst: 1_000_000, Unit: "tokens"}
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 5}, tokens)
	a := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true, Units: "tokens=1"}
	for range 5 {
		require.Equal(t, StatusAllowed, e.decide(a).Status)
	}
	slots := map[string]time.Time{}
	for i := range 40 {
		a.TaskID = fmt.Sprint(i)
		r := e.decide(a)
		require.Equal(t, StatusDenied, r.Status)
		slots[a.TaskID] = r.Reserved
	}
	e.at(0)
	a.Near = true
	a.TaskID = "20"
	r := e.decide(a)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 525 * time.Millisecond, RefusedBy: "near", Reserved: slots["20"], Generation: 1}, r,
		"holder 20, back 525 ms before its slot: told to wait for it")
	a.TaskID = "0"
	r = e.decide(a)
	assert.Equal(t, StatusAllowed, r.Status, "the holder of the first slot: %+v", r)
	assert.Equal(t, 25*time.Millisecond, r.Wait, "its own slot: holder 20 took nothing")
	a.TaskID = "4"
	r = e.decide(a)
	assert.Equal(t, StatusDenied, r.Status, "holder 4, its slot 125 ms ahead: %+v", r)
	assert.Equal(t, "near", r.RefusedBy)
	assert.Equal(t, 125*time.Millisecond, r.RetryAfter)
	a.TaskID = "3"
	r = e.decide(a)
	assert.Equal(t, StatusAllowed, r.Status, "holder 3, its slot 100 ms ahead (NearAhead): %+v", r)
	assert.Equal(t, 50*time.Millisecond, r.Wait, "at the bucket's next token, after holder 0's")

	// Holder 20 at its slot: admitted. The holders before it never came, so
	// its tiers have room, and 21 and 22, 25 and 50 ms ahead, are admitted
	// within NearAhead.
	e.at(525 * time.Millisecond)
	for _, id := range []string{"20", "21", "22"} {
		a.TaskID = id
		r = e.decide(a)
		require.Equal(t, StatusAllowed, r.Status, "holder %s: %+v", id, r)
		assert.LessOrEqual(t, r.Wait, NearAhead, "holder %s", id)
	}

	// A holder due whose tiers have room only later than NearAhead: told
	// how long until they do, its reservation kept.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 1, PerMS: 1000, Burst: 1}, tokens)
	b := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true, Units: "tokens=1"}
	require.Equal(t, StatusAllowed, e2.decide(b).Status)
	b.TaskID = "h"
	require.Equal(t, testEpoch().Add(time.Second), e2.decide(b).Reserved)
	b.TaskID = "g"
	require.Equal(t, testEpoch().Add(2*time.Second), e2.decide(b).Reserved)
	e2.at(2 * time.Second)
	b.TaskID, b.Near = "h", true
	require.Equal(t, StatusAllowed, e2.decide(b).Status, "h, late, takes the token of 2 s")
	b.TaskID = "g"
	r = e2.decide(b)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "near", Reserved: testEpoch().Add(2 * time.Second), Generation: 1}, r,
		"g, due, its tier's next token a second away")
	b.Near = false
	r = e2.decide(b)
	assert.Equal(t, StatusAllowed, r.Status, "without Near: admitted a second ahead, as before: %+v", r)
	assert.Equal(t, time.Second, r.Wait)

	// A key without units books its schedule exactly: Near changes nothing.
	e3 := newEnv(t)
	e3.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 5})
	c := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true}
	for range 5 {
		require.Equal(t, StatusAllowed, e3.decide(c).Status)
	}
	for i := range 40 {
		c.TaskID = fmt.Sprint(i)
		require.Equal(t, StatusDenied, e3.decide(c).Status)
	}
	e3.at(0)
	c.TaskID, c.Near = "20", true
	r = e3.decide(c)
	assert.Equal(t, StatusAllowed, r.Status, "holder 20 on a key without units: admitted ahead, as without Near: %+v", r)
	assert.Equal(t, 25*time.Millisecond, r.Wait)
}

// Booking (enqueue-time throttling) reserves a slot even for a caller that
// could run now, and the holder is admitted against it.
func TestDecideBookingReservesASlotEvenWhenFree(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	a := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Book: true}
	var slots []time.Duration
	for i := range 4 {
		a.TaskID = fmt.Sprint(i)
		r := e.decide(a)
		require.Equal(t, StatusDenied, r.Status, "a booking is never admitted: %+v", r)
		slots = append(slots, r.Reserved.Sub(testEpoch()))
	}
	assert.Equal(t, []time.Duration{0, 0, time.Second, time.Second}, slots, "two now, two in a second")
	a.Book = false
	a.TaskID = "0"
	assert.Equal(t, StatusAllowed, e.decide(a).Status, "the holder of a slot now")
	a.TaskID = "x"
	assert.Equal(t, StatusDenied, e.decide(a).Status, "a fresh caller waits behind the bookings")
}

// An in-flight limit is taken in the same decision as the tiers: a slot
// and a token, or nothing. A released slot goes to the next caller; a slot
// whose lease ended is taken back; a caller refused a slot is told when one
// is expected to free, callers refused later told later.
func TestDecideTakesASlotInFlightWithTheTokens(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100}, Tier{Kind: KindInFlight, Rate: 2})
	a := DecideArgs{SlotExpiry: 10 * time.Second}
	r1, r2 := e.decide(a), e.decide(a)
	require.Equal(t, StatusAllowed, r1.Status)
	require.Equal(t, StatusAllowed, r2.Status)
	assert.NotEmpty(t, r1.Slot)
	assert.NotEqual(t, r1.Slot, r2.Slot, "each holder its own slot")
	r := e.decide(a)
	assert.Equal(t, StatusDenied, r.Status, "a third caller: %+v", r)
	assert.Equal(t, "inflight", r.RefusedBy)
	// Before any release there is no run time to predict from: waiters
	// are sent one guess (a second) ahead at most, and come back to ask.
	assert.Equal(t, time.Second, r.RetryAfter, "no release seen yet")
	r = e.decide(a)
	assert.Equal(t, time.Second, r.RetryAfter, "the guess is not queued on")
	insp, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(2), insp.InFlight)
	assert.Equal(t, int64(2), insp.InFlightMax)
	assert.InDelta(t, 98, insp.Tokens[0], 1e-6, "the refused callers took no token")

	// One held for 2 s is given back: the next caller gets its slot, and the
	// key learns how long slots are held.
	e.at(2 * time.Second)
	n, err := Release(e.ctx, e.run, e.k, r1.Slot)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	r3 := e.decide(a)
	assert.Equal(t, StatusAllowed, r3.Status, "after a release")
	// Slots are held 2 s on average: the one taken at 0 s is expected free
	// now (a waiter comes back at once), the one taken at 2 s in 2 s; the
	// waiter after those two comes back when the first of theirs is.
	r = e.decide(a)
	assert.Equal(t, StatusDenied, r.Status)
	assert.Equal(t, 50*time.Millisecond, r.RetryAfter, "the slot held since 0 s, expected free now (polled 50 ms on)")
	r = e.decide(a)
	assert.Equal(t, 2*time.Second, r.RetryAfter, "the slot taken at 2 s, expected free at 4 s")
	r = e.decide(a)
	assert.Equal(t, 2*time.Second+50*time.Millisecond, r.RetryAfter, "a caller refused later is told later")

	// A holder that stops renewing (killed) loses its slot when the lease
	// ends; one that renews keeps it.
	e.at(11 * time.Second)
	got, err := Extend(e.ctx, e.run, e.k, 10*time.Second, r3.Slot)
	require.NoError(t, err)
	assert.Equal(t, int64(1), got, "r3 renewed")
	e.at(13 * time.Second)
	assert.Equal(t, StatusAllowed, e.decide(a).Status, "r2's lease ended: its slot is taken back")
	assert.Equal(t, StatusDenied, e.decide(a).Status, "r3 still holds its slot")
}

// TestStateMemoIsCompact: the key's expiry memo in T is kept in ms after the
// state's own timestamp, so that a busy two-tier key's T stays within the 64
// bytes of a compact Redis hash.
func TestStateMemoIsCompact(t *testing.T) {
	tiers := []Tier{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Rate: 100000, PerMS: 3_600_000, Burst: 100000}}
	a := DecideArgs{Cost: 7}
	fresh := newEnv(t)
	fresh.setLimits(tiers...)
	for i := 0; i < 5; i++ {
		fresh.at(time.Duration(i) * 123457 * time.Microsecond)
		fresh.decide(a)
	}
	T := fresh.mr.HGet(fresh.k.Bucket, "T")
	assert.Less(t, len(T), 64, "T of a busy two-tier key: %q", T)
	f := decodeT(t, T)
	ts, x := int64(f[0]), int64(f[1])
	ttl := fresh.mr.TTL(fresh.k.Bucket)
	require.Positive(t, ttl, "the key's TTL")
	// (miniredis counts a TTL down only on FastForward: the TTL read is
	// the one set at the first call, at testEpoch, which the memo renews
	// no sooner than 1/8 of the idle expiry later.) The memo is the time
	// the expiry was set for, which PEXPIRE rounds up to a ms: never later
	// than the expiry, so a renewal is never skipped.
	expiry := testEpoch().UnixMicro() + ttl.Microseconds()
	assert.LessOrEqual(t, x, expiry, "the memo (T = %v) is not after the key's expiry", f)
	assert.InDelta(t, expiry, x, 5*1000, "the memo (T = %v) is the key's expiry, within a ms per write", f)
	assert.Equal(t, ts, testEpoch().UnixMicro()+4*123457, "T's time: the last decision's")

}

// TestDecideLeasesNothingOnAWindow: a key with a window tier grants no lease. A
// leased call the process does not make in time is lost for a whole window
// (a bucket has it back in 1/rate): scenario E's fleet, starting on a fresh
// window of 100 per 2 s, made 46 calls in it and lost the rest to leases.
func TestDecideLeasesNothingOnAWindow(t *testing.T) {
	for _, tiers := range [][]Tier{
		{{Kind: KindWindow, Rate: 100, PerMS: 2000}},
		{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Kind: KindWindow, Rate: 100000, PerMS: 60000}},
	} {
		e := newEnv(t)
		e.setLimits(tiers...)
		for i := range 10 {
			r := e.decide(DecideArgs{Lease: 64})
			require.Equal(t, StatusAllowed, r.Status, "decision %d on %+v", i, tiers)
			assert.Zero(t, r.Lease, "tokens leased on %+v", tiers)
		}
	}
}
