package throttle_test

import (
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestReserveGivesSlotsInDenyOrder(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	const horizon = 10 * time.Second
	assertAllowed(t, r.take("k"), "Take from the full bucket")

	for i, id := range []string{"a", "b", "c"} {
		d := r.reserve("k", id, horizon, 0)
		want := time.Duration(i+1) * time.Second
		assert.True(t, throttle.Reserved(d), "Reserve(%s): Reserved (%+v)", id, d)
		assert.Equal(t, throttle.RefusedByTier, d.Reason, "Reserve(%s) on an empty bucket: Reason", id)
		assert.Equal(t, want, d.RetryAfter, "Reserve(%s): RetryAfter", id)
		assert.Equal(t, epoch().Add(want), throttle.ReservedAt(d), "Reserve(%s): Slot", id)
	}
	assert.Equal(t, 3, r.inspect("k").Reservations, "Inspect.Reservations")

	d := r.reserve("k", "a", horizon, 0)
	assertRefused(t, d, throttle.RefusedReserved, time.Second, "Reserve(a) again before its slot")
	assert.Equal(t, epoch().Add(time.Second), throttle.ReservedAt(d), "Reserve(a) again: Slot")
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 4*time.Second, "Take behind 3 reservations")

	r.advance(time.Second) // one token; a's slot
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 3*time.Second, "Take with a token promised to a")
	d = r.reserve("k", "d", horizon, 0)
	assert.True(t, throttle.Reserved(d), "Reserve(d) with a token promised to a: Reserved (%+v)", d)
	assert.Equal(t, throttle.RefusedByQueue, d.Reason, "Reserve(d): Reason")
	assert.Equal(t, epoch().Add(4*time.Second), throttle.ReservedAt(d), "Reserve(d): Slot")
	assertAllowed(t, r.reserve("k", "a", horizon, 0), "Reserve(a) at its slot")

	r.advance(500 * time.Millisecond)
	assertRefused(t, r.reserve("k", "b", horizon, 0), throttle.RefusedReserved, 500*time.Millisecond, "Reserve(b) 0.5 s early")
	r.advance(500 * time.Millisecond)
	assertAllowed(t, r.reserve("k", "b", horizon, 0), "Reserve(b) at its slot")
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "c", horizon, 0), "Reserve(c) at its slot")
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "d", horizon, 0), "Reserve(d) at its slot")
	assert.Equal(t, 0, r.inspect("k").Reservations, "Inspect.Reservations after all came back")
	assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Second, "Take after the queue drained")
	r.advance(time.Second)
	assertAllowed(t, r.take("k"), "Take a token later")
}

// TestReservedSlotsAreWhatTheBucketsAdmit: reserved slots are exactly what the buckets can
// admit when the tasks come back. Without a granule, slots are spaced by the
// tightest tier's interval. With one (asynq: 1 s), slots fall on granule
// boundaries and each boundary gets as many tasks as every bucket will hold
// at that instant: a greedy drain, simulated here independently.
func TestReservedSlotsAreWhatTheBucketsAdmit(t *testing.T) {
	tests := []struct {
		name    string
		limits  []throttle.Limit
		drain   int // tokens taken at the start (all of the tightest tier's burst, or fewer)
		granule time.Duration
		n       int
	}{
		{"continuous, one tier", []throttle.Limit{throttle.PerSecond(2)}, 2, 0, 6},
		{"granule, burst below rate", []throttle.Limit{throttle.PerSecond(10).WithBurst(5)}, 5, time.Second, 20},
		{"granule, burst 1", []throttle.Limit{throttle.PerSecond(10).WithBurst(1)}, 1, time.Second, 5},
		{"granule, rate below burst", []throttle.Limit{throttle.PerSecond(4).WithBurst(20)}, 20, time.Second, 20},
		{"granule, burst = rate", []throttle.Limit{throttle.PerSecond(100)}, 100, time.Second, 350},
		{"two tiers: the slow tier's burst is used", []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(120).WithBurst(30)}, 5, time.Second, 80},
		{"two tiers, slow tier binding", []throttle.Limit{throttle.PerSecond(10), throttle.PerMinute(30)}, 10, time.Second, 25},
		{"continuous, two tiers", []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(120).WithBurst(30)}, 5, 0, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.advance(300 * time.Millisecond) // off a granule boundary
			r.setLimits("k", tt.limits...)
			start := r.now
			for i := range tt.drain {
				require.True(t, r.take("k").Allowed, "drain take %d", i)
			}
			var slots []time.Time
			for i := range tt.n {
				id := fmt.Sprintf("task-%d", i)
				d := r.reserve("k", id, time.Hour, tt.granule)
				require.True(t, throttle.Reserved(d), "Reserve(%s): %+v", id, d)
				assert.Equal(t, throttle.ReservedAt(d).Sub(r.now), d.RetryAfter, "Reserve(%s): RetryAfter = Slot - now", id)
				if len(slots) > 0 {
					require.False(t, throttle.ReservedAt(d).Before(slots[len(slots)-1]), "Reserve(%s): slot %v before the previous %v", id, throttle.ReservedAt(d), slots[len(slots)-1])
				}
				if tt.granule > 0 {
					assert.Zero(t, throttle.ReservedAt(d).UnixMicro()%tt.granule.Microseconds(), "Reserve(%s): slot %v off the granule", id, throttle.ReservedAt(d))
				}
				slots = append(slots, throttle.ReservedAt(d))
			}
			want := greedySchedule(tt.limits, tt.drain, start, tt.granule, tt.n)
			assert.Equal(t, want, slots, "slots of %v with granule %v", tt.limits, tt.granule)
		})
	}
}

// greedySchedule is the reference for TestReservedSlotsAreWhatTheBucketsAdmit: buckets (full at
// start, minus drain) admit tasks one at a time, as early as they can, at
// granule boundaries when granule > 0 (in microsecond steps otherwise).
func greedySchedule(limits []throttle.Limit, drain int, start time.Time, granule time.Duration, n int) []time.Time {
	tokens := make([]*big.Rat, len(limits))
	for i, l := range effective(limits) {
		tokens[i] = new(big.Rat).SetInt64(int64(l.Burst - drain))
	}
	at := start
	last := start
	var out []time.Time
	for len(out) < n {
		// Refill to at.
		el := at.Sub(last).Microseconds()
		for i, l := range effective(limits) {
			add := new(big.Rat).SetFrac64(el*int64(l.N), l.Per.Microseconds())
			tokens[i].Add(tokens[i], add)
			if b := new(big.Rat).SetInt64(int64(l.Burst)); tokens[i].Cmp(b) > 0 {
				tokens[i] = b
			}
		}
		last = at
		ok := true
		for _, tk := range tokens {
			if tk.Cmp(big.NewRat(1, 1)) < 0 {
				ok = false
			}
		}
		if ok {
			for _, tk := range tokens {
				tk.Sub(tk, big.NewRat(1, 1))
			}
			out = append(out, at)
			continue
		}
		// Jump to the next instant a token can be there.
		var next time.Time
		if granule == 0 {
			var wait time.Duration
			for i, l := range effective(limits) {
				if tokens[i].Cmp(big.NewRat(1, 1)) < 0 {
					need := new(big.Rat).Sub(big.NewRat(1, 1), tokens[i])
					need.Mul(need, new(big.Rat).SetFrac64(l.Per.Microseconds(), int64(l.N)))
					us := new(big.Int).Quo(need.Num(), need.Denom())
					if new(big.Rat).SetInt(us).Cmp(need) < 0 {
						us.Add(us, big.NewInt(1))
					}
					wait = max(wait, time.Duration(us.Int64())*time.Microsecond)
				}
			}
			next = at.Add(wait)
		} else {
			next = at.Truncate(granule).Add(granule)
		}
		at = next
	}
	return out
}

// TestReserveHolderBackAtItsSlotIsAdmitted: a caller that comes back at exactly
// throttle.ReservedAt(Decision) is admitted, for rates whose interval is not whole
// microseconds.
func TestReserveHolderBackAtItsSlotIsAdmitted(t *testing.T) {
	for _, rate := range []int{1, 3, 7, 9, 11, 13} {
		t.Run(fmt.Sprintf("PerSecond(%d)", rate), func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", throttle.PerSecond(rate).WithBurst(1))
			assertAllowed(t, r.take("k"), "Take")
			var slots []time.Time
			for i := 0; i < 4; i++ {
				d := r.reserve("k", fmt.Sprint(i), time.Minute, 0)
				require.True(t, throttle.Reserved(d), "Reserve(%d): %+v", i, d)
				slots = append(slots, throttle.ReservedAt(d))
			}
			for i, s := range slots {
				r.advance(s.Sub(r.now))
				assertAllowed(t, r.reserve("k", fmt.Sprint(i), time.Minute, 0), fmt.Sprintf("Reserve(%d) at throttle.ReservedAt(Decision) %v", i, s.Sub(epoch())))
			}
		})
	}
}

func TestReserveStopsAtTheHorizon(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	const horizon = 2500 * time.Millisecond
	assertAllowed(t, r.take("k"), "Take")
	for i, id := range []string{"a", "b"} {
		d := r.reserve("k", id, horizon, 0)
		assert.True(t, throttle.Reserved(d), "Reserve(%s) within the horizon: %+v", id, d)
		assert.Equal(t, time.Duration(i+1)*time.Second, d.RetryAfter, "Reserve(%s): RetryAfter", id)
	}
	d := r.reserve("k", "c", horizon, 0)
	assert.False(t, throttle.Reserved(d), "Reserve(c) beyond the horizon: %+v", d)
	assert.True(t, throttle.ReservedAt(d).IsZero(), "Reserve(c) beyond the horizon: Slot %v", throttle.ReservedAt(d))
	assert.False(t, d.Allowed, "Reserve(c) beyond the horizon: Allowed")
	// The next free slot is at 3 s: c can reserve it once 3 s is within 2.5 s.
	assert.Equal(t, 500*time.Millisecond, d.RetryAfter, "Reserve(c) beyond the horizon: RetryAfter")
	assert.Equal(t, 2, r.inspect("k").Reservations, "Inspect.Reservations")

	r.advance(d.RetryAfter)
	d = r.reserve("k", "c", horizon, 0)
	assert.True(t, throttle.Reserved(d), "Reserve(c) after RetryAfter: %+v", d)
	assert.Equal(t, epoch().Add(3*time.Second), throttle.ReservedAt(d), "Reserve(c) after RetryAfter: Slot")
}

func TestReservationLapsesAfterItsSlot(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	resv := redisKey("k", "r")
	assertAllowed(t, r.take("k"), "Take")
	for _, id := range []string{"a", "b"} { // slots at +1 s and +2 s
		d := r.reserve("k", id, time.Minute, 0)
		require.True(t, throttle.Reserved(d), "Reserve(%s): %+v", id, d)
	}
	members := func() []string {
		t.Helper()
		m, err := r.mr.ZMembers(resv)
		require.NoError(t, err, "ZRANGE %s", resv)
		return m
	}

	// Exactly DefaultLapse after a's slot: a is still kept. z gets a token.
	r.advance(time.Second + throttle.DefaultLapse)
	assertAllowed(t, r.reserve("k", "z", time.Minute, 0), "Reserve(z) 5 min later")
	assert.Equal(t, []string{"a", "b"}, members(), "reservations DefaultLapse after a's slot")
	assert.Equal(t, 2, r.inspect("k").Reservations, "Inspect.Reservations")

	// A second later a has lapsed and b is at its limit. With no queue
	// outstanding, reservations are not even read: they expire with their key.
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "y", time.Minute, 0), "Reserve(y) 1 s later")
	assert.Positive(t, r.mr.TTL(resv), "the reservations key expires by itself")

	// a coming back now is a fresh caller.
	d := r.reserve("k", "a", time.Minute, 0)
	assert.Equal(t, throttle.RefusedByTier, d.Reason, "Reserve(a) after its reservation lapsed: %+v", d)
}

func TestReserveDuringASuspensionQueuesAfterIt(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10))
	r.suspend("k", 5*time.Second)
	d := r.reserve("k", "a", time.Minute, 0)
	assert.True(t, throttle.Reserved(d), "Reserve while suspended: %+v", d)
	assert.Equal(t, throttle.RefusedBySuspension, d.Reason, "Reserve while suspended: Reason")
	assert.Equal(t, 5*time.Second, d.RetryAfter, "Reserve while suspended: RetryAfter is the end of the suspension")

	r.advance(5 * time.Second)
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 100*time.Millisecond, "Take with a's slot due")
	assertAllowed(t, r.reserve("k", "a", time.Minute, 0), "Reserve(a) at its slot after the suspension")
	r.advance(100 * time.Millisecond)
	assertAllowed(t, r.take("k"), "Take after the queue")
}

// Refused callers with IDs get their own reserved times, in the order they
// were refused; a caller without one waits behind them.
func TestReservationsFollowTheOrderCallersWereRefused(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
	_, err := r.lim.Take(r.ctx, "slack") // the only token
	require.NoError(t, err)
	for i, id := range []string{"task-a", "task-b", "task-c"} {
		d, err := throttle.Reserve(r.lim, r.ctx, "slack", id, time.Minute, 0)
		require.NoError(t, err)
		assert.True(t, throttle.Reserved(d), "%s reserved", id)
		assert.InDelta(t, float64(i+1), d.RetryAfter.Seconds(), 0.01, "%s's turn", id)
	}
	d, err := r.lim.Take(r.ctx, "slack")
	require.NoError(t, err)
	assert.Equal(t, throttle.RefusedByQueue, d.Reason)
	assert.InDelta(t, 4, d.RetryAfter.Seconds(), 0.01, "behind the reservations")
}
