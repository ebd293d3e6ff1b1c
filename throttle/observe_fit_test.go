package throttle

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// fitPolicies fits a quota whose window only the provider's docs state to
// the key's tiers: as it is to a tier of its period; else converted to the
// tier of its unit of the nearest period that no other quota of the
// response speaks of, rounded down, only when below the tier's configured
// quota, the lowest when several; as it is when the key has no tier of its
// unit (for Redis to warn about).
func TestFitPoliciesConvertsToTheNearestTierOnlyLowering(t *testing.T) {
	const s, m, h, d = 1000, 60_000, 3_600_000, 86_400_000
	tier := func(per, configured int64, unit string) lua.ObservedTier {
		return lua.ObservedTier{PerMS: per, InForce: configured, Configured: configured, Unit: unit}
	}
	pol := func(q, per int64) lua.Policy { return lua.Policy{Quota: q, PerMS: per} }
	tests := []struct {
		name       string
		fit, exact []lua.Policy
		tiers      []lua.ObservedTier
		want       []lua.Policy
	}{
		{"a tier of its period: as it is", []lua.Policy{pol(5000, h)}, nil,
			[]lua.ObservedTier{tier(s, 20, ""), tier(h, 50000, "")}, []lua.Policy{pol(5000, h)}},
		{"the only tier: converted, rounded down", []lua.Policy{pol(5000, h)}, nil,
			[]lua.ObservedTier{tier(s, 14, "")}, []lua.Policy{pol(1, s)}},
		{"the nearest period", []lua.Policy{pol(5000, h)}, nil,
			[]lua.ObservedTier{tier(s, 20, ""), tier(m, 830, "")}, []lua.Policy{pol(83, m)}},
		{"less than one per the tier's period: sent as it is, for Redis to warn (1 a second would admit 86,400 a day)", []lua.Policy{pol(10, d)}, nil,
			[]lua.ObservedTier{tier(s, 5, "")}, []lua.Policy{pol(10, d)}},
		{"upwards too: 30 a minute is 1,800 an hour", []lua.Policy{pol(30, m)}, nil,
			[]lua.ObservedTier{tier(h, 3000, "")}, []lua.Policy{pol(1800, h)}},
		{"not below the configured: nothing", []lua.Policy{pol(5000, h)}, nil,
			[]lua.ObservedTier{tier(m, 60, "")}, nil},
		{"a tier another quota of the response speaks of is not taken", []lua.Policy{pol(10, s), pol(250000, d)},
			[]lua.Policy{pol(100, 10_000)},
			[]lua.ObservedTier{tier(s, 100, ""), tier(10_000, 1000, "")}, []lua.Policy{pol(10, s)}},
		{"the lowest of two to one tier", []lua.Policy{pol(5000, h), pol(100, m)}, nil,
			[]lua.ObservedTier{tier(s, 20, "")}, []lua.Policy{pol(1, s)}},
		{"another unit's tiers are not its", []lua.Policy{pol(5000, h)}, nil,
			[]lua.ObservedTier{tier(s, 20000, "tokens"), tier(s, 20, "")}, []lua.Policy{pol(1, s)}},
		{"no tier of its unit: as it is", []lua.Policy{{Quota: 5000, PerMS: h, Unit: "tokens"}}, nil,
			[]lua.ObservedTier{tier(s, 20, "")}, []lua.Policy{{Quota: 5000, PerMS: h, Unit: "tokens"}}},
		{"no tiers told: as it is", []lua.Policy{pol(5000, h)}, nil, nil, []lua.Policy{pol(5000, h)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, fitPolicies(tt.fit, tt.exact, tt.tiers), "fitPolicies(%v, %v, %v)", tt.fit, tt.exact, tt.tiers)
		})
	}
}
