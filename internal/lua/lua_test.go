package lua

import (
	"context"
	"errors"
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
	return Keys{Bucket: "t:{k}:b", Reservations: "t:{k}:r", Slots: "t:{k}:f", Tenants: "t:{k}:a", Tags: "t:{k}:t", Config: "t:{k}:c"}
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
	r, err := SetLimits(e.ctx, e.run, e.k, tiers, nil)
	require.NoError(e.t, err, "SetLimits(%+v)", tiers)
	require.Empty(e.t, r.Field, "SetLimits(%+v): field (reason %q)", tiers, r.Reason)
}

func (e *env) at(d time.Duration) { e.mr.SetTime(testEpoch().Add(d)) }

func TestNumReadsFiniteNumbersWithinInt64(t *testing.T) {
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

func TestFormatTiersWritesRatePerMSBurst(t *testing.T) {
	assert.Equal(t, "", FormatTiers(nil))
	assert.Equal(t, "10/1000/20 50/60000/50", FormatTiers([]Tier{{Rate: 10, PerMS: 1000, Burst: 20}, {Rate: 50, PerMS: 60000, Burst: 50}}))
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	e := newEnv(t)
	calls := []struct {
		name string
		run  func() error
	}{
		{"SetLimits", func() error {
			_, err := SetLimits(e.ctx, e.run, e.k, []Tier{{Rate: 1, PerMS: 1000, Burst: 1}}, nil)
			return err
		}},
		{"Decide", func() error { _, err := Decide(e.ctx, e.run, e.k, DecideArgs{}); return err }},
		{"Suspend", func() error { _, err := Suspend(e.ctx, e.run, e.k, time.Second, time.Hour); return err }},
		{"Resume", func() error { _, err := Resume(e.ctx, e.run, e.k, nil); return err }},
		{"Inspect", func() error { _, err := Inspect(e.ctx, e.run, e.k, nil, 0); return err }},
	}
	for _, c := range calls {
		require.NoError(t, c.run(), "%s before SCRIPT FLUSH", c.name)
		require.NoError(t, e.rdb.ScriptFlush(e.ctx).Err(), "SCRIPT FLUSH")
		assert.NoError(t, c.run(), "%s after SCRIPT FLUSH", c.name)
	}
	assert.Equal(t, ModeEval, e.run.Mode(), "miniredis has no functions: the runner uses EVALSHA")
}

func TestBadReplyErrorWrapsErrBadReply(t *testing.T) {
	err := errBadReply("decide", []any{"x"})
	assert.True(t, errors.Is(err, ErrBadReply), "errors.Is(%v, ErrBadReply)", err)
	assert.Contains(t, err.Error(), "decide", "error names the script")
}
