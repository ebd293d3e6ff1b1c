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

// A refund of a call made just before a paced holder's instant must not
// give back what a full bucket would have lost by then: on PerSecond(4)
// with a burst of 1, holders admitted ahead for 1.31 s and 1.58 s, the
// first refunded at 1.32 s, and a third holder was admitted at 1.61 s, 30
// ms after the second (the combined model found it: the refund gave back
// 0.96 of a token counted as of 1.32 s, not as of 1.58 s).
func TestARefundIsCountedAsOfTheLatestPacedInstant(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("k", throttle.PerSecond(4).WithBurst(1))
	require.True(t, r.take("k").Allowed, "the burst")
	booked := map[string]throttle.Decision{}
	for _, id := range []string{"a", "b", "c"} {
		d, err := throttle.MiddlewareDecide(r.lim, r.ctx, "k", id)
		require.NoError(t, err)
		require.True(t, throttle.Reserved(d), "%s booked: %+v", id, d)
		booked[id] = d
	}
	// a and b come back early together (paced: admitted at their instants
	// ahead, their workers waiting).
	admitted := map[string]throttle.Decision{}
	for _, id := range []string{"a", "b"} {
		d, err := throttle.MiddlewareDecide(r.lim, r.ctx, "k", id)
		require.NoError(t, err)
		require.True(t, d.Allowed, "holder %s: %+v", id, d)
		admitted[id] = d
	}
	require.Greater(t, throttle.AdmittedAt(admitted["b"]), throttle.AdmittedAt(admitted["a"]))
	r.setClock(throttle.AdmittedAt(admitted["a"]).Add(10 * time.Millisecond))
	require.NoError(t, throttle.AdjustCall(r.lim, r.ctx, "k", -1, admitted["a"], 1), "a used nothing")
	// c comes back early, before b's instant: it may run no sooner than a
	// burst of 1 at 4/s allows after b, 250 ms.
	d, err := throttle.MiddlewareDecide(r.lim, r.ctx, "k", "c")
	require.NoError(t, err)
	if d.Allowed {
		gap := throttle.AdmittedAt(d).Sub(throttle.AdmittedAt(admitted["b"]))
		assert.GreaterOrEqual(t, gap, 250*time.Millisecond, "c counted %v after b on a burst of 1 at 4/s", gap)
	}
}
