package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestSetLimitsAtRunTimeCarriesTokensOver(t *testing.T) {
	tests := []struct {
		name     string
		before   []throttle.Limit
		taken    int           // takes before the change
		wait     time.Duration // between those takes and the change
		after    []throttle.Limit
		allowed  int           // takes allowed right after the change
		retry    time.Duration // RetryAfter of the first refusal
		tier     int
		wantTkns []float64 // Inspect tokens right after the change
	}{
		{
			name:   "lowering clamps at once",
			before: []throttle.Limit{throttle.PerSecond(10)}, after: []throttle.Limit{throttle.PerSecond(2)},
			allowed: 2, retry: 500 * time.Millisecond, tier: 1, wantTkns: []float64{2},
		},
		{
			name:   "raising grants no new burst",
			before: []throttle.Limit{throttle.PerSecond(2)}, taken: 2, after: []throttle.Limit{throttle.PerSecond(100)},
			allowed: 0, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{0},
		},
		{
			name:   "tokens brought up to date under the old rate",
			before: []throttle.Limit{throttle.PerSecond(1).WithBurst(10)}, taken: 10, wait: 5 * time.Second,
			after:   []throttle.Limit{throttle.PerSecond(100)},
			allowed: 5, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{5},
		},
		{
			name:   "refilled under the old rate, clamped to the new burst",
			before: []throttle.Limit{throttle.PerMinute(60)}, taken: 60, wait: 30 * time.Second,
			after:   []throttle.Limit{throttle.PerSecond(1).WithBurst(10)},
			allowed: 10, retry: time.Second, tier: 1, wantTkns: []float64{10},
		},
		{
			name:   "a new tier starts full, the old one keeps its debt",
			before: []throttle.Limit{throttle.PerSecond(5)}, taken: 5,
			after:   []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(100)},
			allowed: 0, retry: 200 * time.Millisecond, tier: 1, wantTkns: []float64{0, 100},
		},
		{
			name:   "dropping a tier",
			before: []throttle.Limit{throttle.PerSecond(100), throttle.PerMinute(3)}, taken: 3,
			after:   []throttle.Limit{throttle.PerSecond(100)},
			allowed: 97, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{97},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.before...)
			for i := 0; i < tt.taken; i++ {
				require.True(t, r.take("k").Allowed, "Take #%d before the change", i+1)
			}
			r.advance(tt.wait)
			r.setLimits("k", tt.after...)

			s := r.inspect("k")
			require.Len(t, s.Tokens, len(tt.wantTkns), "Inspect tokens after SetLimits(%v)", tt.after)
			for i, w := range tt.wantTkns {
				assert.InDelta(t, w, s.Tokens[i], 1e-9, "tier %d tokens after SetLimits(%v)", i+1, tt.after)
			}

			n, d := r.takeAll("k", 1000)
			assert.Equal(t, tt.allowed, n, "takes allowed after SetLimits(%v)", tt.after)
			assertRefused(t, d, throttle.RefusedByTier, tt.retry, "first refusal after SetLimits")
			assert.Equal(t, tt.tier, d.Tier, "first refusal: Tier")
		})
	}
}

// TestSetLimitsOnAKeyOnDefaultLimitsKeepsItsDebt: a key that ran on the limiter's default
// limits has a bucket but no config in Redis. SetLimits must still bring its
// tokens up to date under the limits it ran on and clamp them; it must not
// hand out the new limits' full burst.
func TestSetLimitsOnAKeyOnDefaultLimitsKeepsItsDebt(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerMinute(1)))
	assertAllowed(t, r.take("k"), "Take on the default 1/min")
	r.advance(30 * time.Second) // half a token under the old limit

	r.setLimits("k", throttle.PerMinute(120))
	// Under the old limit the bucket holds 0.5 token: the first token under
	// the new rate is 250 ms away.
	n, d := r.takeAll("k", 1000)
	assert.Equal(t, 0, n, "takes allowed right after SetLimits(PerMinute(120)) on a key that had 0.5 token")
	assertRefused(t, d, throttle.RefusedByTier, 250*time.Millisecond, "first Take after SetLimits")
}

// A SetLimits from a Limiter that does not know the defaults the workers'
// decisions used still carries their tokens over: the buckets record the
// defaults they were computed under. The limits are kept until Delete.
func TestSetLimitsFromALimiterWithoutTheDefaultsKeepsTheTokens(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerMinute(600).WithBurst(10)))
	n, _ := r.takeAll("k", 100)
	require.Equal(t, 10, n, "burst of the default limit")
	operator := throttle.NewLimiter(r.rdb) // no defaults
	require.NoError(t, operator.SetLimits(r.ctx, "k", throttle.PerMinute(10)), "SetLimits from the operator's Limiter")
	assert.Zero(t, r.mr.TTL(redisKey("k", "c")), "the configuration is kept until Delete")
	assert.Positive(t, r.mr.TTL(bucket("k")), "the hash lives with its state")

	r.advance(2 * time.Second)
	n, d := r.takeAll("k", 100)
	assert.Equal(t, 0, n, "takes allowed 2 s after lowering an exhausted bucket to 10/min")
	assertRefused(t, d, throttle.RefusedByTier, 4*time.Second, "refusal 2 s after lowering")
	r.advance(4 * time.Second)
	n, _ = r.takeAll("k", 100)
	assert.Equal(t, 1, n, "takes allowed 6 s after lowering: one token of 10/min")
}

// A tier is identified by its period: whatever SetLimits does with the list,
// a tier keeps its tokens. On a used-up 1000/s + 10/h key, reordering the
// tiers, adding one in front or dropping the first admits nothing more.
func TestSetLimitsTierDebtSurvivesEveryChange(t *testing.T) {
	sec, hour := throttle.PerSecond(1000), throttle.PerHour(10)
	tests := []struct {
		name  string
		after []throttle.Limit
		want  int // admitted within 0.2 s after the change
	}{
		{"reordered", []throttle.Limit{hour, sec}, 0},
		{"tier added in front", []throttle.Limit{throttle.PerMinute(100), sec, hour}, 0},
		{"first tier dropped", []throttle.Limit{hour}, 0},
		{"hourly burst lowered", []throttle.Limit{sec, hour.WithBurst(5)}, 0},
		{"hourly rate raised: no sudden burst", []throttle.Limit{sec, throttle.PerHour(20)}, 0},
		{"a new period starts full", []throttle.Limit{throttle.PerMinute(3)}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", sec, hour)
			n, _ := r.takeAll("k", 100)
			require.Equal(t, 10, n, "the hourly tier's burst")
			r.setLimits("k", tt.after...)
			got := 0
			for range 10 {
				r.advance(20 * time.Millisecond)
				for r.take("k").Allowed {
					got++
				}
			}
			assert.Equal(t, tt.want, got, "admitted within 0.2 s after SetLimits(%v)", tt.after)
		})
	}
}

func TestRedisLimitsWinOverDefaultsAndNoneIsErrNoLimits(t *testing.T) {
	ten := []throttle.Limit{throttle.PerSecond(10)}
	five := []throttle.Limit{throttle.PerMinute(5)}
	tests := []struct {
		name    string
		opts    []throttle.Option
		stored  []throttle.Limit // SetLimits before, nil for none
		key     string
		want    []throttle.Limit // nil: ErrNoLimits
		allowed int
	}{
		{"no config, no defaults", nil, nil, "slack", nil, 0},
		{"default limits", []throttle.Option{throttle.WithDefaultLimits(ten...)}, nil, "slack", ten, 10},
		{"redis wins over defaults", []throttle.Option{throttle.WithDefaultLimits(ten...)}, five, "slack", []throttle.Limit{throttle.PerMinute(5).WithBurst(5)}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			if tt.stored != nil {
				r.setLimits(tt.key, tt.stored...)
			}
			got, err := throttle.Limits(r.lim, r.ctx, tt.key)
			d, terr := r.lim.Take(r.ctx, tt.key)
			if tt.want == nil {
				assert.ErrorIs(t, err, throttle.ErrNoLimits, "Limits(%q) = %v", tt.key, got)
				assert.ErrorIs(t, terr, throttle.ErrNoLimits, "Take(%q) = %+v", tt.key, d)
				s := r.inspect(tt.key)
				assert.Nil(t, s.Limits, "Inspect(%q).Limits without limits", tt.key)
				return
			}
			require.NoError(t, err, "Limits(%q)", tt.key)
			assert.Equal(t, effective(tt.want), got, "Limits(%q)", tt.key)
			require.NoError(t, terr, "Take(%q)", tt.key)
			n, _ := r.takeAll(tt.key, 100)
			assert.Equal(t, tt.allowed, n+1, "takes allowed under %v", tt.want)
		})
	}
}

func TestLimitsReadBackWhatSetLimitsStored(t *testing.T) {
	tests := []struct {
		name   string
		limits []throttle.Limit
	}{
		{"one tier", []throttle.Limit{throttle.PerSecond(10).WithBurst(20)}},
		{"burst 0 means rate", []throttle.Limit{throttle.PerMinute(50)}},
		{"four tiers", []throttle.Limit{throttle.PerSecond(5).WithBurst(1), throttle.PerMinute(100), throttle.PerHour(1000), {N: 5000, Per: 24 * time.Hour, Burst: 10}}},
		{"odd period", []throttle.Limit{{N: 3, Per: 1500 * time.Millisecond, Burst: 2}}},
		{"extremes", []throttle.Limit{throttle.PerSecond(throttle.MaxRatePerSecond).WithBurst(throttle.MaxBurst), {N: 1, Per: throttle.MaxPer, Burst: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.limits...)
			got, err := throttle.Limits(r.lim, r.ctx, "k")
			require.NoError(t, err, "Limits(k) after SetLimits(%v)", tt.limits)
			want := make([]throttle.Limit, len(tt.limits))
			for i, l := range tt.limits {
				if l.Burst == 0 {
					l.Burst = l.N
				}
				want[i] = l
			}
			assert.Equal(t, want, got, "Limits(k) after SetLimits(%v)", tt.limits)
			assert.Equal(t, want, r.inspect("k").Limits, "Inspect(k).Limits")
		})
	}
}
