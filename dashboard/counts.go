package dashboard

import (
	"sync"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// maxCountedKeys bounds the keys whose decisions are counted (a process that
// sees a key per tenant); decisions of further keys are not shown.
const maxCountedKeys = 10_000

// counts are the middleware decisions of this process by key and outcome,
// and the 429s its handlers reported, since the dashboard was made.
type counts struct {
	mu   sync.Mutex
	keys map[string]*keyCounts // nil until the first decision
}

type keyCounts struct {
	decisions   map[string]uint64 // by outcome
	rateLimited uint64
}

// add counts one event (Limiter.OnEvent).
func (c *counts) add(ev throttle.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]*keyCounts{}
	}
	k := c.keys[ev.Key]
	if k == nil {
		if len(c.keys) >= maxCountedKeys {
			return
		}
		k = &keyCounts{decisions: map[string]uint64{}}
		c.keys[ev.Key] = k
	}
	k.decisions[ev.Outcome.String()]++
	if ev.Outcome == throttle.Suspended {
		k.rateLimited++
	}
}

// snapshot copies the counts; nil when no decision was seen.
func (c *counts) snapshot() map[string]keyCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		return nil
	}
	out := make(map[string]keyCounts, len(c.keys))
	for key, k := range c.keys {
		d := make(map[string]uint64, len(k.decisions))
		for o, n := range k.decisions {
			d[o] = n
		}
		out[key] = keyCounts{decisions: d, rateLimited: k.rateLimited}
	}
	return out
}
