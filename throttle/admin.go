package throttle

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// This file is the operator's API: what the asynq-throttle CLI, the metrics
// collector and the dashboard need beyond Inspect, SetLimits, Suspend and
// Resume. None of them builds a Redis key name; all go through here.

// scanCount is the COUNT hint of each SCAN call in Keys.
const scanCount = 1000

// Keys returns every limiter key that has anything in Redis under the
// limiter's prefix (limits, bucket state, a suspension or reservations),
// sorted. It walks the keyspace with SCAN (never KEYS), on every master of a
// Redis Cluster, so it does not block Redis; a key created or deleted during
// the walk may or may not be listed. Keys set only as defaults
// (WithDefaultLimits, WithKeyLimits) are not in Redis until first used.
func (l *Limiter) Keys(ctx context.Context) ([]string, error) {
	var (
		mu    sync.Mutex
		found = map[string]struct{}{}
	)
	pattern := scanPattern(l.o.prefix)
	type page struct {
		keys []string
		next uint64
	}
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			// Each SCAN call within WithTimeout (the walk may take longer).
			p, err := bounded(l, ctx, func(ctx context.Context) (page, error) {
				batch, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
				return page{batch, next}, err
			})
			if err != nil {
				return err
			}
			batch, next := p.keys, p.next
			mu.Lock()
			for _, k := range batch {
				if name, ok := nameOfRedisKey(l.o.prefix, k); ok {
					found[name] = struct{}{}
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return scan(ctx, s) })
	default:
		err = scan(ctx, l.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("throttle: list keys (SCAN MATCH %s): %w", pattern, err)
	}
	keys := make([]string, 0, len(found))
	for k := range found {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// Delete removes what key has in Redis: its limits, bucket state,
// suspension and reservations. Tasks of the key then run under the
// limiter's defaults, or unthrottled without any; a task that held a
// reservation contends again. The slots in flight of handlers still running
// are kept (each until its holder gives it back or its lease ends), so
// limits set again with an InFlight count them. Deleting a key that has
// nothing is not an error.
func (l *Limiter) Delete(ctx context.Context, key string) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	// One DEL: all keys share the hash tag, so one slot on a Cluster.
	_, err = bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return l.rdb.Del(ctx, deletableRedisKeys(keys)...).Result()
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: delete: %w", key, err)
	}
	return nil
}

// Reservation returns the run slot reserved for taskID under key, on the
// Redis clock, and false when the task holds none. A task deferred by copy
// (see HeaderOrigin) holds its reservation under the original task's ID.
func (l *Limiter) Reservation(ctx context.Context, key, taskID string) (slot time.Time, ok bool, err error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return time.Time{}, false, err
	}
	us, err := bounded(l, ctx, func(ctx context.Context) (float64, error) {
		return l.rdb.ZScore(ctx, keys.Reservations, taskID).Result()
	})
	switch {
	case err == redis.Nil:
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("throttle: key %q: reservation of task %q: %w", key, taskID, err)
	}
	return time.UnixMicro(int64(us)), true, nil
}

// KeyOfTask returns the key the middleware throttles t under with its
// default key function: the Key header, else the task type up to its first
// ':' ("slack:sync" is throttled as "slack"), else "" (unthrottled). A
// middleware built WithKeyFunc may pick another key for tasks without the
// header. An invalid key in the header is an error wrapping ErrInvalidKey.
func KeyOfTask(t *asynq.Task) (string, error) {
	var o options
	return o.keyOf(t)
}
