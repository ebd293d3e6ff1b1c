package throttle_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestTakeAdmitsTheBurstThenTheRefill(t *testing.T) {
	tests := []struct {
		name      string
		limit     throttle.Limit
		burst     int
		interval  time.Duration // time for one token
		remaining []int         // Remaining of each allowed take
	}{
		{"PerSecond(5)", throttle.PerSecond(5), 5, 200 * time.Millisecond, []int{4, 3, 2, 1, 0}},
		{"PerMinute(2).WithBurst(3)", throttle.PerMinute(2).WithBurst(3), 3, 30 * time.Second, []int{2, 1, 0}},
		{"PerHour(1)", throttle.PerHour(1), 1, time.Hour, []int{0}},
		{"Limit{3, 1500ms, 1}", throttle.Limit{N: 3, Per: 1500 * time.Millisecond, Burst: 1}, 1, 500 * time.Millisecond, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.limit)
			for i, want := range tt.remaining {
				d := r.take("k")
				assertAllowed(t, d, fmt.Sprintf("Take #%d", i+1))
				assert.Equal(t, want, d.Remaining, "Take #%d: Remaining", i+1)
			}
			d := r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, tt.interval, "Take after the burst")
			assert.Equal(t, 1, d.Tier, "Take after the burst: Tier")

			r.advance(tt.interval - time.Millisecond)
			d = r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, time.Millisecond, "Take 1ms before the next token")

			r.advance(time.Millisecond)
			assertAllowed(t, r.take("k"), "Take when the next token is due")
			assertRefused(t, r.take("k"), throttle.RefusedByTier, tt.interval, "Take right after")
		})
	}
}

// TestTakeRetryAfterIsEnough: a refusal always asks to wait (RetryAfter >
// 0), and coming back after exactly RetryAfter is admitted, for rates whose
// token interval is not a whole number of microseconds.
func TestTakeRetryAfterIsEnough(t *testing.T) {
	for rate := 1; rate <= 40; rate++ {
		t.Run(fmt.Sprintf("PerSecond(%d)", rate), func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", throttle.PerSecond(rate).WithBurst(1))
			assertAllowed(t, r.take("k"), "first Take")
			for i := 0; i < 3; i++ {
				d := r.take("k")
				require.False(t, d.Allowed, "Take #%d right after a take: %+v", i, d)
				require.Positive(t, d.RetryAfter, "Take #%d: RetryAfter of a refusal (%+v)", i, d)
				r.advance(d.RetryAfter)
				d2 := r.take("k")
				require.True(t, d2.Allowed, "Take #%d again after RetryAfter %v: %+v", i, d.RetryAfter, d2)
			}
		})
	}
}

// TestTakeOnALongPeriodIsNeverEarly: for long periods a token is not handed out
// before it is due, and Remaining is never negative.
func TestTakeOnALongPeriodIsNeverEarly(t *testing.T) {
	for _, l := range []throttle.Limit{
		throttle.PerSecond(1),
		throttle.PerMinute(1),
		{N: 1, Per: 1000 * time.Second},
		throttle.PerHour(1),
		{N: 1, Per: throttle.MaxPer},
	} {
		t.Run(l.String(), func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", l)
			assertAllowed(t, r.take("k"), "first Take")
			r.advance(l.Per - time.Microsecond)
			d := r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, time.Microsecond, fmt.Sprintf("Take %v later (1us early)", l.Per-time.Microsecond))
			assert.GreaterOrEqual(t, d.Remaining, 0, "Remaining")
			r.advance(time.Microsecond)
			d = r.take("k")
			assertAllowed(t, d, fmt.Sprintf("Take %v later", l.Per))
			assert.Equal(t, 0, d.Remaining, "Remaining")
		})
	}
}

func TestTakeTakesFromAllTiersOrNone(t *testing.T) {
	r := newRig(t)
	// 10/s with burst 10, and 3/min with burst 3: the minute tier runs dry first.
	r.setLimits("k", throttle.PerSecond(10), throttle.PerMinute(3))
	n, d := r.takeAll("k", 100)
	assert.Equal(t, 3, n, "allowed before the minute tier refused")
	assertRefused(t, d, throttle.RefusedByTier, 20*time.Second, "Take #4")
	assert.Equal(t, 2, d.Tier, "Take #4: Tier")

	// The refused take took nothing from tier 1.
	s := r.inspect("k")
	require.Len(t, s.Tokens, 2, "Inspect tokens")
	assert.InDelta(t, 7, s.Tokens[0], 1e-9, "tier 1 tokens after 3 takes and a refusal")
	assert.InDelta(t, 0, s.Tokens[1], 1e-9, "tier 2 tokens after 3 takes")
}

func TestTakeIsRefusedByTheTierWithTheLongestWait(t *testing.T) {
	r := newRig(t)
	// Tier 1: 1/s burst 5. Tier 2: 6/min burst 6 (one token per 10 s).
	r.setLimits("k", throttle.PerSecond(1).WithBurst(5), throttle.PerMinute(6))
	n, d := r.takeAll("k", 10)
	require.Equal(t, 5, n, "allowed from full buckets")
	assertRefused(t, d, throttle.RefusedByTier, time.Second, "Take #6 (tier 1 empty, tier 2 has 1)")
	assert.Equal(t, 1, d.Tier, "Take #6: Tier")

	r.advance(time.Second) // tier 1: 1, tier 2: 1.1
	assertAllowed(t, r.take("k"), "Take at +1s")

	r.advance(500 * time.Millisecond) // tier 1: 0.5 (wait 0.5 s), tier 2: 0.15 (wait 8.5 s)
	d = r.take("k")
	assertRefused(t, d, throttle.RefusedByTier, 8500*time.Millisecond, "Take at +1.5s, both tiers short")
	assert.Equal(t, 2, d.Tier, "Take at +1.5s: Tier is the one with the longest wait")

	r.advance(500 * time.Millisecond) // tier 1: 1, tier 2: 0.2 (wait 8 s)
	d = r.take("k")
	assertRefused(t, d, throttle.RefusedByTier, 8*time.Second, "Take at +2s, only tier 2 short")
	assert.Equal(t, 2, d.Tier, "Take at +2s: Tier")
}

func TestLongIdleGivesOneBurst(t *testing.T) {
	tests := []struct {
		name  string
		limit throttle.Limit
		idle  time.Duration
		burst int
	}{
		{"PerSecond(10).WithBurst(3) idle 1000h", throttle.PerSecond(10).WithBurst(3), 1000 * time.Hour, 3},
		{"PerMinute(1).WithBurst(5) idle 30 days", throttle.PerMinute(1).WithBurst(5), 30 * 24 * time.Hour, 5},
		{"Limit{1, 1000s, 2} idle 10 years", throttle.Limit{N: 1, Per: 1000 * time.Second, Burst: 2}, 10 * 365 * 24 * time.Hour, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, throttle.WithDefaultLimits(tt.limit))
			n, _ := r.takeAll("k", 100)
			require.Equal(t, tt.burst, n, "first burst")
			r.setClock(r.now.Add(tt.idle)) // TIME only: the bucket state is still there
			n, _ = r.takeAll("k", 100)
			assert.Equal(t, tt.burst, n, "takes after idle %v with the state kept", tt.idle)

			r.advance(tt.idle) // TIME and expiry: the state is gone
			n, _ = r.takeAll("k", 100)
			assert.Equal(t, tt.burst, n, "takes after idle %v with the state expired", tt.idle)
		})
	}
}

func TestSlowestAndFastestRatesAreExact(t *testing.T) {
	t.Run("0.001/s", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.Limit{N: 1, Per: 1000 * time.Second})
		assertAllowed(t, r.take("k"), "first Take")
		assertRefused(t, r.take("k"), throttle.RefusedByTier, 1000*time.Second, "second Take")
		r.advance(999_999 * time.Millisecond)
		assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Millisecond, "Take after 999.999 s")
		r.advance(time.Millisecond)
		assertAllowed(t, r.take("k"), "Take after exactly 1000 s")
	})
	t.Run("1e6/s burst 1", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(throttle.MaxRatePerSecond).WithBurst(1))
		assertAllowed(t, r.take("k"), "first Take")
		allowed := 0
		for us := 1; us <= 1000; us++ {
			r.advance(time.Microsecond)
			d := r.take("k")
			if d.Allowed {
				allowed++
			}
			d = r.take("k")
			if !assert.False(t, d.Allowed, "second Take at +%dus: %+v", us, d) {
				return
			}
			assert.Equal(t, time.Microsecond, d.RetryAfter, "second Take at +%dus: RetryAfter", us)
		}
		assert.Equal(t, 1000, allowed, "takes allowed in 1 ms at one per microsecond")
	})
	t.Run("1e6/s full burst", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(throttle.MaxRatePerSecond))
		s := r.inspect("k")
		require.Len(t, s.Tokens, 1, "Inspect tokens")
		assert.Equal(t, float64(throttle.MaxRatePerSecond), s.Tokens[0], "tokens of a fresh 1e6/s bucket")
		d := r.take("k")
		assertAllowed(t, d, "Take")
		assert.Equal(t, throttle.MaxRatePerSecond-1, d.Remaining, "Remaining")
	})
}

// bucketModel is an exact integer token bucket: tokens are counted in units of
// 1/per_us of a token, so every refill is an integer.
type bucketModel struct {
	rate, perUS, burstU, tokensU, ts int64
}

func (m *bucketModel) take(now int64) bool {
	m.tokensU = min(m.burstU, m.tokensU+(now-m.ts)*m.rate)
	m.ts = now
	if m.tokensU >= m.perUS {
		m.tokensU -= m.perUS
		return true
	}
	return false
}

func TestRatesDoNotDriftFromAnExactBucket(t *testing.T) {
	// miniredis runs a script in about 0.7 ms: 10^4 steps is a few seconds.
	long, short := 10_000, 2_000
	if testing.Short() {
		long, short = 1_000, 500
	}
	tests := []struct {
		name  string
		limit throttle.Limit
		steps int
		at    func(k int64) int64 // time of step k, us after the start
	}{
		{"3/s burst 1, steps of exactly 1/3 s rounded up", throttle.PerSecond(3).WithBurst(1), long,
			func(k int64) int64 { return (k*1_000_000 + 2) / 3 }},
		{"3/s burst 1, steps of 333333us", throttle.PerSecond(3).WithBurst(1), short,
			func(k int64) int64 { return k * 333_333 }},
		{"3/s burst 3, steps of exactly 1/3 s rounded down", throttle.PerSecond(3), short,
			func(k int64) int64 { return k * 1_000_000 / 3 }},
		{"7 per 3 s burst 2, steps of 428571us", throttle.Limit{N: 7, Per: 3 * time.Second, Burst: 2}, short,
			func(k int64) int64 { return k * 428_571 }},
		{"1000/s burst 1, steps of 999us", throttle.PerSecond(1000).WithBurst(1), short,
			func(k int64) int64 { return k * 999 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.setLimits("k", tt.limit)
			burst := tt.limit.Burst
			if burst == 0 {
				burst = tt.limit.N
			}
			m := bucketModel{rate: int64(tt.limit.N), perUS: tt.limit.Per.Microseconds()}
			m.burstU = int64(burst) * m.perUS
			m.tokensU = m.burstU
			var got, want int
			for k := int64(1); k <= int64(tt.steps); k++ {
				at := tt.at(k)
				r.setClock(epoch().Add(time.Duration(at) * time.Microsecond))
				w := m.take(at)
				d := r.take("k")
				if w {
					want++
				}
				if d.Allowed {
					got++
					if !assert.GreaterOrEqual(t, d.Remaining, 0, "step %d: Remaining of an allowed take", k) {
						return
					}
				}
				if !assert.Equal(t, w, d.Allowed, "step %d (t=%dus): Allowed (exact model has %d/%d tokens)", k, at, m.tokensU, m.perUS) {
					return
				}
			}
			assert.Equal(t, want, got, "admitted over %d steps", tt.steps)
		})
	}
}

func TestReasonStringNamesEachReason(t *testing.T) {
	for reason, want := range map[throttle.Reason]string{
		throttle.Reason(0):           "allowed",
		throttle.RefusedByTier:       "tier",
		throttle.RefusedBySuspension: "suspended",
		throttle.RefusedByQueue:      "queued",
		throttle.RefusedReserved:     "reserved",
		throttle.Reason(42):          "Reason(42)",
	} {
		assert.Equal(t, want, reason.String(), "Reason(%d).String()", int(reason))
	}
}
