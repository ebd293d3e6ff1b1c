package throttle

import (
	"context"
	"sync"
	"time"
)

// slotBook is the slots in flight this process holds for running handlers,
// by key. One goroutine renews them all, every third of WithSlotExpiry, one
// call per key, while any are held (like asynq's own lease of running
// tasks), so a slow but live handler never loses its slot; it exits when
// none are left.
type slotBook struct {
	mu      sync.Mutex
	holds   map[string]map[string]struct{}
	running bool
}

// holdSlot records a slot a handler holds while it runs. The returned
// function gives it back (to Redis, at once) when the handler is done.
func (l *Limiter) holdSlot(key, hold string) (release func()) {
	b := &l.slots
	b.mu.Lock()
	if b.holds == nil {
		b.holds = make(map[string]map[string]struct{})
	}
	if b.holds[key] == nil {
		b.holds[key] = make(map[string]struct{})
	}
	b.holds[key][hold] = struct{}{}
	if !b.running {
		b.running = true
		go l.renewSlots()
	}
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		delete(b.holds[key], hold)
		if len(b.holds[key]) == 0 {
			delete(b.holds, key)
		}
		b.mu.Unlock()
		if err := l.Release(context.Background(), key, hold); err != nil {
			l.o.logger.Warn("throttle: cannot give back a slot in flight; it frees when it expires",
				"key", key, "slot", hold, "slot_expiry", l.o.slotExpiry, "err", err)
		}
	}
}

// renewSlots renews every held slot every third of WithSlotExpiry until
// none are held.
func (l *Limiter) renewSlots() {
	b := &l.slots
	t := time.NewTicker(l.o.slotExpiry / 3)
	defer t.Stop()
	for range t.C {
		b.mu.Lock()
		if len(b.holds) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		snapshot := make(map[string][]string, len(b.holds))
		for key, hs := range b.holds {
			for h := range hs {
				snapshot[key] = append(snapshot[key], h)
			}
		}
		b.mu.Unlock()
		for key, hs := range snapshot {
			n, err := l.extend(context.Background(), key, hs...)
			switch {
			case err != nil:
				l.o.logger.Warn("throttle: cannot renew slots in flight; they expire unless renewed in time",
					"key", key, "slots", len(hs), "slot_expiry", l.o.slotExpiry, "err", err)
			case n < len(hs):
				l.o.logger.Warn("throttle: slots in flight were taken back (their lease ended before a renewal reached Redis); their handlers run beyond the InFlight limit",
					"key", key, "lost", len(hs)-n)
			}
		}
	}
}
