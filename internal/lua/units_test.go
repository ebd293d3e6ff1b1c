package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llmTiers are 500 requests and 30,000 tokens per minute: two buckets of
// one period, one per unit.
var llmTiers = []Tier{{Rate: 500, PerMS: 60000, Burst: 500}, {Rate: 30000, PerMS: 60000, Burst: 30000, Unit: "tokens"}}

// A task takes a request from the request tier and what it uses of tokens
// from the tokens tier, both or neither; two tiers of one period in two
// units are two buckets.
func TestUnitsAreTakenFromTheirOwnTiersAllOrNothing(t *testing.T) {
	e := newEnv(t)
	e.setLimits(llmTiers...)
	a := DecideArgs{}
	tokens := func() []float64 {
		t.Helper()
		r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
		require.NoError(t, err)
		require.Equal(t, []string{"", "tokens"}, []string{r.Tiers[0].Unit, r.Tiers[1].Unit}, "each tier's unit")
		return r.Tokens
	}
	a.Units = "tokens=12000"
	require.Equal(t, StatusAllowed, e.decide(a).Status)
	assert.Equal(t, []float64{499, 18000}, tokens(), "a request and 12,000 tokens")
	require.Equal(t, StatusAllowed, e.decide(a).Status)
	assert.Equal(t, []float64{498, 6000}, tokens())

	r := e.decide(a)
	require.Equal(t, StatusDenied, r.Status, "6,000 tokens left for a task of 12,000")
	assert.Equal(t, "tier:2", r.RefusedBy)
	assert.Equal(t, 12*time.Second, r.RetryAfter, "6,000 more tokens at 500 a second")
	assert.Equal(t, []float64{498, 6000}, tokens(), "refused: no request taken either")

	a.Units = ""
	require.Equal(t, StatusAllowed, e.decide(a).Status, "a task that says no tokens takes none")
	assert.Equal(t, []float64{497, 6000}, tokens())
	a.Units, a.Cost = "tokens=100,images=3", 2
	require.Equal(t, StatusAllowed, e.decide(a).Status, "a unit the key has no tier of limits nothing")
	assert.Equal(t, []float64{495, 5900}, tokens())
}

// A unit's count above what its tier can ever hold is refused for good,
// naming the tier; the request tier alone never refuses it.
func TestAUnitAboveItsTiersBurstIsRefusedForGood(t *testing.T) {
	e := newEnv(t)
	e.setLimits(llmTiers...)
	r := e.decide(DecideArgs{Units: "tokens=30001"})
	require.Equal(t, StatusCostTooHigh, r.Status, "%+v", r)
	assert.Equal(t, "2", r.Field, "the tokens tier, by its position")
	assert.Equal(t, "30000", r.Reason)
	assert.Equal(t, Tier{Rate: 30000, PerMS: 60000, Burst: 30000, Unit: "tokens"}, r.TooHigh)
}

// Reservations space a backlog by what binds: tasks of 10,000 tokens on
// 600 requests and 60,000 tokens a minute come one every 10 s (the
// tokens), not every 0.1 s (the requests).
func TestReservationsAreSpacedByTheBindingUnit(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 600, PerMS: 60000, Burst: 1}, Tier{Rate: 60000, PerMS: 60000, Burst: 10000, Unit: "tokens"})
	var at []time.Duration
	for i := range 4 {
		r := e.decide(DecideArgs{Horizon: time.Hour, Units: "tokens=10000", TaskID: string(rune('a' + i)), Book: true})
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		at = append(at, r.Reserved.Sub(testEpoch()))
	}
	assert.Equal(t, []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second}, at, "reserved instants")
}

// A settlement of one unit moves that unit's tiers alone: a refund of
// tokens gives tokens back (what has not refilled since), a surcharge
// takes more, and the request tier is left as it is.
func TestASettlementMovesItsUnitAlone(t *testing.T) {
	e := newEnv(t)
	e.setLimits(llmTiers...)
	r := e.decide(DecideArgs{Units: "tokens=20000"})
	require.Equal(t, StatusAllowed, r.Status)
	call := Call{At: r.At, Charged: 20000, Generation: r.Generation, Unit: "tokens"}
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -15000, call, nil))
	got, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{499, 25000}, got.Tokens, "15,000 tokens back; the request stays taken")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, 2000, Call{Generation: -1, Unit: "tokens"}, nil))
	got, err = Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{499, 23000}, got.Tokens, "2,000 more tokens")
	require.NoError(t, Adjust(e.ctx, e.run, e.k, 3, Call{Generation: -1}, nil))
	got, err = Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{496, 23000}, got.Tokens, "a request settlement moves the request tier alone")
}

// Eight tiers in three units, buckets and windows, hold together.
func TestEightTiersInSeveralUnits(t *testing.T) {
	e := newEnv(t)
	e.setLimits(
		Tier{Rate: 5, PerMS: 1000, Burst: 5}, Tier{Rate: 100, PerMS: 60000, Burst: 100},
		Tier{Kind: KindWindow, Rate: 1000, PerMS: 3600000, Burst: 1000},
		Tier{Rate: 4000, PerMS: 60000, Burst: 4000, Unit: "input-tokens"}, Tier{Rate: 100000, PerMS: 86400000, Burst: 100000, Unit: "input-tokens"},
		Tier{Rate: 2000, PerMS: 60000, Burst: 2000, Unit: "output-tokens"}, Tier{Kind: KindWindow, Rate: 3000, PerMS: 60000, Burst: 3000, Unit: "output-tokens"},
		Tier{Kind: KindFixed, Rate: 50000, PerMS: 86400000, Burst: 50000, Unit: "output-tokens"},
	)
	a := DecideArgs{Units: "input-tokens=1000,output-tokens=500"}
	n := 0
	for e.decide(a).Status == StatusAllowed {
		n++
	}
	assert.Equal(t, 4, n, "4,000 input tokens a minute: 4 tasks of 1,000 (requests allow 5, output tokens 4)")
	got, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 96, 996, 0, 96000, 0, 1000, 48000}, got.Tokens)
}
