package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// ledger holds what the handlers and the middleware's observer report, in
// Redis, so that the parent process can watch and audit worker processes it
// does not share memory with. Every key is under the run's namespace and
// expires. The namespace is a hash tag, so that on a Redis Cluster every key
// of the ledger is in one slot and markDone's transaction can span them.
type ledger struct {
	rdb redis.UniversalClient
	ns  string // "sync-worker:{<run>}"
}

// ledgerTTL bounds how long a run's bookkeeping outlives it in a shared Redis.
const ledgerTTL = time.Hour

// Counter fields of a provider's stats hash.
const (
	statDeferred  = "deferred"
	statSuspended = "suspended"
	statFailed    = "failed" // Redis could not decide
	// statWaitPrefix + a worker's name counts the tasks that worker
	// deferred because the provider was suspended fleet-wide (or whose 429
	// suspended it).
	statWaitPrefix = "wait:"
)

func (l ledger) doneKey(provider string) string  { return l.ns + ":done:" + provider }
func (l ledger) statsKey(provider string) string { return l.ns + ":stats:" + provider }
func (l ledger) workersKey() string              { return l.ns + ":workers" }

// markDone records that worker did job; the count per job shows a job done
// twice, the count per worker how the fleet shared the work.
func (l ledger) markDone(ctx context.Context, provider, job, worker string) error {
	_, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, l.doneKey(provider), job, 1)
		p.Expire(ctx, l.doneKey(provider), ledgerTTL)
		p.HIncrBy(ctx, l.workersKey(), worker, 1)
		p.Expire(ctx, l.workersKey(), ledgerTTL)
		return nil
	})
	return err
}

// workerCounts returns how many jobs each worker did.
func (l ledger) workerCounts(ctx context.Context) (map[string]int, error) {
	return l.counts(ctx, l.workersKey())
}

// doneCounts returns, per job, how many times its handler succeeded.
func (l ledger) doneCounts(ctx context.Context, provider string) (map[string]int, error) {
	return l.counts(ctx, l.doneKey(provider))
}

// counts reads a hash of counters.
func (l ledger) counts(ctx context.Context, key string) (map[string]int, error) {
	h, err := l.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(h))
	for k, v := range h {
		out[k], _ = strconv.Atoi(v)
	}
	return out, nil
}

// progress is one snapshot of every provider's counters in the ledger.
type progress struct {
	done  map[string]int64
	stats map[string]map[string]int64
}

func (l ledger) snapshot(ctx context.Context, providers []string) (progress, error) {
	pr := progress{done: map[string]int64{}, stats: map[string]map[string]int64{}}
	lens := make([]*redis.IntCmd, len(providers))
	stats := make([]*redis.MapStringStringCmd, len(providers))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range providers {
			lens[i] = p.HLen(ctx, l.doneKey(name))
			stats[i] = p.HGetAll(ctx, l.statsKey(name))
		}
		return nil
	})
	if err != nil {
		return pr, err
	}
	for i, name := range providers {
		pr.done[name] = lens[i].Val()
		m := map[string]int64{}
		for k, v := range stats[i].Val() {
			m[k], _ = strconv.ParseInt(v, 10, 64)
		}
		pr.stats[name] = m
	}
	return pr, nil
}

// counters collects middleware events in memory, on the worker goroutine,
// and flushes them to the ledger from one goroutine: an event function must
// stay fast (see Limiter.OnEvent).
type counters struct {
	mu     sync.Mutex
	deltas map[[2]string]int64 // {provider, field} -> not yet flushed
}

func newCounters() *counters { return &counters{deltas: map[[2]string]int64{}} }

func (c *counters) add(provider, field string) {
	c.mu.Lock()
	c.deltas[[2]string{provider, field}]++
	c.mu.Unlock()
}

// observe counts an event of worker's middleware (Limiter.OnEvent).
func (c *counters) observe(worker string, ev throttle.Event) {
	switch ev.Outcome {
	case throttle.Deferred:
		c.add(ev.Key, statDeferred)
		if ev.Reason == throttle.RefusedBySuspension {
			c.add(ev.Key, statWaitPrefix+worker)
		}
	case throttle.Suspended:
		c.add(ev.Key, statSuspended)
		c.add(ev.Key, statWaitPrefix+worker)
	case throttle.Failed:
		c.add(ev.Key, statFailed)
	}
}

// flush writes the counts gathered since the last flush.
func (c *counters) flush(ctx context.Context, l ledger) error {
	c.mu.Lock()
	deltas := c.deltas
	c.deltas = map[[2]string]int64{}
	c.mu.Unlock()
	if len(deltas) == 0 {
		return nil
	}
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, n := range deltas {
			p.HIncrBy(ctx, l.statsKey(k[0]), k[1], n)
			p.Expire(ctx, l.statsKey(k[0]), ledgerTTL)
		}
		return nil
	})
	if err != nil {
		// Keep the counts for the next flush.
		c.mu.Lock()
		for k, n := range deltas {
			c.deltas[k] += n
		}
		c.mu.Unlock()
	}
	return err
}
