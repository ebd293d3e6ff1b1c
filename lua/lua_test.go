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
	return Keys{Config: "t:{k}:cfg", State: "t:{k}:state", Suspend: "t:{k}:suspend", Reservations: "t:{k}:resv"}
}

func testEpoch() time.Time { return time.Unix(1_700_000_000, 0) }

type env struct {
	t   *testing.T
	mr  *miniredis.Miniredis
	rdb *redis.Client
	ctx context.Context
	k   Keys
}

func newEnv(t *testing.T) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(testEpoch())
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return &env{t: t, mr: mr, rdb: rdb, ctx: context.Background(), k: testKeys()}
}

func (e *env) decide(a DecideArgs) DecideReply {
	e.t.Helper()
	r, err := Decide(e.ctx, e.rdb, e.k, a)
	require.NoError(e.t, err, "Decide(%+v)", a)
	return r
}

func (e *env) setLimits(tiers ...Tier) {
	e.t.Helper()
	field, reason, err := SetLimits(e.ctx, e.rdb, e.k, time.Hour, tiers, nil)
	require.NoError(e.t, err, "SetLimits(%+v)", tiers)
	require.Empty(e.t, field, "SetLimits(%+v): field (reason %q)", tiers, reason)
}

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
		{"abc", 0, false},
		{"", 0, false},
		{"NaN", 0, false},
		{"+Inf", 0, false},
		{"-Inf", 0, false},
		{"1e+300", 0, false},
		{"-1e+300", 0, false},
		{"1.7976931348623157e+308", 0, false},
		{int64(5), 0, false},
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

func TestParseDecide(t *testing.T) {
	slot := testEpoch().Add(time.Second)
	tests := []struct {
		name  string
		reply string
		want  DecideReply
		bad   bool
	}{
		{"allowed", "1|0|4||0", DecideReply{Status: StatusAllowed, Remaining: 4}, false},
		{"denied by tier", "0|1500|0|tier:2|0", DecideReply{Status: StatusDenied, RetryAfter: 1500 * time.Microsecond, RefusedBy: "tier:2"}, false},
		{"denied with slot", "0|1000000|0|tier:1|" + strconv.FormatInt(slot.UnixMicro(), 10), DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "tier:1", Slot: slot}, false},
		{"float-formatted numbers", "0|1.5e+06|0|queue|0", DecideReply{Status: StatusDenied, RetryAfter: 1500 * time.Millisecond, RefusedBy: "queue"}, false},
		{"no limits", "-2", DecideReply{Status: StatusNoLimits}, false},
		{"bad config", "-1|rate:1|NaN", DecideReply{Status: StatusBadConfig, Field: "rate:1", Reason: "NaN"}, false},
		{"empty", "", DecideReply{}, true},
		{"unknown status", "2|0|0||0", DecideReply{}, true},
		{"bad config too short", "-1", DecideReply{}, true},
		{"too short", "1|0|0|", DecideReply{}, true},
		{"too long", "1|0|0||0|x", DecideReply{}, true},
		{"retry not a number", "0|soon|0|tier:1|0", DecideReply{}, true},
		{"retry negative", "0|-5|0|tier:1|0", DecideReply{}, true},
		{"retry infinite", "0|+Inf|0|tier:1|0", DecideReply{}, true},
		{"retry NaN", "0|nan|0|tier:1|0", DecideReply{}, true},
		{"retry beyond int64", "0|1e300|0|tier:1|0", DecideReply{}, true},
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
		if _, err := ParseDecide("0|1000000|0|tier:1|1700000001000000"); err != nil {
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
		assert.Equal(t, DecideReply{Status: StatusAllowed, Remaining: want}, r, "Decide #%d", i+1)
	}
	r := e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1"}, r, "Decide #3")

	r = e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "tier:1", Slot: testEpoch().Add(500 * time.Millisecond)}, r, "Decide with a reservation")
	r = e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 500 * time.Millisecond, RefusedBy: "reserved", Slot: testEpoch().Add(500 * time.Millisecond)}, r, "Decide by the holder before its slot")
	r = e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: time.Second, RefusedBy: "queue"}, r, "Decide behind the reservation")

	_, err := Suspend(e.ctx, e.rdb, e.k, 3*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	r = e.decide(DecideArgs{IdleExpiry: time.Hour})
	assert.Equal(t, DecideReply{Status: StatusDenied, RetryAfter: 3 * time.Second, RefusedBy: "suspended"}, r, "Decide while suspended")
}

func TestDecide_Defaults(t *testing.T) {
	tests := []struct {
		name     string
		defaults []Tier
		want     DecideReply
	}{
		{"none", nil, DecideReply{Status: StatusNoLimits}},
		{"valid", []Tier{{Rate: 1, PerMS: 1000, Burst: 3}}, DecideReply{Status: StatusAllowed, Remaining: 2}},
		{"rate 0", []Tier{{Rate: 0, PerMS: 1000, Burst: 3}}, DecideReply{Status: StatusBadConfig, Field: "default rate:1", Reason: "below minimum 1"}},
		{"second per_ms 0", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: 1, PerMS: 0, Burst: 1}}, DecideReply{Status: StatusBadConfig, Field: "default per_ms:2", Reason: "below minimum 1"}},
		{"burst above 1e9", []Tier{{Rate: 1, PerMS: 1000, Burst: 1_000_000_001}}, DecideReply{Status: StatusBadConfig, Field: "default burst:1", Reason: "above maximum 1000000000"}},
		{"five tiers", make([]Tier, 5), DecideReply{Status: StatusBadConfig, Field: "default tiers", Reason: "above maximum 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			got := e.decide(DecideArgs{Defaults: tt.defaults, IdleExpiry: time.Hour})
			assert.Equal(t, tt.want, got, "Decide with defaults %+v", tt.defaults)
			assert.False(t, e.mr.Exists(e.k.Config), "Decide with defaults wrote a config")
		})
	}
}

func TestSetLimits_Validation(t *testing.T) {
	tests := []struct {
		name          string
		tiers         []Tier
		field, reason string
	}{
		{"no tiers", nil, "tiers", "missing"},
		{"five tiers", make([]Tier, 5), "tiers", "above maximum 4"},
		{"rate 0", []Tier{{Rate: 0, PerMS: 1000, Burst: 1}}, "rate:1", "below minimum 1"},
		{"per_ms 0", []Tier{{Rate: 1, PerMS: 0, Burst: 1}}, "per_ms:1", "below minimum 1"},
		{"per_ms above 30 days", []Tier{{Rate: 1, PerMS: 30*24*3600*1000 + 1, Burst: 1}}, "per_ms:1", "above maximum 2592000000"},
		{"burst 0", []Tier{{Rate: 1, PerMS: 1000, Burst: 0}}, "burst:1", "below minimum 1"},
		{"rate above 1e6/s", []Tier{{Rate: 1_000_001, PerMS: 1000, Burst: 1}}, "rate:1", "above maximum 1000000 per second"},
		{"second tier", []Tier{{Rate: 1, PerMS: 1000, Burst: 1}, {Rate: -1, PerMS: 1000, Burst: 1}}, "rate:2", "below minimum 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			field, reason, err := SetLimits(e.ctx, e.rdb, e.k, time.Hour, tt.tiers, nil)
			require.NoError(t, err, "SetLimits(%+v)", tt.tiers)
			assert.Equal(t, tt.field, field, "SetLimits(%+v): field", tt.tiers)
			assert.Equal(t, tt.reason, reason, "SetLimits(%+v): reason", tt.tiers)
			assert.Empty(t, e.mr.Keys(), "SetLimits(%+v) wrote to Redis", tt.tiers)
		})
	}
}

func TestSetLimits_Stores(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 5, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.setLimits(Tier{Rate: 3, PerMS: 1500, Burst: 2}) // replaces, not merges
	got, err := e.rdb.HGetAll(e.ctx, e.k.Config).Result()
	require.NoError(t, err, "HGETALL %s", e.k.Config)
	assert.Equal(t, map[string]string{"tiers": "1", "rate:1": "3", "per_ms:1": "1500", "burst:1": "2"}, got, "config hash")
	assert.Equal(t, time.Hour, e.mr.TTL(e.k.Config), "config TTL")
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
		e.mr.SetTime(testEpoch().Add(s.at))
		got, err := Suspend(e.ctx, e.rdb, e.k, s.d, s.max)
		require.NoError(t, err, "Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
		assert.Equal(t, s.want, got, "Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
		assert.Equal(t, s.want, e.mr.TTL(e.k.Suspend), "suspend TTL after Suspend(%v, max %v) at +%v", s.d, s.max, s.at)
	}
	raw, err := e.mr.Get(e.k.Suspend)
	require.NoError(t, err, "GET %s", e.k.Suspend)
	assert.Equal(t, strconv.FormatInt(testEpoch().Add(time.Hour+2*time.Second).UnixMicro(), 10), raw, "suspended until (us)")
}

func TestInspect(t *testing.T) {
	e := newEnv(t)
	r, err := Inspect(e.ctx, e.rdb, e.k, nil)
	require.NoError(t, err, "Inspect without limits")
	assert.Equal(t, InspectReply{Status: StatusNoLimits}, r, "Inspect without limits")

	r, err = Inspect(e.ctx, e.rdb, e.k, []Tier{{Rate: 1, PerMS: 1000, Burst: 4}})
	require.NoError(t, err, "Inspect with defaults")
	assert.Equal(t, InspectReply{Status: StatusAllowed, Tiers: []Tier{{Rate: 1, PerMS: 1000, Burst: 4}}, Tokens: []float64{4}}, r, "Inspect with defaults")

	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10}, Tier{Rate: 100, PerMS: 60000, Burst: 100})
	e.decide(DecideArgs{IdleExpiry: time.Hour})
	_, err = Suspend(e.ctx, e.rdb, e.k, 5*time.Second, time.Hour)
	require.NoError(t, err, "Suspend")
	e.decide(DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour})
	before := e.mr.Dump()
	r, err = Inspect(e.ctx, e.rdb, e.k, nil)
	require.NoError(t, err, "Inspect")
	assert.Equal(t, InspectReply{
		Status: StatusAllowed, Suspended: 5 * time.Second, Reservations: 1,
		QueuedFor: 5*time.Second + 600*time.Millisecond, FromRedis: true,
		Tiers:  []Tier{{Rate: 10, PerMS: 1000, Burst: 10}, {Rate: 100, PerMS: 60000, Burst: 100}},
		Tokens: []float64{9, 99},
	}, r, "Inspect")
	assert.Equal(t, before, e.mr.Dump(), "Inspect wrote to Redis")

	e.mr.HSet(e.k.Config, "burst:2", "NaN")
	r, err = Inspect(e.ctx, e.rdb, e.k, nil)
	require.NoError(t, err, "Inspect with a bad config")
	assert.Equal(t, InspectReply{Status: StatusBadConfig, Field: "burst:2", Reason: "not a number"}, r, "Inspect with a bad config")
}

func TestScriptFlush(t *testing.T) {
	e := newEnv(t)
	calls := []struct {
		name string
		run  func() error
	}{
		{"SetLimits", func() error {
			_, _, err := SetLimits(e.ctx, e.rdb, e.k, time.Hour, []Tier{{Rate: 1, PerMS: 1000, Burst: 1}}, nil)
			return err
		}},
		{"Decide", func() error { _, err := Decide(e.ctx, e.rdb, e.k, DecideArgs{}); return err }},
		{"Suspend", func() error { _, err := Suspend(e.ctx, e.rdb, e.k, time.Second, time.Hour); return err }},
		{"Inspect", func() error { _, err := Inspect(e.ctx, e.rdb, e.k, nil); return err }},
	}
	for _, c := range calls {
		require.NoError(t, c.run(), "%s before SCRIPT FLUSH", c.name)
		require.NoError(t, e.rdb.ScriptFlush(e.ctx).Err(), "SCRIPT FLUSH")
		assert.NoError(t, c.run(), "%s after SCRIPT FLUSH", c.name)
	}
}

// TestGarbageState: the bucket, suspension and reservation keys are in Redis
// too. Whatever is found there, a decision is made without a script error
// and a refusal asks for a wait that is positive and finite.
func TestGarbageState(t *testing.T) {
	tier := Tier{Rate: 10, PerMS: 1000, Burst: 10}
	tests := []struct {
		name string
		key  func(Keys) string
		hash map[string]string // for the state hash
		str  string            // for the suspend key
	}{
		{"tokens abc", stateKey, map[string]string{"ts": "1", "tk:1": "abc"}, ""},
		{"tokens empty", stateKey, map[string]string{"ts": "1", "tk:1": ""}, ""},
		{"tokens NaN", stateKey, map[string]string{"ts": "1", "tk:1": "NaN"}, ""},
		{"tokens huge", stateKey, map[string]string{"ts": "1", "tk:1": "1.0e308"}, ""},
		{"tokens hugely negative", stateKey, map[string]string{"ts": "1", "tk:1": "-1.0e308"}, ""},
		{"ts abc", stateKey, map[string]string{"ts": "abc", "tk:1": "0.5"}, ""},
		{"ts far future", stateKey, map[string]string{"ts": "9.0e300", "tk:1": "0.5"}, ""},
		{"vnext abc", stateKey, map[string]string{"vnext": "abc"}, ""},
		{"vnext far future", stateKey, map[string]string{"vnext": "1.0e300"}, ""},
		{"suspend abc", suspendKey, nil, "abc"},
		{"suspend far future", suspendKey, nil, "1.0e300"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(tier)
			for f, v := range tt.hash {
				e.mr.HSet(tt.key(e.k), f, v)
			}
			if tt.str != "" {
				require.NoError(t, e.mr.Set(tt.key(e.k), tt.str), "SET %s", tt.key(e.k))
			}
			for _, a := range []DecideArgs{{}, {TaskID: "a", Horizon: time.Minute, Lapse: time.Minute}} {
				r, err := Decide(e.ctx, e.rdb, e.k, a)
				require.NoError(t, err, "Decide(%+v) with %s", a, tt.name)
				require.Contains(t, []int{StatusAllowed, StatusDenied}, r.Status, "Decide(%+v) with %s: %+v", a, tt.name, r)
				if r.Status == StatusDenied {
					assert.Positive(t, r.RetryAfter, "Decide(%+v) with %s: RetryAfter of a refusal (%+v)", a, tt.name, r)
				}
			}
			_, err := Inspect(e.ctx, e.rdb, e.k, nil)
			assert.NoError(t, err, "Inspect with %s", tt.name)
		})
	}
}

func stateKey(k Keys) string   { return k.State }
func suspendKey(k Keys) string { return k.Suspend }

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
				require.NoError(t, LoadDecide(e.ctx, e.rdb))
			}
			var want []string
			for _, id := range ids {
				a := mode
				a.TaskID = id
				args := AppendDecideArgs(nil, one.k, a)
				args[NArg] = 1
				s, err := one.rdb.Do(one.ctx, append(args, id)...).Text()
				require.NoError(t, err)
				want = append(want, s)
			}
			args := AppendDecideArgs(nil, many.k, mode)
			args[NArg] = len(ids)
			for _, id := range ids {
				args = append(args, id)
			}
			s, err := many.rdb.Do(many.ctx, args...).Text()
			require.NoError(t, err)
			var got []string
			for s != "" {
				var r string
				r, s = NextReply(s)
				got = append(got, r)
			}
			assert.Equal(t, want, got, "one run for %d callers", len(ids))
			assert.Contains(t, want, "1|0|0||0", "the limits never bound: the test proves little")
			// The expiry memo (xp) may differ: one write sets it once.
			noXP := func(dump string) string {
				var keep []string
				for _, l := range strings.Split(dump, "\n") {
					if !strings.Contains(l, " xp: ") {
						keep = append(keep, l)
					}
				}
				return strings.Join(keep, "\n")
			}
			assert.Equal(t, noXP(one.mr.Dump()), noXP(many.mr.Dump()), "Redis after one run vs one by one")
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
	tk, err := e.rdb.HGet(e.ctx, e.k.State, "tk:1").Float64()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, tk, -1e-9, "tokens never go below zero")

	// Without a lease (or a lease of 1) every decision takes one token.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 20})
	for _, lease := range []int{0, 1} {
		r := e2.decide(DecideArgs{IdleExpiry: time.Hour, Lease: lease})
		assert.Equal(t, StatusAllowed, r.Status)
		assert.Zero(t, r.Lease, "Lease %d", lease)
	}
}
