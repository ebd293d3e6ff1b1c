package throttle_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestSetLimitsReplacesGarbageLimits(t *testing.T) {
	r := newRig(t)
	r.hset(bucket("k"), "L", "abc/1000/1")
	_, err := r.lim.Take(r.ctx, "k")
	require.ErrorIs(t, err, throttle.ErrInvalidLimit, "Take on a garbage config")

	r.setLimits("k", throttle.PerSecond(2))
	n, d := r.takeAll("k", 10)
	assert.Equal(t, 2, n, "takes after SetLimits replaced the garbage")
	assertRefused(t, d, throttle.RefusedByTier, 500*time.Millisecond, "refusal after that")
}

func TestHandWrittenLimitsApplyOnTheNextCall(t *testing.T) {
	t.Run("used on the next call", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(10))
		assertAllowed(t, r.take("k"), "Take under 10/s")
		r.hset(bucket("k"), "L", "2/1000/2")
		// The state is what each tier owes of its burst: one token, which
		// under the hand-written 2/s leaves one (SetLimits would have kept
		// 9 tokens, clamped to 2).
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 1, n, "takes after HSET L 2/1000/2")
		assertRefused(t, d, throttle.RefusedByTier, 500*time.Millisecond, "refusal under the hand-written 2/s")
	})
	t.Run("on a fresh key", func(t *testing.T) {
		r := newRig(t)
		r.hset(bucket("k"), "L", "5/1000/5 3/60000/3")
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 3, n, "takes under the hand-written 5/s + 3/min")
		assertRefused(t, d, throttle.RefusedByTier, 20*time.Second, "refusal")
		assert.Equal(t, 2, d.Tier, "refusal: Tier")
		got, err := throttle.Limits(r.lim, r.ctx, "k")
		require.NoError(t, err, "Limits(k)")
		assert.Equal(t, []throttle.Limit{
			{N: 5, Per: time.Second, Burst: 5}, {N: 3, Per: time.Minute, Burst: 3},
		}, got, "Limits(k) of a hand-written config")
	})
}

// garbageCases are limits an operator could leave in Redis (the L field).
// Each is a valid two-tier base with one change; field is the field Take
// must name.
type garbageCase struct {
	name  string
	L     string
	field string
}

func garbageCases() []garbageCase {
	base := [][3]string{{"10", "1000", "10"}, {"100", "60000", "100"}}
	names := [3]string{"N", "Per", "Burst"}
	values := []struct{ name, v string }{
		{"NaN", "NaN"}, {"nan", "nan"}, {"inf", "inf"}, {"-inf", "-inf"}, {"-1", "-1"}, {"0", "0"},
		{"abc", "abc"}, {"empty", ""}, {"1e300", "1e300"}, {"1.5", "1.5"}, {"5abc", "5abc"}, {"1e400", "1e400"},
		{"0x10", "0x10"},
	}
	format := func(tiers [][3]string) string {
		var parts []string
		for _, t := range tiers {
			parts = append(parts, strings.Join(t[:], "/"))
		}
		return strings.Join(parts, " ")
	}
	var cases []garbageCase
	for i := range base {
		for j := range 3 {
			for _, v := range values {
				tiers := [][3]string{base[0], base[1]}
				tiers[i][j] = v.v
				field := fmt.Sprintf("limits[%d]", i)
				if v.v == "0" {
					field += "." + names[j]
				}
				cases = append(cases, garbageCase{name: fmt.Sprintf("limits[%d].%s=%s", i, names[j], v.name), L: format(tiers), field: field})
			}
		}
	}
	cases = append(cases,
		garbageCase{name: "empty", L: "", field: "limits"},
		garbageCase{name: "spaces", L: "   ", field: "limits"},
		garbageCase{name: "nine tiers", L: "1/1/1 1/2/1 1/3/1 1/4/1 1/5/1 1/6/1 1/7/1 1/8/1 1/9/1", field: "limits"},
		garbageCase{name: "a tier cut short", L: "10/1000", field: "limits[0]"},
		garbageCase{name: "a tier too long", L: "10/1000/10/5", field: "limits[0]"},
		garbageCase{name: "per above 30 days", L: "1/2592000001/1", field: "limits[0].Per"},
		garbageCase{name: "rate above 1e6/s", L: "1000001/1000/1", field: "limits[0].N"},
		garbageCase{name: "rate 2e6 per 1000ms", L: "2000000/1000/1", field: "limits[0].N"},
		garbageCase{name: "second rate above 1e6/s", L: "10/1000/10 60000001/60000/1", field: "limits[1].N"},
		garbageCase{name: "burst above 1e9", L: "1/1000/1000000001", field: "limits[0].Burst"},
		garbageCase{name: "same period twice", L: "10/1000/10 20/1000/20", field: "limits[1].Per"},
		garbageCase{name: "a megabyte", L: strings.Repeat("9", 1<<20), field: "limits"},
	)
	return cases
}

// onGarbageLimits runs check once for each garbage case, on a key "k"
// whose limits (L) are the case's, written by hand.
func onGarbageLimits(t *testing.T, check func(t *testing.T, r *rig, tc garbageCase)) {
	r := newRig(t)
	for _, tc := range garbageCases() {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.mr.FlushAll()
			r.hset(bucket("k"), "L", tc.L)
			check(t, r, tc)
		})
	}
}

func TestGarbageLimitsMakeTakeNameTheField(t *testing.T) {
	onGarbageLimits(t, func(t *testing.T, r *rig, tc garbageCase) {
		d, err := r.lim.Take(r.ctx, "k")
		require.Error(t, err, "Take with %s: want an error, got %+v", tc.name, d)
		assert.ErrorIs(t, err, throttle.ErrInvalidLimit, "Take with %s", tc.name)
		var ce *throttle.ConfigError
		if assert.ErrorAs(t, err, &ce, "Take with %s: %v", tc.name, err) {
			assert.Equal(t, tc.field, ce.Field, "Take with %s: ConfigError.Field (reason %q)", tc.name, ce.Reason)
			assert.Equal(t, "k", ce.Key, "Take with %s: ConfigError.Key", tc.name)
			assert.NotEmpty(t, ce.Reason, "Take with %s: ConfigError.Reason", tc.name)
			assert.Less(t, len(ce.Error()), 400, "Take with %s: the error quotes a bounded part of the value", tc.name)
		}
		assert.Empty(t, r.tierState("k"), "Take with %s wrote a bucket", tc.name)

		_, err = r.lim.Inspect(r.ctx, "k")
		assert.ErrorAs(t, err, &ce, "Inspect with %s", tc.name)
	})
}

// TestGarbageLimitsFailInspectLikeTake: Limits (and so Inspect) read the
// limits through the script's own validation, so limits Take refuses are
// never reported as valid, and the error names the same field.
func TestGarbageLimitsFailInspectLikeTake(t *testing.T) {
	onGarbageLimits(t, func(t *testing.T, r *rig, tc garbageCase) {
		got, err := throttle.Limits(r.lim, r.ctx, "k")
		var ce *throttle.ConfigError
		assert.ErrorAs(t, err, &ce, "Limits with %s: want a *ConfigError, got %v, %v", tc.name, got, err)
		assert.ErrorIs(t, err, throttle.ErrInvalidLimit, "Limits with %s", tc.name)
		if ce != nil {
			assert.Equal(t, tc.field, ce.Field, "Limits with %s: ConfigError.Field (reason %q)", tc.name, ce.Reason)
		}
	})
}
