package metrics

import (
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// metric names one counter family kept per key.
type metric uint8

const (
	mDecisions metric = iota
	mDeferrals
	mCopies
	mRateLimited
	mLeased
	mFailurePolicy
	mRedisErrors
	mUnsettled
)

// series is one counter of a key: its family and its other labels.
type series struct {
	m    metric
	a, b string
}

// keyStats are the counters of one key label.
type keyStats struct {
	mu sync.Mutex
	n  map[series]uint64
}

// observe counts one middleware event (New registers it with
// Limiter.OnEvent). It runs on the worker goroutine and takes a short lock
// per key.
func (c *Collector) observe(ev throttle.Event) {
	ks := c.stats(ev.Key)
	ks.mu.Lock()
	if ev.Outcome == throttle.Unsettled {
		// (not a decision: a settlement after the handler ran)
		ks.n[series{m: mUnsettled}]++
		ks.mu.Unlock()
		return
	}
	ks.n[series{m: mDecisions, a: ev.Outcome.String()}]++
	deferred := false
	switch ev.Outcome {
	case throttle.Deferred, throttle.Suspended:
		deferred = true
		ks.n[series{m: mDeferrals, a: reasonLabel(ev.Reason), b: strconv.FormatBool(ev.Reserved)}]++
	case throttle.Failed:
		policy := "fail_closed"
		if ev.HandlerRan {
			policy = "fail_open"
		} else {
			deferred = true
			ks.n[series{m: mDeferrals, a: "failure_policy", b: "false"}]++
		}
		ks.n[series{m: mFailurePolicy, a: policy}]++
		ks.n[series{m: mRedisErrors, a: errorClass(ev.Err)}]++
	}
	if deferred && ev.Copied {
		ks.n[series{m: mCopies}]++
	}
	if ev.Outcome == throttle.Suspended {
		ks.n[series{m: mRateLimited}]++
	}
	if ev.Leased && ev.Outcome == throttle.Ran { // a Suspended event repeats it
		ks.n[series{m: mLeased}]++
	}
	ks.mu.Unlock()
	// A Suspended event repeats the latency of its task's Ran event.
	if ev.Latency > 0 && ev.Outcome != throttle.Suspended {
		c.latency.Observe(ev.Latency.Seconds())
	}
}

// reasonLabel is a Reason as a label value ("in flight" -> "in_flight").
func reasonLabel(r throttle.Reason) string {
	return strings.ReplaceAll(r.String(), " ", "_")
}

// stats returns the counters of key's label, creating them while fewer than
// maxKeys keys have some; past that, otherKey's, unless key has limits of
// its own (the last scrape found them) and a key without has a label: that
// label goes to key.
func (c *Collector) stats(key string) *keyStats {
	if key == "" {
		key = noKey
	}
	c.mu.RLock()
	ks, ok := c.keys[key]
	c.mu.RUnlock()
	if ok {
		return ks
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ks, ok := c.keys[key]; ok {
		return ks
	}
	if key != noKey && c.distinct() >= c.o.maxKeys && !(c.configured[key] && c.evict()) {
		c.folded++
		key = otherKey
	}
	if ks, ok := c.keys[key]; ok {
		return ks
	}
	ks = &keyStats{n: map[series]uint64{}}
	c.keys[key] = ks
	return ks
}

// evict folds the counters of a key label without limits of its own into
// otherKey's, to make room for one with; it reports whether it found one.
// c.mu is held.
func (c *Collector) evict() bool {
	for key, ks := range c.keys {
		if key == otherKey || key == noKey || c.configured[key] {
			continue
		}
		other, ok := c.keys[otherKey]
		if !ok {
			other = &keyStats{n: map[series]uint64{}}
			c.keys[otherKey] = other
		}
		ks.mu.Lock()
		other.mu.Lock()
		for s, n := range ks.n {
			other.n[s] += n
			if s.m == mDecisions {
				c.folded += n
			}
		}
		other.mu.Unlock()
		ks.mu.Unlock()
		delete(c.keys, key)
		return true
	}
	return false
}

// setConfigured records the keys a scrape found with limits of their own.
func (c *Collector) setConfigured(keys map[string]bool) {
	c.mu.Lock()
	c.configured = keys
	c.mu.Unlock()
}

// distinct counts the keys that hold a label of their own; c.mu is held.
func (c *Collector) distinct() int {
	n := len(c.keys)
	for _, special := range []string{otherKey, noKey} {
		if _, ok := c.keys[special]; ok {
			n--
		}
	}
	return n
}

// collectEvents sends the counters of every key label.
func (c *Collector) collectEvents(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	keys := make(map[string]*keyStats, len(c.keys))
	for k, ks := range c.keys {
		keys[k] = ks
	}
	folded := c.folded
	c.mu.RUnlock()
	ch <- prometheus.MustNewConstMetric(c.descs.folded, prometheus.CounterValue, float64(folded))
	for key, ks := range keys {
		ks.mu.Lock()
		for s, n := range ks.n {
			v := float64(n)
			switch s.m {
			case mDecisions:
				ch <- prometheus.MustNewConstMetric(c.descs.decisions, prometheus.CounterValue, v, key, s.a)
			case mDeferrals:
				ch <- prometheus.MustNewConstMetric(c.descs.deferrals, prometheus.CounterValue, v, key, s.a, s.b)
			case mCopies:
				ch <- prometheus.MustNewConstMetric(c.descs.copies, prometheus.CounterValue, v, key)
			case mRateLimited:
				ch <- prometheus.MustNewConstMetric(c.descs.rateLimited, prometheus.CounterValue, v, key)
			case mLeased:
				ch <- prometheus.MustNewConstMetric(c.descs.leased, prometheus.CounterValue, v, key)
			case mFailurePolicy:
				ch <- prometheus.MustNewConstMetric(c.descs.failurePolicy, prometheus.CounterValue, v, key, s.a)
			case mRedisErrors:
				ch <- prometheus.MustNewConstMetric(c.descs.redisErrors, prometheus.CounterValue, v, key, s.a)
			case mUnsettled:
				ch <- prometheus.MustNewConstMetric(c.descs.unsettled, prometheus.CounterValue, v, key)
			}
		}
		ks.mu.Unlock()
	}
}

// keyCounts are the events Observe counted for one key label since the
// Collector was made, for displays such as the dashboard.
type keyCounts struct {
	// Decisions by outcome (throttle.Outcome's String: "ran", "deferred",
	// "suspended", "unthrottled", "failed", "rejected"); outcomes not seen
	// are absent.
	Decisions map[string]uint64
	// RateLimited counts the handlers that reported a rate limit (429s).
	RateLimited uint64
}

// Counts returns the counts of every key label seen (including otherKey and
// noKey when they have any).
func (c *Collector) counts() map[string]keyCounts {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]keyCounts, len(c.keys))
	for key, ks := range c.keys {
		kc := keyCounts{Decisions: map[string]uint64{}}
		ks.mu.Lock()
		for s, n := range ks.n {
			switch s.m {
			case mDecisions:
				kc.Decisions[s.a] = n
			case mRateLimited:
				kc.RateLimited = n
			}
		}
		ks.mu.Unlock()
		out[key] = kc
	}
	return out
}
