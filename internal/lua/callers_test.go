package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A lone caller without a task ID is sent as its cost alone, or as nothing
// for a cost of 1; any other caller as its pair.
func TestAppendCallersSendsALoneCostAlone(t *testing.T) {
	assert.Empty(t, AppendCallers(nil, "", 1), "a Take")
	assert.Equal(t, []any{3}, AppendCallers(nil, "", 3))
	assert.Equal(t, []any{"1,tokens=100"}, AppendCallers(nil, "", "1,tokens=100"))
	assert.Equal(t, []any{"a", 1}, AppendCallers(nil, "a", 1), "a task ID")
	assert.Equal(t, []any{"", 2, "b", 1}, AppendCallers(nil, "", 2, "b", 1), "two callers")
}

// A cost sent alone decides exactly as the pair ("", cost): same replies,
// same state, on the common path (admitted at once), the general one
// (refused; a key with a window) and with a horizon (no task ID: no
// reservation).
func TestACostAloneDecidesAsTheCallerWithoutID(t *testing.T) {
	costs := []string{"1,tokens=12000", "1,tokens=12000", "1,tokens=12000", "2", "1", "1,tokens=100,images=3", "1,tokens=30001"}
	modes := []DecideArgs{
		{},
		{Horizon: time.Minute, Lapse: time.Minute},
	}
	limits := [][]Tier{
		llmTiers,
		{{Rate: 500, PerMS: 60000, Burst: 500}, {Kind: KindWindow, Rate: 30000, PerMS: 60000, Unit: "tokens"}},
	}
	for _, tiers := range limits {
		for _, mode := range modes {
			alone, pair := newEnv(t), newEnv(t)
			alone.setLimits(tiers...)
			pair.setLimits(tiers...)
			for i, c := range costs {
				alone.at(time.Duration(i) * 10 * time.Millisecond)
				pair.at(time.Duration(i) * 10 * time.Millisecond)
				got, err := alone.run.Do(alone.ctx, DecideScript, append(AppendDecideArgs(nil, ModeEval, alone.k, mode), c))
				require.NoError(t, err)
				want, err := pair.run.Do(pair.ctx, DecideScript, append(AppendDecideArgs(nil, ModeEval, pair.k, mode), "", c))
				require.NoError(t, err)
				assert.Equal(t, want, got, "cost %q under %+v (horizon %v)", c, tiers, mode.Horizon)
			}
			assert.Equal(t, pair.mr.Dump(), alone.mr.Dump(), "Redis after the same calls, %+v (horizon %v)", tiers, mode.Horizon)
		}
	}
}
