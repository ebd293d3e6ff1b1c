package throttle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Two refunds that each fit what the bucket owed at least since their calls
// must not give back more together than the bucket would hold had both
// calls cost what they used (issue 29, item 5). Tokens 10/s burst 100:
// A takes 60 and B 40 at 0 s (empty); at 6 s the bucket owes 40 and C takes
// 60 (owes 100). Had A and B used nothing, the bucket was full at 6 s and
// C left it holding 40: A's and B's refunds may bring it back to 40
// tokens, no more (each fit the least owed, 40, alone: together they gave
// back 80).
func TestTwoRefundsTogetherGiveBackNoMoreThanTheCounterfactual(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("llm", throttle.PerSecond(1000), throttle.PerSecond(10).WithBurst(100).In("tokens"))
	take := func(n int) throttle.Decision {
		t.Helper()
		d, err := r.lim.Take(r.ctx, "llm", throttle.Uses("tokens", n))
		require.NoError(t, err)
		require.True(t, d.Allowed, "Take(Uses tokens %d) at epoch+%v: %+v", n, r.since(), d)
		return d
	}
	a, b := take(60), take(40)
	r.advance(6 * time.Second)
	take(60)
	require.NoError(t, throttle.AdjustUnit(r.lim, r.ctx, "llm", "tokens", -60, a, 60), "refund A")
	require.NoError(t, throttle.AdjustUnit(r.lim, r.ctx, "llm", "tokens", -40, b, 40), "refund B")
	st := r.inspect("llm")
	assert.LessOrEqual(t, st.Tokens[1], 40.0+1e-6, "tokens after both refunds (the counterfactual bucket holds 40)")
}
