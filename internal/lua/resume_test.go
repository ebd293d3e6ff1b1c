package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resume runs Resume on e's key.
func (e *env) resume() {
	e.t.Helper()
	_, err := Resume(e.ctx, e.run, e.k, nil)
	require.NoError(e.t, err)
}

// Resume gives back a provider's debt (a near reset: remaining 0, reset
// 2 s) and nothing of what calls owe beyond empty: here the debt a
// surcharge left. 10/s burst 10: a call of 10 empties the bucket, Used
// says 15 (5 tokens of debt), the provider's reset brings it to -20.
// Before the fix Resume brought it back to empty, dropping the
// surcharge's debt: a call of 4 was admitted at 400 ms, 19 calls within
// 0.4 s of a bucket of 10 refilling 10/s.
func TestResumeKeepsTheDebtASurchargeLeft(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 10}).Status)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, 5, Call{Generation: -1}, nil))
	e.observe(ObserveArgs{Remaining: 0, Reset: 2 * time.Second})
	require.InDelta(t, -20, e.inspect().Tokens[0], 1e-9, "the provider's reset: empty 2 s from now")

	e.resume()
	assert.InDelta(t, -5, e.inspect().Tokens[0], 1e-9, "Resume gives back the provider's debt, not the surcharge's")
	e.at(400 * time.Millisecond)
	assert.Equal(t, StatusDenied, e.decide(DecideArgs{Cost: 4}).Status, "4 tokens refilled since: the surcharge's debt first")
	e.at(900 * time.Millisecond)
	assert.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 4}).Status, "9 refilled: the debt of 5 repaid, 4 left")
}

// Resume keeps what a paced holder took ahead: on 10/s burst 5, a call
// of 5 empties the bucket, h (5) is booked for 500 ms and admitted at
// 350 ms for its instant, beyond empty as of now; then a provider's reset
// and Resume. Before the fix Resume brought the bucket back to empty,
// dropping what h took beyond it: the bucket held 1.5 tokens at 500 ms
// beside h's 5, 11.5 calls' worth within 0.5 s of a bucket of 5 refilling
// 10/s.
func TestResumeKeepsWhatAPacedHolderTookAhead(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 5})
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 5}).Status)
	h := DecideArgs{TaskID: "h", Cost: 5, Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true}
	r := e.decide(h)
	require.Equal(t, StatusDenied, r.Status)
	require.Equal(t, testEpoch().Add(500*time.Millisecond), r.Reserved, "h's instant: 5 tokens refilled")
	e.at(350 * time.Millisecond)
	r = e.decide(h)
	require.Equal(t, StatusAllowed, r.Status, "paced: admitted at its instant ahead")
	require.Equal(t, 150*time.Millisecond, r.Wait)
	require.InDelta(t, -1.5, e.inspect().Tokens[0], 1e-9, "h counted as of now")
	e.observe(ObserveArgs{Remaining: 0, Reset: 2 * time.Second})

	e.resume()
	assert.InDelta(t, -1.5, e.inspect().Tokens[0], 1e-9, "Resume keeps h's tokens")
	e.at(500 * time.Millisecond)
	assert.InDelta(t, 0, e.inspect().Tokens[0], 1e-9, "h runs now: nothing left beside it")
}

// A paced holder counted ahead while a provider's debt holds the bucket
// (Observe, then the take) shrinks the provider's part of what the bucket
// owes: the calls alone, owing less, lose the refill until its instant
// that the bucket in debt does not. 10/s burst 1: the reset (1 s) leaves
// the bucket owing 11 tokens, all the provider's; h is booked for 1.1 s
// and admitted at 950 ms; at 960 ms Resume. Had the provider's part stayed
// 11 (a take ahead that does not carry it through), Resume brought the
// bucket to empty at 960 ms, and it held a token at 1.1 s beside h's: 2
// calls at once on a burst of 1.
func TestResumeAfterAPacedHolderTookAheadInTheDebt(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	e.observe(ObserveArgs{Remaining: 0, Reset: time.Second})
	require.InDelta(t, -10, e.inspect().Tokens[0], 1e-9)
	h := DecideArgs{TaskID: "h", Horizon: time.Minute, Lapse: time.Minute, Granule: time.Second, Pace: true}
	r := e.decide(h)
	require.Equal(t, StatusDenied, r.Status)
	require.Equal(t, testEpoch().Add(1100*time.Millisecond), r.Reserved)
	e.at(950 * time.Millisecond)
	r = e.decide(h)
	require.Equal(t, StatusAllowed, r.Status, "paced: admitted at its instant ahead")
	require.Equal(t, 150*time.Millisecond, r.Wait)

	e.at(960 * time.Millisecond)
	e.resume()
	assert.InDelta(t, -1.4, e.inspect().Tokens[0], 1e-9, "h's token and the refill until its instant stay")
	e.at(1100 * time.Millisecond)
	assert.InDelta(t, 0, e.inspect().Tokens[0], 1e-9, "h runs now: nothing left beside it")
	e.at(1200 * time.Millisecond)
	assert.InDelta(t, 1, e.inspect().Tokens[0], 1e-9, "a token 100 ms after h")
}
