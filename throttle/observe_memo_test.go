package throttle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// A bucket's burst told at the quota in force is sent when it could change
// the burst: below it beyond rounding at once, above it at most once per
// observeGap; within rounding (observe.lua keeps the burst) not at all.
func TestPoliciesDueSendsABurstBeyondRounding(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	due := func(inForce, told int64, since time.Duration) bool {
		m := &observeMemo{sentAt: now.Add(-since), told: true,
			tiers: []lua.ObservedTier{{PerMS: 60_000, InForce: 1000, Configured: 10_000, Burst: inForce}}}
		return m.policiesDue([]lua.Policy{{Quota: 1000, PerMS: 60_000, Burst: told}}, now, time.Minute)
	}
	assert.False(t, due(16, 16, 10*time.Millisecond), "the burst in force")
	assert.False(t, due(16, 15, 10*time.Millisecond), "one below a small burst: rounding")
	assert.True(t, due(16, 14, 10*time.Millisecond), "lower: at once")
	assert.False(t, due(15, 16, 10*time.Millisecond), "higher: not within observeGap")
	assert.True(t, due(15, 16, 2*time.Second), "higher: after observeGap")
	assert.False(t, due(2_000_000, 1_980_000, 10*time.Millisecond), "within 1 % below")
	assert.True(t, due(2_000_000, 1_979_999, 10*time.Millisecond), "more than 1 % below")
	assert.False(t, due(2_000_000, 2_020_000, 2*time.Second), "within 1 % above")
	assert.True(t, due(2_000_000, 2_020_001, 2*time.Second), "more than 1 % above")
	assert.False(t, due(16, 0, 2*time.Second), "no burst told")

	m := &observeMemo{sentAt: now.Add(-10 * time.Millisecond), told: true,
		tiers: []lua.ObservedTier{{PerMS: 1000, InForce: 10, Configured: 10}}}
	assert.False(t, m.policiesDue([]lua.Policy{{Quota: 10, PerMS: 1000, Burst: 3}}, now, time.Minute), "a window: no burst")
}

// A burst is sent too when the quota told is above the configured one (the
// tier in force at its ceiling): the bucket can still hold less.
func TestPoliciesDueSendsABurstAtTheCeiling(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	m := &observeMemo{sentAt: now.Add(-10 * time.Millisecond), told: true,
		tiers: []lua.ObservedTier{{PerMS: 60_000, InForce: 500, Configured: 500, Burst: 500}}}
	assert.True(t, m.policiesDue([]lua.Policy{{Quota: 1000, PerMS: 60_000, Burst: 16}}, now, time.Minute))
	assert.False(t, m.policiesDue([]lua.Policy{{Quota: 1000, PerMS: 60_000, Burst: 499}}, now, time.Minute))
}
