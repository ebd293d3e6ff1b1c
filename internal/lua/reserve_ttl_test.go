package lua

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reservations set outlives its last reservation by the lapse, though
// its expiry is set once when a queue opens and at most once a second while
// it is open (not on every booking): after a second of bookings, after the
// queue was dropped by SetLimits, and when a queue reopens.
func TestReservationsOutliveTheirLastBooking(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 1})
	args := func(id string) DecideArgs {
		return DecideArgs{TaskID: id, Horizon: time.Minute, Lapse: 5 * time.Minute, Granule: time.Second}
	}
	var clock time.Duration // since testEpoch; key expiry follows it
	advance := func(to time.Duration) {
		e.mr.FastForward(to - clock)
		clock = to
		e.at(clock)
	}
	check := func(what string) {
		t.Helper()
		last, err := e.rdb.ZRangeWithScores(e.ctx, e.k.Reservations, -1, -1).Result()
		require.NoError(t, err)
		require.Len(t, last, 1, what)
		at := time.UnixMicro(int64(last[0].Score))
		want := at.Sub(testEpoch().Add(clock)) + 5*time.Minute
		assert.GreaterOrEqual(t, e.mr.TTL(e.k.Reservations), want, "%s: the set lives until its last reservation lapses", what)
	}
	n := 0
	book := func(k int) {
		for range k {
			r := e.decide(args(fmt.Sprint("t", n)))
			n++
			require.NotEqual(t, StatusBadConfig, r.Status)
		}
	}
	book(40) // one instant: the queue opens, then 39 bookings in it
	check("40 bookings in one instant")
	advance(999 * time.Millisecond)
	book(300) // the same second: no refresh, 30 s more of queue
	check("300 more within the second")
	advance(1500 * time.Millisecond)
	book(1)
	check("a booking the next second")
	e.setLimits(Tier{Rate: 5, PerMS: 1000, Burst: 1}) // drops the queue
	book(3)
	check("the first booking after the queue was dropped")
}
