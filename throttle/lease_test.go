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
		l.add(asked, asked-1, now, d)
		for range asked - 1 {
			assert.True(t, l.take(now, max))
		}
		assert.False(t, l.take(now, max), "the lease is used up")
		assert.Equal(t, want, l.request(max))
	}

	// Expired with tokens left: half.
	l.add(64, 63, now, d)
	assert.True(t, l.take(now, max))
	now = now.Add(d)
	assert.False(t, l.take(now, max), "expired tokens are not handed out")
	l.add(64, 0, now, d)
	assert.Equal(t, 32, l.request(max), "halved for the waste (and for the empty grant of 64)")

	// Granted nothing at this size: half, never below 2.
	for range 5 {
		l.add(l.request(max), 0, now, d)
	}
	assert.Equal(t, 2, l.request(max))

	// A maximum below the start is respected.
	var small lease
	assert.Equal(t, 4, small.request(4))
}
