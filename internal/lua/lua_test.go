package lua

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKeys are the keys of limiter key "k" as the throttle package derives
// them; the scripts care only that they are passed in KEYS.
func testKeys() Keys {
	return Keys{Bucket: "t:{k}:b", Reservations: "t:{k}:r", Slots: "t:{k}:f"}
}

func testEpoch() time.Time { return time.Unix(1_700_000_000, 0) }

type env struct {
	t   *testing.T
	mr  *miniredis.Miniredis
	rdb *redis.Client
	run *Runner
	ctx context.Context
	k   Keys
}

// newEnv runs the scripts on miniredis (EVAL: miniredis has no functions)
// with its clock set to testEpoch.
func newEnv(t *testing.T) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(testEpoch())
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return &env{t: t, mr: mr, rdb: rdb, run: NewRunner(rdb), ctx: context.Background(), k: testKeys()}
}

func (e *env) decide(a DecideArgs) DecideReply {
	e.t.Helper()
	r, err := Decide(e.ctx, e.run, e.k, a)
	require.NoError(e.t, err, "Decide(%+v)", a)
	return r
}

func (e *env) setLimits(tiers ...Tier) {
	e.t.Helper()
	r, err := SetLimits(e.ctx, e.run, e.k, time.Hour, tiers, nil)
	require.NoError(e.t, err, "SetLimits(%+v)", tiers)
	require.Empty(e.t, r.Field, "SetLimits(%+v): field (reason %q)", tiers, r.Reason)
}

func (e *env) at(d time.Duration) { e.mr.SetTime(testEpoch().Add(d)) }

func TestNum(t *testing.T) {
	tests := []struct {
		in   any
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"123", 123, true},
		{"-5", -5, true},
		{"1700000000000000", 1_700_000_000_000_000, true},
		{"1.5", 1, true},
		{"2.9999999999999996", 2, true},
		{"1e+15", 1_000_000_000_000_000, true},
		{int64(5), 5, true},
		{"abc", 0, false},
		{"", 0, false},
		{"NaN", 0, false},
		{"+Inf", 0, false},
		{"-Inf", 0, false},
		{"1e+300", 0, false},
		{"-1e+300", 0, false},
		{"1.7976931348623157e+308", 0, false},
		{5.0, 0, false},
		{nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := num(tt.in)
		assert.Equal(t, tt.ok, ok, "num(%#v): ok (got %d)", tt.in, got)
		if tt.ok {
			assert.Equal(t, tt.want, got, "num(%#v)", tt.in)
		}
	}
}

func TestFormatTiers(t *testing.T) {
	assert.Equal(t, "", FormatTiers(nil))
	assert.Equal(t, "10/1000/20 50/60000/50", FormatTiers([]Tier{{Rate: 10, PerMS: 1000, Burst: 20}, {Rate: 50, PerMS: 60000, Burst: 50}}))
}

func TestParseDecide(t *testing.T) {
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

func TestParseDecideAllocs(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseDecide("0|1000000|0|tier:1|1700000001000000|0|2"); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "ParseDecide allocates")
}

func TestDecide(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	for i, want := range []int64{1, 0} {
		r := e.decide(DecideArgs{IdleExpiry: time.Hour})
		assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: want, At: testEpoch(), Generation: 1}, r, "Decide #%d", i+1)
	}
	r := e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1", Generation: 1}, r, "Decide #3")

	resv := DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour}
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1", Reserved: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide with a reservation")
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "reserved", Reserved: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide by the holder before its slot")
	r = e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "queue", Generation: 1}, r, "Decide behind the reservation")
	e.at(500 * time.Millisecond)
	r = e.decide(resv)
	assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: 0, At: testEpoch().Add(500 * time.Millisecond), Generation: 1}, r, "Decide by the holder at its slot")

	_, err := Suspend(e.ctx, e.run, e.k, 3*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	r = e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 3 * time.Second, RefusedBy: "suspended", Generation: 1}, r, "Decide while suspended")
}

func TestDecide_Defaults(t *testing.T) {
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
		{"five tiers", []Tier{{Rate: 1, PerMS: 1, Burst: 1}, {Rate: 1, PerMS: 2, Burst: 1}, {Rate: 1, PerMS: 3, Burst: 1}, {Rate: 1, PerMS: 4, Burst: 1}, {Rate: 1, PerMS: 5, Burst: 1}}, DecideReply{Status: StatusBadConfig, Field: "default limits", Reason: "more than 4 tiers"}},
		{"same period twice", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: 2, PerMS: 1000, Burst: 2}}, DecideReply{Status: StatusBadConfig, Field: "default limits[1].Per", Reason: "same period as limits[0] (a tier is identified by its period)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			got := e.decide(DecideArgs{Defaults: tt.defaults, IdleExpiry: time.Hour})
			assert.Equal(t, tt.want, got, "Decide with defaults %+v", tt.defaults)
			assert.False(t, e.mr.Exists(e.k.Bucket) && e.mr.HGet(e.k.Bucket, "L") != "", "Decide with defaults wrote limits")
		})
	}
}

func TestSetLimits_Validation(t *testing.T) {
	tests := []struct {
		name          string
		tiers         []Tier
		field, reason string
	}{
		{"no tiers", nil, "limits", "no tiers"},
		{"five tiers", []Tier{{Rate: 1, PerMS: 1, Burst: 1}, {Rate: 1, PerMS: 2, Burst: 1}, {Rate: 1, PerMS: 3, Burst: 1}, {Rate: 1, PerMS: 4, Burst: 1}, {Rate: 1, PerMS: 5, Burst: 1}}, "limits", "more than 4 tiers"},
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
			r, err := SetLimits(e.ctx, e.run, e.k, time.Hour, tt.tiers, nil)
			require.NoError(t, err, "SetLimits(%+v)", tt.tiers)
			assert.Equal(t, tt.field, r.Field, "SetLimits(%+v): field", tt.tiers)
			assert.Equal(t, tt.reason, r.Reason, "SetLimits(%+v): reason", tt.tiers)
			assert.Empty(t, e.mr.Keys(), "SetLimits(%+v) wrote to Redis", tt.tiers)
		})
	}
}

func TestSetLimits_Stores(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 5, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.setLimits(Tier{Rate: 3, PerMS: 1500, Burst: 2}) // replaces, not merges
	got, err := e.rdb.HGetAll(e.ctx, e.k.Bucket).Result()
	require.NoError(t, err, "HGETALL %s", e.k.Bucket)
	assert.Equal(t, "3/1500/2 #2", got["L"], "limits, generation after two SetLimits")
	assert.Equal(t, time.Hour, e.mr.TTL(e.k.Bucket), "bucket TTL: the idle expiry")
}

// A tier is identified by its period: whatever SetLimits does with the
// list (reorder, add in front, drop others, change rate or burst), a tier's
// tokens stay with it, clamped to a lower burst and never refilled by a raise.
func TestSetLimits_TierIdentity(t *testing.T) {
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
				if e.decide(DecideArgs{IdleExpiry: time.Hour}).Status == StatusAllowed {
					admitted++
				}
			}
			require.Equal(t, 10, admitted, "the hourly tier admits its burst")
			e.setLimits(tt.after...)
			e.at(200 * time.Millisecond)
			r := e.decide(DecideArgs{IdleExpiry: time.Hour})
			assert.Equal(t, StatusDenied, r.Status, "a used-up hourly tier admitted after SetLimits(%v): %+v", tt.after, r)
		})
	}
}

// SetLimits from a caller that does not know the defaults the buckets were
// computed under still carries their tokens over (the D field), clamps them
// and resets the expiry.
func TestSetLimits_KeyOnOtherDefaults(t *testing.T) {
	e := newEnv(t)
	defaults := []Tier{{Rate: 60, PerMS: 60000, Burst: 10}}
	for range 10 {
		require.Equal(t, StatusAllowed, e.decide(DecideArgs{Defaults: defaults, IdleExpiry: time.Hour}).Status)
	}
	sr, err := SetLimits(e.ctx, e.run, e.k, time.Hour, []Tier{{Rate: 1, PerMS: 60000, Burst: 1}}, nil)
	require.NoError(t, err)
	require.Empty(t, sr.Field)
	assert.Equal(t, time.Hour, e.mr.TTL(e.k.Bucket), "TTL: the idle expiry")
	e.at(2 * time.Second)
	r := e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, StatusDenied, r.Status, "an exhausted bucket lowered to 1/min admitted after 2 s: %+v", r)
	// 0 tokens kept, clamped to the new burst of 1: the next one comes a
	// minute after the change.
	assert.Equal(t, 58*time.Second, r.RetryAfter, "retry after lowering")
}

func TestSuspend(t *testing.T) {
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
func TestResume(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	_, err := Suspend(e.ctx, e.run, e.k, time.Hour, time.Hour)
	require.NoError(t, err)
	resv := DecideArgs{TaskID: "a", Horizon: 2 * time.Hour, Lapse: time.Minute, IdleExpiry: time.Hour}
	r := e.decide(resv)
	require.Equal(t, "suspended", r.RefusedBy)
	require.False(t, r.Reserved.IsZero(), "a slot after the suspension")

	left, err := Resume(e.ctx, e.run, e.k)
	require.NoError(t, err)
	assert.Equal(t, time.Hour, left, "Resume reports what was left")
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{IdleExpiry: time.Hour}).Status, "a fresh caller after Resume")
	assert.Equal(t, StatusAllowed, e.decide(resv).Status, "the former slot holder after Resume")
	assert.False(t, e.mr.Exists(e.k.Reservations), "reservations after Resume")

	left, err = Resume(e.ctx, e.run, e.k)
	require.NoError(t, err)
	assert.Zero(t, left, "Resume of a key not suspended")
}

func TestInspect(t *testing.T) {
	e := newEnv(t)
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err, "Inspect without limits")
	assert.Equal(t, InspectReply{Status: StatusNoLimits}, r, "Inspect without limits")

	r, err = Inspect(e.ctx, e.run, e.k, []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, 0)
	require.NoError(t, err, "Inspect with defaults")
	assert.Equal(t, InspectReply{Status: StatusAllowed, Tiers: []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, Tokens: []float64{4},
		Configured: []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, LearnedFor: []time.Duration{0}, AdaptiveFactor: 1}, r, "Inspect with defaults")

	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.decide(DecideArgs{IdleExpiry: time.Hour})
	_, err = Suspend(e.ctx, e.run, e.k, 5*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour})
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

func TestScriptFlush(t *testing.T) {
	e := newEnv(t)
	calls := []struct {
		name string
		run  func() error
	}{
		{"SetLimits", func() error {
			_, err := SetLimits(e.ctx, e.run, e.k, time.Hour, []Tier{{Rate: 1, PerMS: 1000, Burst: 1}}, nil)
			return err
		}},
		{"Decide", func() error { _, err := Decide(e.ctx, e.run, e.k, DecideArgs{}); return err }},
		{"Suspend", func() error { _, err := Suspend(e.ctx, e.run, e.k, time.Second, time.Hour); return err }},
		{"Resume", func() error { _, err := Resume(e.ctx, e.run, e.k); return err }},
		{"Inspect", func() error { _, err := Inspect(e.ctx, e.run, e.k, nil, 0); return err }},
	}
	for _, c := range calls {
		require.NoError(t, c.run(), "%s before SCRIPT FLUSH", c.name)
		require.NoError(t, e.rdb.ScriptFlush(e.ctx).Err(), "SCRIPT FLUSH")
		assert.NoError(t, c.run(), "%s after SCRIPT FLUSH", c.name)
	}
	assert.Equal(t, ModeEval, e.run.Mode(), "miniredis has no functions: the runner uses EVALSHA")
}

// TestGarbageState: the bucket state, suspension and schedule are in Redis
// too. Whatever is found there, a decision is made without a script error
// and a refusal asks for a wait that is positive and finite.
func TestGarbageState(t *testing.T) {
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
			r, err := SetLimits(e.ctx, e.run, e.k, time.Hour, []Tier{tier}, nil)
			assert.NoError(t, err, "SetLimits with %s", tt.name)
			assert.Empty(t, r.Field)
			_, err = Suspend(e.ctx, e.run, e.k, time.Second, time.Hour)
			assert.NoError(t, err, "Suspend with %s", tt.name)
		})
	}
}

// TestDecide_RetryAfterRoundsUp: the retry-after is the exact wait rounded up
// to a microsecond, never down, for waits that are not whole microseconds.
func TestDecide_RetryAfterRoundsUp(t *testing.T) {
	for _, rate := range []int64{3, 7, 9, 11, 13, 17, 19, 23} {
		e := newEnv(t)
		e.setLimits(Tier{Rate: rate, PerMS: 1000, Burst: 1})
		e.decide(DecideArgs{IdleExpiry: time.Hour})
		r := e.decide(DecideArgs{IdleExpiry: time.Hour})
		want := time.Duration(math.Ceil(1e6/float64(rate))) * time.Microsecond
		assert.Equal(t, want, r.RetryAfter, "Decide at %d/s right after a take: RetryAfter", rate)
	}
}

func TestErrBadReplyWraps(t *testing.T) {
	err := errBadReply("decide", []any{"x"})
	assert.True(t, errors.Is(err, ErrBadReply), "errors.Is(%v, ErrBadReply)", err)
	assert.Contains(t, err.Error(), "decide", "error names the script")
}

// One run of decide.lua for several callers decides exactly as the same
// callers one after the other at the same instant: same replies, same state.
func TestDecideManyEqualsOneByOne(t *testing.T) {
	ids := []string{"", "a", "b", "", "c", "a", "d", "", "e", "f", "g", "h"}
	modes := []DecideArgs{
		{IdleExpiry: time.Hour},
		{Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour},
		{Horizon: time.Minute, Granule: time.Second, Lapse: time.Minute, IdleExpiry: time.Hour},
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
			// The expiry memo (x) may differ: one write sets it once.
			noX := func(dump string) string {
				var keep []string
				for _, l := range strings.Split(dump, "\n") {
					if !strings.Contains(l, " x: ") {
						keep = append(keep, l)
					}
				}
				return strings.Join(keep, "\n")
			}
			assert.Equal(t, noX(one.mr.Dump()), noX(many.mr.Dump()), "Redis after one run vs one by one")
		})
	}
}

// A lease takes extra tokens for the caller's process only while every tier
// keeps at least the lease size behind, and never more than the bucket holds.
func TestDecideLease(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 20}, Tier{Rate: 1000, PerMS: 60000, Burst: 1000})
	var extras []int64
	taken := int64(0)
	for range 30 {
		r := e.decide(DecideArgs{IdleExpiry: time.Hour, Lease: 8})
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
		r := e2.decide(DecideArgs{IdleExpiry: time.Hour, Lease: lease})
		assert.Equal(t, StatusAllowed, r.Status)
		assert.Zero(t, r.Lease, "Lease %d", lease)
	}
}

// windowAdmissions drives Decide at the given times (us after testEpoch)
// under limits, and returns the times that were admitted.
func windowAdmissions(t *testing.T, e *env, a DecideArgs, times []int64) []int64 {
	t.Helper()
	var got []int64
	for _, at := range times {
		e.at(time.Duration(at) * time.Microsecond)
		r := e.decide(a)
		if r.Status == StatusAllowed {
			got = append(got, at)
		}
	}
	return got
}

// maxIn returns the most times in any half-open window [t, t+w).
func maxIn(ts []int64, w int64) int {
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j]-ts[i] < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// A window admits at most N calls in any window of its length, whatever
// its phase, and a steady backlog gets at least 95 % of N per window.
func TestDecide_Window(t *testing.T) {
	const n, per = 10, int64(1_000_000)
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: n, PerMS: per / 1000})
	// A caller every 7 ms for 20 s: far more than the window allows.
	var times []int64
	for at := int64(0); at < 20*per; at += 7_000 {
		times = append(times, at)
	}
	got := windowAdmissions(t, e, DecideArgs{IdleExpiry: time.Hour}, times)
	assert.LessOrEqual(t, maxIn(got, per), n, "calls in any window of 1 s")
	share := float64(len(got)) / (20 * n)
	assert.GreaterOrEqual(t, share, 0.95, "share of the quota a steady backlog gets (%d calls in 20 s)", len(got))

	// Beside a bucket: both hold.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 5}, Tier{Kind: KindWindow, Rate: n, PerMS: per / 1000})
	got = windowAdmissions(t, e2, DecideArgs{IdleExpiry: time.Hour}, times)
	assert.LessOrEqual(t, maxIn(got, per), n, "window beside a bucket")
	assert.LessOrEqual(t, maxIn(got, 10_000), 5, "the bucket's burst beside a window")
}

// Headroom keeps room for dispatch jitter: a call is admitted only when it
// would still be d later, so calls shifted by up to d never exceed the
// bucket (or the window) at the provider.
func TestDecide_Headroom(t *testing.T) {
	const d = 20 * time.Millisecond
	t.Run("bucket", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 10})
		r := e.decide(DecideArgs{IdleExpiry: time.Hour, Headroom: d})
		assert.Equal(t, StatusAllowed, r.Status, "a bucket full for long")
		n := 1
		for e.decide(DecideArgs{IdleExpiry: time.Hour, Headroom: d}).Status == StatusAllowed {
			n++
		}
		assert.Equal(t, 10-2, n, "a burst of 10 less 100/s x 20 ms")
		r = e.decide(DecideArgs{IdleExpiry: time.Hour})
		assert.Equal(t, StatusAllowed, r.Status, "without headroom the exact bucket still holds 2")
	})
	t.Run("window", func(t *testing.T) {
		e := newEnv(t)
		e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 1000})
		var times []int64
		for at := int64(0); at < 10_000_000; at += 3_000 {
			times = append(times, at)
		}
		got := windowAdmissions(t, e, DecideArgs{IdleExpiry: time.Hour, Headroom: d}, times)
		assert.LessOrEqual(t, maxIn(got, 1_000_000+d.Microseconds()), 10, "calls in any window of 1 s + the headroom")
	})
}

// A cost takes that many tokens of every tier, all or none; a cost above a
// tier's burst is refused for good.
func TestDecide_Cost(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	r := e.decide(DecideArgs{IdleExpiry: time.Hour, Cost: 7})
	assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: 3, At: testEpoch(), Generation: 1}, r)
	r = e.decide(DecideArgs{IdleExpiry: time.Hour, Cost: 4})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 100 * time.Millisecond, RefusedBy: "tier:1", Generation: 1}, r, "4 of 3")
	r = e.decide(DecideArgs{IdleExpiry: time.Hour, Cost: 11})
	assert.Equal(t, DecideReply{Status: StatusCostTooHigh, Field: "1000", Reason: "10"}, r, "a cost above the burst")
	// Reserved with a cost: the slot is spaced for it.
	r = e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour, Cost: 5})
	assert.Equal(t, testEpoch().Add(200*time.Millisecond), r.Reserved, "5 tokens, 3 there, at 10/s")
	r = e.decide(DecideArgs{TaskID: "b", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour, Cost: 5})
	assert.Equal(t, testEpoch().Add(700*time.Millisecond), r.Reserved, "then 5 more")
}

// Paced, a holder back in the granule before its slot is admitted at the
// slot and told to wait for it; slots are exact instants, so a backlog
// under a burst below its rate per second drains at the rate.
func TestDecide_Pace(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 40, PerMS: 1000, Burst: 5})
	a := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour, Granule: time.Second, Pace: true}
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

// Booking (enqueue-time throttling) reserves a slot even for a caller that
// could run now, and the holder is admitted against it.
func TestDecide_Book(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	a := DecideArgs{Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour, Granule: time.Second, Book: true}
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

// Adjust settles a cost after the fact: every tier takes or gives back the
// difference, a bucket never above its burst; a window counts a surcharge
// at now, and takes a refund back only from the sub-window the call was
// counted in (nothing without it), never below zero.
func TestAdjust(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10}, Tier{Kind: KindWindow, Rate: 20, PerMS: 60000})
	r := e.decide(DecideArgs{IdleExpiry: time.Hour, Cost: 4})
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
	require.NoError(t, Adjust(e.ctx, e.run, e.k, 3, Call{Generation: -1}, time.Hour, nil))
	assert.Equal(t, []float64{7, 13}, tokens(), "charged 3 more")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -5, Call{Generation: -1}, time.Hour, nil))
	assert.Equal(t, []float64{7, 13}, tokens(), "a refund of no known call gives nothing back")
	call := Call{At: r.At, Charged: 4, Generation: r.Generation}
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -3, call, time.Hour, nil))
	assert.Equal(t, []float64{7, 16}, tokens(), "the call's debit was refilled 10 s ago; the window gives 3 back in the sub-window of the call")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -3, Call{At: r.At, Charged: 4, Generation: r.Generation + 1}, time.Hour, nil))
	assert.Equal(t, []float64{7, 16}, tokens(), "a call admitted under other limits: nothing back")

	// A refund right after the call gives the bucket back what the refill
	// has not paid yet of the call's own debit.
	r = e.decide(DecideArgs{IdleExpiry: time.Hour, Cost: 5})
	require.Equal(t, StatusAllowed, r.Status)
	e.at(10*time.Second + 200*time.Millisecond) // 2 tokens refilled since
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -4, Call{At: r.At, Charged: 5, Generation: r.Generation}, time.Hour, nil))
	assert.InDeltaSlice(t, []float64{6, 15}, tokens(), 1e-9, "4 of the 5 taken come back less the 2 refilled since: 2 to the bucket")
}

// A refund never lets a window hold more than N real calls: it comes out of
// the sub-window where the refunded call was counted, not the latest one.
// (Regression: on Window(10, 1s), 5 calls admitted at 0 ms whose real cost
// was 0, 5 more at 902 ms, the refund at 954 ms, and at 1102 ms 10 more
// were admitted: 15 real calls within 200 ms.)
func TestAdjust_RefundComesOutOfTheCallsSubWindow(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 1000})
	a := DecideArgs{IdleExpiry: time.Hour}
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
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -5, Call{At: refunded.At, Charged: 5, Generation: refunded.Generation}, time.Hour, nil), "the first call's real cost was 0")
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

// An in-flight limit is taken in the same decision as the tiers: a slot
// and a token, or nothing. A released slot goes to the next caller; a slot
// whose lease ended is taken back; a caller refused a slot is told when one
// is expected to free, callers refused later told later.
func TestDecide_InFlight(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100}, Tier{Kind: KindInFlight, Rate: 2})
	a := DecideArgs{IdleExpiry: time.Hour, SlotExpiry: 10 * time.Second}
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
	a := DecideArgs{IdleExpiry: time.Hour, Cost: 7}
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

// TestDecide_WindowCountsCallsAdmittedAhead: a paced admission is counted at
// the instant its worker was told to call, which may be after the instant a
// later decision is made. That decision counts it: a window that holds both
// instants must see at most N. (Found by scenario E: 30 admitted now beside
// 3 paced ones 300 ms ahead drew 429s from a strict 30 per second window.)
func TestDecide_WindowCountsCallsAdmittedAhead(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 3, PerMS: 1000})
	now := testEpoch().UnixMicro()
	sub := int64(1_000_000 / 20)
	// Three calls admitted for 500 ms from now (a paced admission's instant).
	e.mr.HSet(e.k.Bucket, "Ww1000", fmt.Sprintf("%d 3", (now+500_000)/sub))
	r := e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, StatusDenied, r.Status, "a call now beside 3 admitted 500 ms ahead, at most 3 in any 1 s: %+v", r)
	assert.Equal(t, "tier:1", r.RefusedBy)
	// Its wait is until those three have left a window that holds now's
	// successor: 1 s after their sub-window ends.
	assert.GreaterOrEqual(t, r.RetryAfter, 1500*time.Millisecond, "wait")
	e.at(r.RetryAfter)
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{IdleExpiry: time.Hour}).Status, "once they have left the window")
}

// TestDecideLease_NotOnAWindow: a key with a window tier grants no lease. A
// leased call the process does not make in time is lost for a whole window
// (a bucket has it back in 1/rate): scenario E's fleet, starting on a fresh
// window of 100 per 2 s, made 46 calls in it and lost the rest to leases.
func TestDecideLease_NotOnAWindow(t *testing.T) {
	for _, tiers := range [][]Tier{
		{{Kind: KindWindow, Rate: 100, PerMS: 2000}},
		{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Kind: KindWindow, Rate: 100000, PerMS: 60000}},
	} {
		e := newEnv(t)
		e.setLimits(tiers...)
		for i := range 10 {
			r := e.decide(DecideArgs{IdleExpiry: time.Hour, Lease: 64})
			require.Equal(t, StatusAllowed, r.Status, "decision %d on %+v", i, tiers)
			assert.Zero(t, r.Lease, "tokens leased on %+v", tiers)
		}
	}
}

// TestInspect_LapsedReservationsNotCounted: a reservation whose task never
// came back lapses; it is swept only when the next one is added, and
// Inspect, told the lapse, does not count it meanwhile.
func TestInspect_LapsedReservationsNotCounted(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 1, PerMS: 1000, Burst: 1})
	a := DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour}
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{IdleExpiry: time.Hour}).Status)
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

// Inspect tells the calls a window would still admit now: none while its
// room is reserved, never a negative number (a batch reserved in the
// sub-window of now while the last batch's calls are still in the window
// read as -60 in bench scenario E's traces).
func TestInspect_WindowWithReservationsAdmitsNone(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 2, PerMS: 1000})
	// 2 calls admitted 10 ms ago, 2 reserved for 10 ms from now: the same
	// sub-window (50 ms) as now.
	sub := testEpoch().UnixMicro() / 50_000
	e.at(25 * time.Millisecond)
	e.mr.HSet(e.k.Bucket, "Ww1000", fmt.Sprintf("%d 2+15000|%d:2+35000", sub, sub))
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{0}, r.Tokens, "calls the window admits now")
}
