package dashboard

import (
	"maps"
	"strconv"
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
	waits       map[string]uint64 // deferrals this key decided, by what made the task wait (waitOf)
}

// waitOf names what made a deferred task wait on the key its event names
// (for a task of several keys, the key that decided): "tier N" for the
// key's Nth limit, else the reason ("suspended", "queued", ...).
func waitOf(ev throttle.Event) string {
	if ev.Reason == throttle.RefusedByTier && ev.Tier > 0 {
		return "tier " + strconv.Itoa(ev.Tier)
	}
	return ev.Reason.String()
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
		k = &keyCounts{decisions: map[string]uint64{}, waits: map[string]uint64{}}
		c.keys[ev.Key] = k
	}
	k.decisions[ev.Outcome.String()]++
	if ev.Outcome == throttle.Deferred {
		k.waits[waitOf(ev)]++
	}
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
		out[key] = keyCounts{decisions: maps.Clone(k.decisions), rateLimited: k.rateLimited, waits: maps.Clone(k.waits)}
	}
	return out
}
