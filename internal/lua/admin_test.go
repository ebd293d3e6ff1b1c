package lua

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetLimitsRefusesBadTiersWritingNothing(t *testing.T) {
	tests := []struct {
		name          string
		tiers         []Tier
		field, reason string
	}{
		{"no tiers", nil, "limits", "no tiers"},
		{"nine tiers", []Tier{{Rate: 1, PerMS: 1, Burst: 1}, {Rate: 1, PerMS: 2, Burst: 1}, {Rate: 1, PerMS: 3, Burst: 1}, {Rate: 1, PerMS: 4, Burst: 1}, {Rate: 1, PerMS: 5, Burst: 1}, {Rate: 1, PerMS: 6, Burst: 1}, {Rate: 1, PerMS: 7, Burst: 1}, {Rate: 1, PerMS: 8, Burst: 1}, {Rate: 1, PerMS: 9, Burst: 1}}, "limits", "more than 8 tiers"},
		{"rate 0", []Tier{{Rate: 0, PerMS: 1000, Burst: 1}}, "limits[0].N", "below minimum 1"},
		{"per_ms 0", []Tier{{Rate: 1, PerMS: 0, Burst: 1}}, "limits[0].Per", "below minimum 1 ms"},
		{"per_ms above 30 days", []Tier{{Rate: 1, PerMS: 30*24*3600*1000 + 1, Burst: 1}}, "limits[0].Per", "above maximum 2592000000 ms"},
		{"burst 0", []Tier{{Rate: 1, PerMS: 1000, Burst: 0}}, "limits[0].Burst", "below minimum 1"},
		{"rate above 1e6/s", []Tier{{Rate: 1_000_001, PerMS: 1000, Burst: 1}}, "limits[0].N", "above maximum 1000000 per second"},
		{"second tier negative", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: -1, PerMS: 60000, Burst: 1}}, "limits[1]", `want rate/per_ms/burst in whole numbers, got "-1/60000/1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			r, err := SetLimits(e.ctx, e.run, e.k, tt.tiers, nil)
			require.NoError(t, err, "SetLimits(%+v)", tt.tiers)
			assert.Equal(t, tt.field, r.Field, "SetLimits(%+v): field", tt.tiers)
			assert.Equal(t, tt.reason, r.Reason, "SetLimits(%+v): reason", tt.tiers)
			assert.Empty(t, e.mr.Keys(), "SetLimits(%+v) wrote to Redis", tt.tiers)
		})
	}
}

func TestSetLimitsReplacesTheStoredLimits(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 5, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.setLimits(Tier{Rate: 3, PerMS: 1500, Burst: 2}) // replaces, not merges
	got, err := e.rdb.HGetAll(e.ctx, e.k.Bucket).Result()
	require.NoError(t, err, "HGETALL %s", e.k.Bucket)
	assert.Equal(t, "3/1500/2 #2", got["L"], "limits, generation after two SetLimits")
	assert.Equal(t, "3/1500/2 #2", e.mr.HGet(e.k.Config, "L"), "the configuration's copy")
	assert.Zero(t, e.mr.TTL(e.k.Config), "the configuration is kept until Delete")
	assert.Positive(t, e.mr.TTL(e.k.Bucket), "the hash lives with its state")
}

// A tier is identified by its period: whatever SetLimits does with the
// list (reorder, add in front, drop others, change rate or burst), a tier's
// tokens stay with it, clamped to a lower burst and never refilled by a raise.
func TestSetLimitsKeepsEachTiersTokensByPeriod(t *testing.T) {
	sec := Tier{Rate: 1000, PerMS: 1000, Burst: 1000}
	hour := Tier{Rate: 10, PerMS: 3_600_000, Burst: 10}
	tests := []struct {
		name  string
		after []Tier
	}{
		{"reordered", []Tier{hour, sec}},
		{"tier added in front", []Tier{{Rate: 100, PerMS: 60000, Burst: 100}, sec, hour}},
		{"first tier dropped", []Tier{hour}},
		{"hourly rate raised", []Tier{sec, {Rate: 20, PerMS: 3_600_000, Burst: 20}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(sec, hour)
			admitted := 0
			for range 20 {
				if e.decide(DecideArgs{}).Status == StatusAllowed {
					admitted++
				}
			}
			require.Equal(t, 10, admitted, "the hourly tier admits its burst")
			e.setLimits(tt.after...)
			e.at(200 * time.Millisecond)
			r := e.decide(DecideArgs{})
			assert.Equal(t, StatusDenied, r.Status, "a used-up hourly tier admitted after SetLimits(%v): %+v", tt.after, r)
		})
	}
}

// SetLimits from a caller that does not know the defaults the buckets were
// computed under still carries their tokens over (the D field), clamps them
// and keeps the key until its bucket is full again.
func TestSetLimitsCarriesTokensOverFromOtherDefaults(t *testing.T) {
	e := newEnv(t)
	defaults := []Tier{{Rate: 60, PerMS: 60000, Burst: 10}}
	for range 10 {
		require.Equal(t, StatusAllowed, e.decide(DecideArgs{Defaults: defaults}).Status)
	}
	sr, err := SetLimits(e.ctx, e.run, e.k, []Tier{{Rate: 1, PerMS: 60000, Burst: 1}}, nil)
	require.NoError(t, err)
	require.Empty(t, sr.Field)
	assert.GreaterOrEqual(t, e.mr.TTL(e.k.Bucket), 2*time.Minute, "TTL: until the bucket is full again, at least")
	e.at(2 * time.Second)
	r := e.decide(DecideArgs{})
	assert.Equal(t, StatusDenied, r.Status, "an exhausted bucket lowered to 1/min admitted after 2 s: %+v", r)
	// 0 tokens kept, clamped to the new burst of 1: the next one comes a
	// minute after the change.
	assert.Equal(t, 58*time.Second, r.RetryAfter, "retry after lowering")
}

func TestSuspendExtendsNeverShortensAndIsCapped(t *testing.T) {
	e := newEnv(t)
	steps := []struct {
		at     time.Duration // since epoch
		d, max time.Duration
		want   time.Duration
	}{
		{0, 10 * time.Second, time.Hour, 10 * time.Second},
		{2 * time.Second, time.Second, time.Hour, 8 * time.Second}, // never shortens
		{2 * time.Second, time.Minute, time.Hour, time.Minute},     // extends
		{2 * time.Second, 2 * time.Hour, time.Hour, time.Hour},     // capped
		{3 * time.Second, 2 * time.Hour, 30 * time.Second, time.Hour - time.Second},
	}
	for _, s := range steps {
		e.at(s.at)
		got, err := Suspend(e.ctx, e.run, e.k, s.d, s.max)
		require.NoError(t, err, "Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
		assert.Equal(t, s.want, got, "Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
		assert.GreaterOrEqual(t, e.mr.TTL(e.k.Bucket), s.want, "key TTL after Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
	}
	assert.Equal(t, strconv.FormatInt(testEpoch().Add(time.Hour+2*time.Second).UnixMicro(), 10), e.mr.HGet(e.k.Bucket, "s"), "suspended until (us)")

	// A stored end beyond any honest wait is replaced, not kept.
	e.mr.HSet(e.k.Bucket, "s", "1e300")
	got, err := Suspend(e.ctx, e.run, e.k, time.Second, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, time.Second, got, "Suspend over a garbage end")
}

// Resume ends the suspension and the schedule built during it: fresh
// callers run at once, and a former slot holder is decided by the buckets.
func TestResumeEndsTheSuspensionAndItsSchedule(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	_, err := Suspend(e.ctx, e.run, e.k, time.Hour, time.Hour)
	require.NoError(t, err)
	resv := DecideArgs{TaskID: "a", Horizon: 2 * time.Hour, Lapse: time.Minute}
	r := e.decide(resv)
	require.Equal(t, "suspended", r.RefusedBy)
	require.False(t, r.Reserved.IsZero(), "a slot after the suspension")

	res, err := Resume(e.ctx, e.run, e.k, nil)
	require.NoError(t, err)
	assert.Equal(t, time.Hour, res.Left, "Resume reports what was left")
	assert.Equal(t, []string{"a"}, res.Reserved, "Resume names the tasks that held a reservation")
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{}).Status, "a fresh caller after Resume")
	assert.Equal(t, StatusAllowed, e.decide(resv).Status, "the former slot holder after Resume")
	assert.False(t, e.mr.Exists(e.k.Reservations), "reservations after Resume")

	res, err = Resume(e.ctx, e.run, e.k, nil)
	require.NoError(t, err)
	assert.Zero(t, res.Left, "Resume of a key not suspended")
}

func TestInspectReportsTheStateWithoutWriting(t *testing.T) {
	e := newEnv(t)
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err, "Inspect without limits")
	assert.Equal(t, InspectReply{Status: StatusNoLimits}, r, "Inspect without limits")

	r, err = Inspect(e.ctx, e.run, e.k, []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, 0)
	require.NoError(t, err, "Inspect with defaults")
	assert.Equal(t, InspectReply{Status: StatusAllowed, Tiers: []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, Tokens: []float64{4},
		Configured: []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, LearnedFor: []time.Duration{0}, AdaptiveFactor: 1}, r, "Inspect with defaults")

	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.decide(DecideArgs{})
	_, err = Suspend(e.ctx, e.run, e.k, 5*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute})
	before := e.mr.Dump()
	r, err = Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err, "Inspect")
	assert.Equal(t, InspectReply{
		Status: StatusAllowed, Suspended: 5 * time.Second, Reservations: 1,
		QueuedFor: 5*time.Second + 600*time.Millisecond, FromRedis: true, Generation: 1,
		Tiers:      []Tier{{Rate: 10, PerMS: 1000, Burst: 10}, {Rate: 100, PerMS: 60000, Burst: 100}},
		Tokens:     []float64{9, 99},
		Configured: []Tier{{Rate: 10, PerMS: 1000, Burst: 10}, {Rate: 100, PerMS: 60000, Burst: 100}},
		LearnedFor: []time.Duration{0, 0}, AdaptiveFactor: 1,
	}, r, "Inspect")
	assert.Equal(t, before, e.mr.Dump(), "Inspect wrote to Redis")

	e.mr.HSet(e.k.Bucket, "L", "10/1000/10 100/60000/NaN")
	r, err = Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err, "Inspect with a bad config")
	assert.Equal(t, InspectReply{Status: StatusBadConfig, Field: "limits[1]", Reason: `want rate/per_ms/burst in whole numbers, got "100/60000/NaN"`}, r, "Inspect with a bad config")
}

// Adjust settles a cost after the fact: every tier takes or gives back the
// difference, a bucket never above its burst; a window counts a surcharge
// at now, and takes a refund back only from the sub-window the call was
// counted in (nothing without it), never below zero.
func TestAdjustSettlesACostAfterTheFact(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10}, Tier{Kind: KindWindow, Rate: 20, PerMS: 60000})
	r := e.decide(DecideArgs{Cost: 4})
	require.Equal(t, StatusAllowed, r.Status)
	require.Equal(t, testEpoch(), r.At, "an admission says when it was admitted")
	tokens := func() []float64 {
		t.Helper()
		r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
		require.NoError(t, err)
		return r.Tokens
	}
	assert.Equal(t, []float64{6, 16}, tokens(), "after a cost of 4")
	e.at(10 * time.Second) // the bucket is full again; the window is another sub-window on
	require.NoError(t, Adjust(e.ctx, e.run, e.k, 3, Call{Generation: -1}, nil))
	assert.Equal(t, []float64{7, 13}, tokens(), "charged 3 more")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -5, Call{Generation: -1}, nil))
	assert.Equal(t, []float64{7, 13}, tokens(), "a refund of no known call gives nothing back")
	call := Call{At: r.At, Charged: 4, Generation: r.Generation}
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -3, call, nil))
	assert.Equal(t, []float64{7, 16}, tokens(), "the call's debit was refilled 10 s ago; the window gives 3 back in the sub-window of the call")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -3, Call{At: r.At, Charged: 4, Generation: r.Generation + 1}, nil))
	assert.Equal(t, []float64{7, 16}, tokens(), "a call admitted under other limits: nothing back")

	// A refund right after the call gives the bucket back what the refill
	// has not paid yet of the call's own debit.
	r = e.decide(DecideArgs{Cost: 5})
	require.Equal(t, StatusAllowed, r.Status)
	e.at(10*time.Second + 200*time.Millisecond) // 2 tokens refilled since
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -4, Call{At: r.At, Charged: 5, Generation: r.Generation}, nil))
	assert.InDeltaSlice(t, []float64{6, 15}, tokens(), 1e-9, "4 of the 5 taken come back less the 2 refilled since: 2 to the bucket")
}

// A refund never lets a window hold more than N real calls: it comes out of
// the sub-window where the refunded call was counted, not the latest one.
// (Regression: on Window(10, 1s), 5 calls admitted at 0 ms whose real cost
// was 0, 5 more at 902 ms, the refund at 954 ms, and at 1102 ms 10 more
// were admitted: 15 real calls within 200 ms.)
func TestAdjustRefundComesOutOfTheCallsSubWindow(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 1000})
	a := DecideArgs{}
	var real []time.Duration // instants of the calls actually made
	takeAt := func(at time.Duration, n int) int {
		e.at(at)
		allowed := 0
		for range n {
			if e.decide(a).Status == StatusAllowed {
				allowed++
				real = append(real, at)
			}
		}
		return allowed
	}
	a.Cost = 5
	refunded := e.decide(a)
	require.Equal(t, StatusAllowed, refunded.Status, "5 at 0 ms")
	a.Cost = 1
	require.Equal(t, 5, takeAt(902*time.Millisecond, 5), "5 at 902 ms")
	e.at(954 * time.Millisecond)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -5, Call{At: refunded.At, Charged: 5, Generation: refunded.Generation}, nil), "the first call's real cost was 0")
	takeAt(954*time.Millisecond, 20)
	takeAt(1102*time.Millisecond, 20)
	takeAt(1500*time.Millisecond, 20)
	for i, x := range real {
		n := 0
		for _, y := range real[i:] {
			if y-x < time.Second {
				n++
			}
		}
		assert.LessOrEqual(t, n, 10, "real calls in the second from %v (all: %v)", x, real)
	}
	assert.Len(t, real, 10, "the refund made room for 5 more, no more, within a second of 902 ms: %v", real)
}

// TestInspectDoesNotCountLapsedReservations: a reservation whose task never
// came back lapses; it is swept only when the next one is added, and
// Inspect, told the lapse, does not count it meanwhile.
func TestInspectDoesNotCountLapsedReservations(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 1, PerMS: 1000, Burst: 1})
	a := DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute}
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{}).Status)
	r := e.decide(a)
	require.Equal(t, StatusDenied, r.Status)
	require.False(t, r.Reserved.IsZero(), "a reserves a slot: %+v", r)
	count := func(lapse time.Duration) int64 {
		t.Helper()
		st, err := Inspect(e.ctx, e.run, e.k, nil, lapse)
		require.NoError(t, err)
		return st.Reservations
	}
	assert.Equal(t, int64(1), count(time.Minute), "outstanding")
	e.at(2 * time.Minute) // a never came back: past its slot and the lapse
	assert.Equal(t, int64(0), count(time.Minute), "lapsed, not yet swept")
	assert.Equal(t, int64(1), count(0), "lapse 0 counts every entry")
}
