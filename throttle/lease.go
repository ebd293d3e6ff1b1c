package throttle

import (
	"sync"
	"time"
)

// lease is tokens taken in Redis for this process, handed out to its next
// tasks of one key. Each decision's tokens are a chunk with its own expiry,
// counted from when that decision was sent to Redis: a later decision never
// extends an earlier one's tokens. Tokens are handed out oldest chunk
// first. size is how many the next decision of the key asks for: it doubles
// (up to the WithLease maximum) when a chunk is used up before it expires,
// and halves when leased tokens expire unused or a decision far enough from
// the limit to ask got none. A lease is safe for concurrent use.
type lease struct {
	mu     sync.Mutex
	chunks []leaseChunk
	size   int
	gen    int64 // limits generation of the last decision seen
}

type leaseChunk struct {
	n     int
	until time.Time
}

// leaseStart is the size a key's first lease asks for.
const leaseStart = 8

// maxChunks bounds the chunks one key holds; more would mean decisions
// leasing faster than the process runs tasks.
const maxChunks = 8

// request returns how many tokens the next decision of the key asks for.
func (l *lease) request(max int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size == 0 {
		l.size = min(leaseStart, max)
	}
	return l.size
}

// add records an allowed decision sent at sent that asked for asked tokens
// and got n extra ones, valid for d from sent, under limits generation gen.
// A generation other than the last one seen drops what is left of earlier
// chunks: the limits changed since they were taken.
func (l *lease) add(asked, n int, sent time.Time, d time.Duration, gen int64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		l.chunks = l.chunks[:0]
		l.gen = gen
	}
	l.expire(now)
	if n == 0 && asked > 1 {
		l.size = max(min(l.size, asked/2), 2) // the bucket held too few for asked
	}
	until := sent.Add(d)
	if n > 0 && now.Before(until) && len(l.chunks) < maxChunks {
		l.chunks = append(l.chunks, leaseChunk{n: n, until: until})
	}
}

// expire drops chunks whose time is up; tokens left in them shrink the size.
func (l *lease) expire(now time.Time) {
	k := 0
	wasted := false
	for _, c := range l.chunks {
		if now.Before(c.until) {
			l.chunks[k] = c
			k++
		} else if c.n > 0 {
			wasted = true
		}
	}
	clear(l.chunks[k:])
	l.chunks = l.chunks[:k]
	if wasted {
		l.size = max(l.size/2, 2) // more than this process used in time
	}
}

// take hands out c leased tokens (from one chunk), if that many are left
// and still valid. The last ones of a chunk make the next lease of the key
// twice as large, up to max.
func (l *lease) take(now time.Time, max, c int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.chunks) == 0 {
		return false
	}
	l.expire(now)
	for i := range l.chunks {
		ch := &l.chunks[i]
		if ch.n < c {
			continue
		}
		ch.n -= c
		if ch.n == 0 {
			l.chunks = append(l.chunks[:i], l.chunks[i+1:]...)
			l.size = min(2*l.size, max)
		}
		return true
	}
	return false
}

// drop forgets every leased token: the process saw the key suspended, its
// limits changed, or the bucket refuse.
func (l *lease) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = l.chunks[:0]
}

// held returns how many leased tokens are left (for tests).
func (l *lease) held(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.chunks {
		if now.Before(c.until) {
			n += c.n
		}
	}
	return n
}
