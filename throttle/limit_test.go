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

func TestLimitConstructorsSetNAndPer(t *testing.T) {
	tests := []struct {
		got  throttle.Limit
		want throttle.Limit
		str  string
	}{
		{throttle.PerSecond(10), throttle.Limit{N: 10, Per: time.Second}, "10/1s burst 10"},
		{throttle.PerMinute(50), throttle.Limit{N: 50, Per: time.Minute}, "50/1m0s burst 50"},
		{throttle.PerHour(1000), throttle.Limit{N: 1000, Per: time.Hour}, "1000/1h0m0s burst 1000"},
		{throttle.PerSecond(1).WithBurst(3), throttle.Limit{N: 1, Per: time.Second, Burst: 3}, "1/1s burst 3"},
		{throttle.PerMinute(6).WithBurst(0), throttle.Limit{N: 6, Per: time.Minute}, "6/1m0s burst 6"},
	}
	for _, tt := range tests {
		t.Run(tt.str, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.got, "constructed limit")
			assert.Equal(t, tt.str, tt.got.String(), "%#v.String()", tt.got)
		})
	}
	base := throttle.PerSecond(5)
	_ = base.WithBurst(9)
	assert.Equal(t, 0, base.Burst, "WithBurst changed its receiver")
}

func TestSetLimitsRefusesInvalidLimitsNamingTheField(t *testing.T) {
	nine := []throttle.Limit{throttle.PerSecond(1), throttle.PerMinute(1), throttle.PerHour(1), throttle.PerHour(2), throttle.PerHour(3),
		throttle.PerSecond(1).In("tokens"), throttle.PerMinute(1).In("tokens"), throttle.Window(1, time.Second), throttle.FixedWindow(1, time.Second)}
	tests := []struct {
		name   string
		limits []throttle.Limit
		field  string // the error names it
	}{
		{"no tiers", nil, "no limits"},
		{"nine tiers", nine, "9 limits"},
		{"Rate 0", []throttle.Limit{{N: 0, Per: time.Second}}, "limits[0].N"},
		{"Rate negative", []throttle.Limit{{N: -1, Per: time.Second}}, "limits[0].N"},
		{"Per 0", []throttle.Limit{{N: 1}}, "limits[0].Per"},
		{"Per negative", []throttle.Limit{{N: 1, Per: -time.Second}}, "limits[0].Per"},
		{"Per not whole ms", []throttle.Limit{{N: 1, Per: 1500 * time.Microsecond}}, "limits[0].Per"},
		{"Per 1ns", []throttle.Limit{{N: 1, Per: time.Nanosecond}}, "limits[0].Per"},
		{"Per above 30 days", []throttle.Limit{{N: 1, Per: throttle.MaxPer + time.Millisecond}}, "limits[0].Per"},
		{"Burst negative", []throttle.Limit{throttle.PerSecond(1).WithBurst(-1)}, "limits[0].Burst"},
		{"Burst above 1e9", []throttle.Limit{throttle.PerSecond(1).WithBurst(throttle.MaxBurst + 1)}, "limits[0].Burst"},
		{"Rate (as burst) above 1e9", []throttle.Limit{{N: throttle.MaxBurst + 1, Per: throttle.MaxPer}}, "limits[0].Burst"},
		{"rate above 1e6/s", []throttle.Limit{throttle.PerSecond(throttle.MaxRatePerSecond + 1)}, "limits[0].N"},
		{"rate above 1e6/s per ms", []throttle.Limit{{N: 1001, Per: time.Millisecond}}, "limits[0].N"},
		{"second tier bad", []throttle.Limit{throttle.PerSecond(1), {N: 0, Per: time.Minute}}, "limits[1].N"},
	}
	r := newRig(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.lim.SetLimits(r.ctx, "k", tt.limits...)
			require.ErrorIs(t, err, throttle.ErrInvalidLimit, "SetLimits(k, %v)", tt.limits)
			assert.Contains(t, err.Error(), tt.field, "SetLimits(k, %v): error names the field", tt.limits)
			assert.Empty(t, r.mr.Keys(), "SetLimits(k, %v) wrote to Redis", tt.limits)
		})
	}
}

func TestSetLimitsAcceptsTheBoundaries(t *testing.T) {
	four := []throttle.Limit{throttle.PerSecond(10), throttle.PerMinute(100), throttle.PerHour(1000), {N: 10000, Per: 24 * time.Hour}}
	tests := []struct {
		name   string
		limits []throttle.Limit
	}{
		{"1e6/s", []throttle.Limit{throttle.PerSecond(throttle.MaxRatePerSecond)}},
		{"1000 per 1ms", []throttle.Limit{{N: 1000, Per: time.Millisecond}}},
		{"1/30 days", []throttle.Limit{{N: 1, Per: throttle.MaxPer}}},
		{"burst 1e9", []throttle.Limit{throttle.PerSecond(1).WithBurst(throttle.MaxBurst)}},
		{"four tiers", four},
	}
	// Every whole-millisecond period at exactly 1e6/s is on the boundary.
	for _, ms := range []int{3, 7, 9, 18, 36, 43} {
		tests = append(tests, struct {
			name   string
			limits []throttle.Limit
		}{fmt.Sprintf("%d per %dms (1e6/s)", ms*1000, ms), []throttle.Limit{{N: ms * 1000, Per: time.Duration(ms) * time.Millisecond}}})
	}
	r := newRig(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.mr.FlushAll()
			require.NoError(t, r.lim.SetLimits(r.ctx, "k", tt.limits...), "SetLimits(k, %v)", tt.limits)
			d, err := r.lim.Take(r.ctx, "k")
			require.NoError(t, err, "Take after SetLimits(k, %v)", tt.limits)
			assert.True(t, d.Allowed, "Take after SetLimits(k, %v): %+v", tt.limits, d)
		})
	}
}

func TestValidateKeyRefusesBadNames(t *testing.T) {
	valid := []string{"slack", "github:org-1", "ünïcode", "with space", "a", strings.Repeat("k", throttle.MaxKeyLen), strings.Repeat("é", throttle.MaxKeyLen/2),
		"{slack}:T0123", "{slack}app", "{a b}:c"}
	for _, k := range valid {
		assert.NoError(t, throttle.ValidateKey(k), "ValidateKey(%q)", k)
	}
	invalid := []string{
		"", strings.Repeat("k", throttle.MaxKeyLen+1), strings.Repeat("é", throttle.MaxKeyLen/2) + "k",
		"a{b", "a}b", "{slack}", "{}", "{}x", "{slack", "{sl{ack}:x", "{slack}:x}", "{slack}:{x}", "a{slack}:x", "\x00", "nul\x00", "tab\t", "new\nline", "\x7f", "\xff", "\xff\xfe", "a\xc3", "\u200b", "\u00a0",
	}
	for _, k := range invalid {
		assert.ErrorIs(t, throttle.ValidateKey(k), throttle.ErrInvalidKey, "ValidateKey(%q)", k)
	}
}

func TestValidKeysDecide(t *testing.T) {
	r := newRig(t)
	for _, k := range []string{"slack", "github:org-1", "ünïcode", strings.Repeat("k", throttle.MaxKeyLen)} {
		r.setLimits(k, throttle.PerSecond(1))
		assertAllowed(t, r.take(k), fmt.Sprintf("Take(%q)", k))
		assert.NotEmpty(t, r.tierState(k), "bucket of %q at %s", k, bucket(k))
	}
}
