package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenTiers are 1,000 requests and 1,000 tokens a second, each a bucket
// holding a second: a key with units, whose refunds M bounds.
var tokenTiers = []Tier{{Rate: 1000, PerMS: 1000, Burst: 1000}, {Rate: 1000, PerMS: 1000, Burst: 1000, Unit: "tokens"}}

// tokensLeft is what the tokens tier holds now.
func (e *env) tokensLeft() float64 {
	e.t.Helper()
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(e.t, err)
	return r.Tokens[1]
}

// A bucket full before a call does not cut the call's refund: only what it
// owed since the call counts (issue 29, item 9). At 1 s the bucket is full
// again after a first call, C takes all 1,000 tokens, and at 1.2 s gives
// back 500: the bucket owed 800 or more all the while, so all 500 come back
// (700 left). Counted since the first call, the full bucket at 1 s cut the
// refund to what had not refilled (300).
func TestARefundIsNotCutByAFullBucketBeforeItsCall(t *testing.T) {
	e := newEnv(t)
	e.setLimits(tokenTiers...)
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{IdleExpiry: time.Hour, Units: "tokens=100"}).Status)
	e.at(time.Second)
	c := e.decide(DecideArgs{IdleExpiry: time.Hour, Units: "tokens=1000"})
	require.Equal(t, StatusAllowed, c.Status)
	e.at(1200 * time.Millisecond)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -500, Call{At: c.At, Charged: 1000, Generation: c.Generation, Unit: "tokens"}, time.Hour, nil))
	assert.Equal(t, 700.0, e.tokensLeft(), "200 refilled and 500 back")
}
