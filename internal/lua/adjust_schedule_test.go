package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// While a queue of reservations is outstanding, the tasks booked after it
// are placed by the buckets' reservation schedule, not by what the buckets
// hold: a settlement moves the schedule with the bucket. A refund brings the
// next reserved instant forward by what it gave back, a surcharge pushes it
// back; otherwise a backlog booked at its estimates never runs on what its
// calls did not use (bench L: about 0.9 of a tokens limit at 2x the median
// estimate) and runs on what they overspent until its holders are refused.
func TestSettlementsMoveTheReservationSchedule(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 60000, PerMS: 60000, Burst: 10000, Unit: "tokens"}) // 1,000 tokens a second
	args := func(id string) DecideArgs {
		return DecideArgs{TaskID: id, Horizon: time.Minute, Lapse: time.Minute, IdleExpiry: time.Hour, Units: "tokens=2000"}
	}
	var first DecideReply
	for i := range 5 {
		r := e.decide(args(string(rune('a' + i))))
		require.Equal(t, StatusAllowed, r.Status, "the burst holds 5 calls of 2,000")
		if i == 0 {
			first = r
		}
	}
	reserved := func(id string) time.Duration {
		t.Helper()
		r := e.decide(args(id))
		require.Equal(t, StatusDenied, r.Status)
		return r.RetryAfter
	}
	assert.Equal(t, 2*time.Second, reserved("f"), "the queue opens: 2,000 tokens at 1,000 a second")
	assert.Equal(t, 4*time.Second, reserved("g"))

	call := Call{At: first.At, Charged: 2000, Generation: first.Generation, Unit: "tokens"}
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -1500, call, time.Hour, nil))
	assert.Equal(t, 4500*time.Millisecond, reserved("h"), "1,500 tokens given back: 1.5 s earlier than 6 s")
	assert.InDelta(t, 1500, e.inspect().Tokens[0], 1e-6, "and the bucket holds them")

	require.NoError(t, Adjust(e.ctx, e.run, e.k, 3000, Call{Unit: "tokens", Generation: -1}, time.Hour, nil))
	assert.Equal(t, 9500*time.Millisecond, reserved("i"), "3,000 more taken: 3 s later than 6.5 s")
}
