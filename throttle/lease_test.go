package throttle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A key's lease grows while its process uses each lease up in time, and
// shrinks when leased tokens expire unused or the bucket is too low to grant.
func TestLeaseSizeAdapts(t *testing.T) {
	const max, d = 64, 50 * time.Millisecond
	now := time.Unix(1_700_000_000, 0)
	var l lease
	assert.Equal(t, leaseStart, l.request(max), "first lease")

	// Used up before it expires: the next one asks for twice as many.
	for _, want := range []int{16, 32, 64, 64} {
		asked := l.request(max)
		l.add(asked, asked-1, now, d, 0, now)
		for range asked - 1 {
			assert.True(t, l.take(now, max, 1))
		}
		assert.False(t, l.take(now, max, 1), "the lease is used up")
		assert.Equal(t, want, l.request(max))
	}

	// Expired with tokens left: half.
	l.add(64, 63, now, d, 0, now)
	assert.True(t, l.take(now, max, 1))
	now = now.Add(d)
	assert.False(t, l.take(now, max, 1), "expired tokens are not handed out")
	l.add(64, 0, now, d, 0, now)
	assert.Equal(t, 32, l.request(max), "halved for the waste (and for the empty grant of 64)")

	// Granted nothing at this size: half, never below 2.
	for range 5 {
		l.add(l.request(max), 0, now, d, 0, now)
	}
	assert.Equal(t, 2, l.request(max))

	// A maximum below the start is respected.
	var small lease
	assert.Equal(t, 4, small.request(4))
}

// Each decision's leased tokens keep their own expiry, counted from when the
// decision was sent: a later decision does not extend them, and a decision
// that took long to come back brings tokens with less time left (none, past
// the lease time).
func TestLeaseChunksKeepTheirOwnExpiry(t *testing.T) {
	const max, d = 64, 50 * time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	var l lease
	l.add(8, 7, t0, d, 0, t0)                                                   // valid until t0+50ms
	l.add(8, 7, t0.Add(40*time.Millisecond), d, 0, t0.Add(45*time.Millisecond)) // until t0+90ms
	assert.Equal(t, 14, l.held(t0.Add(45*time.Millisecond)))
	assert.Equal(t, 7, l.held(t0.Add(60*time.Millisecond)), "the first decision's tokens expired at its own time")
	for range 7 {
		assert.True(t, l.take(t0.Add(60*time.Millisecond), max, 1))
	}
	assert.False(t, l.take(t0.Add(60*time.Millisecond), max, 1))

	// Sent 60 ms ago: nothing left to lease.
	var late lease
	late.add(8, 7, t0, d, 0, t0.Add(60*time.Millisecond))
	assert.Zero(t, late.held(t0.Add(60*time.Millisecond)), "tokens of a decision older than the lease time")
}

// A decision under a new limits generation drops what is left of earlier
// leases; drop forgets every leased token.
func TestLeaseIsDroppedOnAChangeOfLimits(t *testing.T) {
	const d = 50 * time.Millisecond
	now := time.Unix(1_700_000_000, 0)
	var l lease
	l.add(8, 7, now, d, 1, now)
	assert.Equal(t, 7, l.held(now))
	l.add(8, 3, now, d, 2, now) // SetLimits happened in between
	assert.Equal(t, 3, l.held(now), "tokens leased under the old limits dropped")
	l.drop()
	assert.Zero(t, l.held(now))
}
