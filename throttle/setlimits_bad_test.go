package throttle_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// SetLimits refuses bad limits before anything reaches Redis: the error
// names the field (and what to do), and the key keeps its last good limits,
// their generation and the tokens its buckets hold.
func TestSetLimitsBadInputKeepsTheLastGoodLimits(t *testing.T) {
	good := []throttle.Limit{throttle.PerSecond(10), throttle.PerMinute(100).WithBurst(20)}
	tests := []struct {
		name   string
		limits []throttle.Limit
		field  string // what the error must name
	}{
		{"none", nil, "no limits given"},
		{"rate 0", []throttle.Limit{{N: 0, Per: time.Second}}, "limits[0].N"},
		{"rate negative", []throttle.Limit{throttle.PerSecond(1), {N: -5, Per: time.Minute}}, "limits[1].N"},
		{"per 0", []throttle.Limit{{N: 1}}, "limits[0].Per"},
		{"per negative", []throttle.Limit{{N: 1, Per: -time.Second}}, "limits[0].Per"},
		{"per not whole ms", []throttle.Limit{{N: 1, Per: 1500 * time.Microsecond}}, "limits[0].Per"},
		{"per above 30 days", []throttle.Limit{{N: 1, Per: throttle.MaxPer + time.Millisecond}}, "limits[0].Per"},
		{"burst negative", []throttle.Limit{throttle.PerSecond(1).WithBurst(-1)}, "limits[0].Burst"},
		{"burst above max", []throttle.Limit{throttle.PerSecond(1).WithBurst(throttle.MaxBurst + 1)}, "limits[0].Burst"},
		{"rate above 1e6/s", []throttle.Limit{throttle.PerSecond(throttle.MaxRatePerSecond + 1)}, "limits[0].N"},
		{"rate above 1e6/s over 1ms", []throttle.Limit{{N: 1001, Per: time.Millisecond}}, "limits[0].N"},
		{"nine tiers", []throttle.Limit{throttle.PerSecond(1), throttle.PerMinute(1), throttle.PerHour(1),
			{N: 1, Per: 24 * time.Hour}, {N: 1, Per: 48 * time.Hour}, throttle.PerSecond(1).In("tokens"),
			throttle.PerMinute(1).In("tokens"), throttle.PerHour(1).In("tokens"), throttle.Window(1, time.Hour)}, "9 limits given, at most 8"},
		{"same period twice", []throttle.Limit{throttle.PerSecond(1), throttle.PerSecond(2)}, "limits[1].Per"},
		{"two in flight", []throttle.Limit{throttle.InFlight(1), throttle.InFlight(2)}, "limits[1]"},
		{"in flight 0", []throttle.Limit{throttle.InFlight(0)}, "limits[0].N"},
		{"in flight with a period", []throttle.Limit{{Kind: throttle.KindInFlight, N: 1, Per: time.Second}}, "limits[0].Per"},
		{"window with a burst", []throttle.Limit{throttle.Window(5, time.Second).WithBurst(7)}, "limits[0].Burst"},
		{"window above max", []throttle.Limit{throttle.Window(throttle.MaxBurst+1, time.Hour)}, "limits[0].N"},
		{"unknown kind", []throttle.Limit{{Kind: 9, N: 1, Per: time.Second}}, "limits[0].Kind"},
		{"bad after good", []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(50), {N: 1, Per: time.Hour, Burst: -3}}, "limits[2].Burst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", good...)
			for range 4 {
				assertAllowed(t, r.take("k"), "Take under the good limits")
			}
			before := r.inspect("k")
			hash, err := r.mr.HKeys(bucket("k"))
			require.NoError(t, err, "HKEYS of the key's hash")
			state := r.tierState("k")

			err = r.lim.SetLimits(r.ctx, "k", tt.limits...)
			require.Error(t, err, "SetLimits(%v)", tt.limits)
			assert.ErrorIs(t, err, throttle.ErrInvalidLimit, "SetLimits(%v)", tt.limits)
			assert.Contains(t, err.Error(), tt.field, "SetLimits(%v): the error names the field", tt.limits)

			after := r.inspect("k")
			assert.Equal(t, effective(good), after.Limits, "limits after the refused SetLimits(%v)", tt.limits)
			assert.Equal(t, before.Generation, after.Generation, "generation after the refused SetLimits(%v)", tt.limits)
			assert.Equal(t, before.Tokens, after.Tokens, "tokens after the refused SetLimits(%v)", tt.limits)
			assert.Equal(t, state, r.tierState("k"), "bucket state after the refused SetLimits(%v)", tt.limits)
			hashAfter, _ := r.mr.HKeys(bucket("k"))
			assert.ElementsMatch(t, hash, hashAfter, "hash fields after the refused SetLimits(%v)", tt.limits)
			n, _ := r.takeAll("k", 100)
			assert.Equal(t, 6, n, "takes left of the good limits' burst of 10 after 4")
		})
	}
	t.Run("invalid key", func(t *testing.T) {
		r := newRig(t)
		for _, key := range []string{"", "a{b}", "new\nline", strings.Repeat("k", throttle.MaxKeyLen+1)} {
			err := r.lim.SetLimits(r.ctx, key, good...)
			assert.ErrorIs(t, err, throttle.ErrInvalidKey, "SetLimits(%q)", key)
		}
		assert.Empty(t, r.mr.Keys(), "keys written by refused SetLimits")
	})
}

// Errors say a limit in the user's words (issue 35): a cost too high names
// the tier by its position and its limit, never by how the script keys it
// ("tier 1000", "tier w60000"); a rate is written out, never in scientific
// notation.
func TestErrorsSayALimitInTheUsersWords(t *testing.T) {
	r := newRig(t)
	r.setLimits("slack", throttle.PerSecond(2), throttle.Window(100, time.Minute))
	r.setLimits("fixed", throttle.PerSecond(50), throttle.FixedWindow(20, time.Minute))
	r.setLimits("openai", throttle.PerMinute(500), throttle.PerMinute(30000).In("tokens"))
	for _, tc := range []struct {
		key  string
		opt  []asynq.Option
		says string
	}{
		{"slack", []asynq.Option{throttle.Cost(3)}, `a cost of 3, and tier 1 (2/s) holds at most 2`},
		{"fixed", []asynq.Option{throttle.Cost(21)}, `a cost of 21, and tier 2 (20/m:fixed) admits at most 20 per window`},
		{"openai", []asynq.Option{throttle.Uses("tokens", 40000)}, `tier 2 (30000/m:tokens) holds at most 30000 tokens`},
	} {
		_, err := r.lim.Take(r.ctx, tc.key, tc.opt...)
		require.ErrorIs(t, err, throttle.ErrCostTooHigh, "Take(%q, %v)", tc.key, tc.opt)
		assert.Contains(t, err.Error(), tc.says, "Take(%q, %v)", tc.key, tc.opt)
	}
	r.setLimits("w", throttle.PerSecond(500), throttle.Window(100, time.Minute))
	_, err := r.lim.Take(r.ctx, "w", throttle.Cost(101))
	assert.ErrorContains(t, err, `tier 2 (100/m:window) admits at most 100 per window`)

	err = r.lim.SetLimits(r.ctx, "k", throttle.Limit{N: 99_999_999, Per: time.Second})
	require.ErrorIs(t, err, throttle.ErrInvalidLimit)
	assert.Contains(t, err.Error(), "99999999 per second is above the maximum 1000000 per second")
	assert.NotContains(t, err.Error(), "e+")
}
