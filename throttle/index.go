package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// The index of a Limiter's keys: a sorted set, <prefix>:keys, of the names
// of the limiter keys that processes wrote, so that listing them (Keys,
// for the metrics, the web view and the CLI) costs in proportion to the
// limiter's keys, not to the whole Redis database, which a SCAN walks.
//
// A key's own Redis keys share its hash tag ({name}), so on a Redis Cluster
// no script that writes them can also write the index, which lives in
// another slot. So the index is kept from Go: a process records a key
// (ZADD GT, the member its name, the score the time in Unix seconds) after
// it first writes or decides it, and again at most every indexEvery while
// it keeps using it. A key found to have limits of its own in Redis
// (SetLimits) is also recorded as "{name}", a member no key name can be,
// so that Keys lists those first. Keys reads the index, checks which of
// its names still have anything in Redis (their keys expire, or are
// deleted), and drops from the index the members of those that have
// nothing and were recorded longer than indexGrace ago: a process that
// uses a key records it again within indexEvery, so a member dropped was
// not in use. Keys recorded before the index existed are found by one
// SCAN, the first time Keys finds the index without its marker.

const (
	// indexEvery is how often a process records a key it keeps using.
	indexEvery = time.Minute
	// indexGrace is how long an entry whose key has nothing in Redis is
	// kept: longer than indexEvery plus any skew between the processes'
	// clocks, so that an entry in use is never dropped.
	indexGrace = 5 * time.Minute
	// indexMarker is the member that says the index holds every key: the
	// SCAN that found the keys written before it was done. No key is "".
	indexMarker = ""
	// indexChunk bounds the names of one ZADD, EXISTS or script call.
	indexChunk = 200
)

// indexer records keys in the index in the background: a decision never
// waits for it. Keys to record gather while one ZADD is in the air and go
// in the next; no goroutine runs while there are none.
type indexer struct {
	mu      sync.Mutex
	idle    *sync.Cond         // signalled when running ends
	pending map[string]float64 // member -> score
	running bool
	warned  atomic.Bool
}

// flushIndex waits until the keys pending for the index are sent (or
// failed), at most until ctx ends.
func (l *Limiter) flushIndex(ctx context.Context) {
	x := &l.index
	done := make(chan struct{})
	go func() {
		x.mu.Lock()
		for x.running {
			x.idle.Wait()
		}
		x.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// touch records key in the index, in the background, if this process has
// not within indexEvery, or has not yet with the configured flag that it
// now has (configured: the key has limits of its own in Redis). Close
// sends what is still pending.
func (l *Limiter) touch(ks *keyState, key string, configured bool) {
	members := l.due(ks, key, configured)
	if members == nil {
		return
	}
	x := &l.index
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pending == nil {
		x.pending = map[string]float64{}
	}
	for _, m := range members {
		x.pending[m.Member.(string)] = max(x.pending[m.Member.(string)], m.Score)
	}
	if !x.running {
		x.running = true
		go l.recordPending()
	}
}

// due returns the members to record for ks's key, none when it is not
// due, and marks it recorded now.
func (l *Limiter) due(ks *keyState, key string, configured bool) []redis.Z {
	now := l.keys.now()
	last := ks.indexed.Load()
	if now.UnixNano()-last < int64(indexEvery) && (!configured || ks.indexedConf.Load()) {
		return nil
	}
	if !ks.indexed.CompareAndSwap(last, now.UnixNano()) {
		return nil // another goroutine records it
	}
	score := float64(now.Unix())
	members := []redis.Z{{Score: score, Member: key}}
	if configured {
		ks.indexedConf.Store(true)
		members = append(members, redis.Z{Score: score, Member: configuredMember(key)})
	}
	return members
}

// configuredMember is the member that says key has limits of its own in
// Redis: "{key}", which no key name can be.
func configuredMember(key string) string { return "{" + key + "}" }

// touchNow records key in the index before it returns, as touch would: an
// operator's change (SetLimits, Suspend, ...) may be the last thing its
// process does. A failure is logged: the change itself was made.
func (l *Limiter) touchNow(ctx context.Context, ks *keyState, key string, configured bool) {
	members := l.due(ks, key, configured)
	if members == nil {
		return
	}
	if err := l.record(ctx, members); err != nil {
		ks.indexed.Store(0)
		ks.indexedConf.Store(false)
		l.o.logger.Warn("throttle: cannot record a key in the index of the limiter's keys; Keys (the metrics, the web view, the CLI's list) shows it once it is recorded",
			"key", key, "index", keyspace.Index(l.o.prefix), "err", err)
	}
}

// recordPending sends the pending keys to the index until none are left.
func (l *Limiter) recordPending() {
	x := &l.index
	for {
		x.mu.Lock()
		batch := x.pending
		x.pending = nil
		if len(batch) == 0 {
			x.running = false
			x.idle.Broadcast()
			x.mu.Unlock()
			return
		}
		x.mu.Unlock()
		members := make([]redis.Z, 0, len(batch))
		for name, score := range batch {
			members = append(members, redis.Z{Score: score, Member: name})
		}
		if err := l.record(context.Background(), members); err != nil {
			// Recorded again by the next decision of each key.
			for name := range batch {
				if ks := l.keys.peek(name); ks != nil {
					ks.indexed.Store(0)
					ks.indexedConf.Store(false)
				}
			}
			if !x.warned.Swap(true) {
				l.o.logger.Warn("throttle: cannot record keys in the index of the limiter's keys; Keys (the metrics, the web view, the CLI's list) shows them once they are recorded",
					"index", keyspace.Index(l.o.prefix), "keys", len(batch), "err", err)
			}
		}
	}
}

// record adds members to the index (ZADD GT: a score only ever rises),
// indexChunk at a time, and makes the index outlive the keys it lists by
// indexTTL (no key without a TTL: an index that expired because nothing
// was recorded for that long is rebuilt by the next Keys, with SCAN).
func (l *Limiter) record(ctx context.Context, members []redis.Z) error {
	index := keyspace.Index(l.o.prefix)
	for c := range slices.Chunk(members, indexChunk) {
		_, err := bounded(l, ctx, func(ctx context.Context) ([]redis.Cmder, error) {
			return l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.ZAddArgs(ctx, index, redis.ZAddArgs{GT: true, Members: c})
				p.PExpire(ctx, index, l.indexTTL())
				return nil
			})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// indexTTL is how long the index lives after its last record: longer than
// any state it lists stays idle (a configured key's limits, kept until
// Delete, outlive it: an index that expired is rebuilt by one SCAN).
func (l *Limiter) indexTTL() time.Duration { return indexTTLFor }

// indexTTLFor is indexTTL's value: 30 days.
const indexTTLFor = 30 * 24 * time.Hour

// Keys returns every limiter key that has anything in Redis under the
// limiter's prefix (limits, bucket state, a suspension, reservations or
// slots in flight): first the keys with limits of their own in Redis
// (SetLimits), then the others (on default limits, or with only state
// left), each group sorted by name, so that a view that shows the first n
// shows the configured keys first.
//
// It reads the index of the limiter's keys that every process keeps in
// Redis (<prefix>:keys; docs/how-it-works.md), then checks which of them
// still have anything: a handful of commands for the limiter's keys, in
// one round trip per Redis (per master of a Cluster), whatever else the
// database holds. It drops from the index the keys that have had nothing
// for a while. A key a process writes is listed once the process has
// recorded it, a moment after its write; a key on default limits
// (WithDefaultLimits) is not in Redis until first used, and leaves once
// its buckets are full again. The first call on a Redis whose index is not
// complete (keys written by an earlier version, or a user that may not
// write the index) walks the keyspace with SCAN, on every master of a
// Cluster, as before the index existed.
func (l *Limiter) Keys(ctx context.Context) ([]string, error) {
	index := keyspace.Index(l.o.prefix)
	entries, err := bounded(l, ctx, func(ctx context.Context) ([]redis.Z, error) {
		return l.rdb.ZRangeWithScores(ctx, index, 0, -1).Result()
	})
	if err != nil {
		return nil, fmt.Errorf("throttle: list keys (ZRANGE %s): %w", index, err)
	}
	scores := make(map[string]float64, len(entries))
	configured := map[string]float64{}
	complete := false
	for _, z := range entries {
		name, _ := z.Member.(string)
		switch {
		case name == indexMarker:
			complete = true
		case strings.HasPrefix(name, "{") && strings.HasSuffix(name, "}"):
			configured[name[1:len(name)-1]] = z.Score
		case keyspace.Validate(name) == nil:
			scores[name] = z.Score
		}
	}
	now := l.keys.now()
	var scanned map[string]bool
	if !complete {
		if scanned, err = l.scanKeys(ctx); err != nil {
			return nil, err
		}
		members := []redis.Z{{Score: 0, Member: indexMarker}}
		for name := range scanned {
			if _, ok := scores[name]; !ok {
				scores[name] = float64(now.Unix())
				members = append(members, redis.Z{Score: float64(now.Unix()), Member: name})
			}
		}
		// The marker last: an index with it holds every key. A user that
		// may not write it walks the keyspace again next time.
		slices.Reverse(members)
		if err := l.record(ctx, members); err != nil {
			l.o.logger.Debug("throttle: cannot complete the index of the limiter's keys; Keys walks the keyspace with SCAN until a user that may write it calls Keys",
				"index", index, "err", err)
		}
	}
	names := make([]string, 0, len(scores))
	for name := range scores {
		if !scanned[name] {
			names = append(names, name)
		}
	}
	alive, err := l.existing(ctx, names, configured)
	if err != nil {
		return nil, fmt.Errorf("throttle: list keys (EXISTS): %w", err)
	}
	var keys, gone []string
	cutoff := float64(now.Add(-indexGrace).Unix())
	for name, score := range scores {
		switch {
		case scanned[name] || alive[name]:
			keys = append(keys, name)
		case score < cutoff:
			gone = append(gone, name)
		}
	}
	for name, score := range configured {
		if !scanned[name] && !alive[name] && score < cutoff {
			gone = append(gone, configuredMember(name))
		}
	}
	l.unindex(ctx, gone, now)
	slices.SortFunc(keys, func(a, b string) int {
		_, ca := configured[a]
		_, cb := configured[b]
		switch {
		case ca && !cb:
			return -1
		case cb && !ca:
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys, nil
}

// existing reports which of names have anything in Redis. On one Redis, an
// EXISTS of every name's configuration (a key with limits of its own:
// configured, kept until Delete) or bucket hash answers for a whole chunk
// at once when all have one (the usual case); otherwise, and on a Cluster,
// each name's keys are asked in one EXISTS (one slot), pipelined: one
// round trip per Redis (per master).
func (l *Limiter) existing(ctx context.Context, names []string, configured map[string]float64) (map[string]bool, error) {
	alive := make(map[string]bool, len(names))
	_, single := l.rdb.(*redis.Client)
	for chunk := range slices.Chunk(names, indexChunk) {
		keys := make([]lua.Keys, len(chunk))
		for i, name := range chunk {
			keys[i], _ = redisKeys(l.o.prefix, name) // names are valid
		}
		if single {
			buckets := make([]string, len(keys))
			for i, k := range keys {
				buckets[i] = k.Bucket
				if _, ok := configured[chunk[i]]; ok {
					buckets[i] = k.Config
				}
			}
			n, err := bounded(l, ctx, func(ctx context.Context) (int64, error) {
				return l.rdb.Exists(ctx, buckets...).Result()
			})
			if err != nil {
				return nil, err
			}
			if n == int64(len(chunk)) {
				for _, name := range chunk {
					alive[name] = true
				}
				continue
			}
		}
		counts, err := bounded(l, ctx, func(ctx context.Context) ([]*redis.IntCmd, error) {
			var cmds []*redis.IntCmd
			_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					cmds = append(cmds, p.Exists(ctx, keyspace.All(k)...))
				}
				return nil
			})
			return cmds, err
		})
		if err != nil {
			return nil, err
		}
		for i, c := range counts {
			if c.Val() > 0 {
				alive[chunk[i]] = true
			}
		}
	}
	return alive, nil
}

// unindex drops the members gone from the index, each unless a process
// recorded it again since the grace began. It is best effort: a user that may not
// write the index (a viewer) leaves them, and Keys checks them again.
func (l *Limiter) unindex(ctx context.Context, gone []string, now time.Time) {
	index := keyspace.Index(l.o.prefix)
	cutoff := now.Add(-indexGrace).Unix()
	for chunk := range slices.Chunk(gone, indexChunk) {
		_, err := bounded(l, ctx, func(ctx context.Context) (int64, error) {
			return lua.Unindex(ctx, l.runner, index, cutoff, chunk)
		})
		if err != nil {
			l.o.logger.Debug("throttle: cannot drop keys that have nothing in Redis from the index; Keys checks them again", "index", index, "keys", len(gone), "err", err)
			return
		}
	}
}

// scanCount is the COUNT hint of each SCAN call in scanKeys.
const scanCount = 1000

// scanKeys walks the keyspace with SCAN (never KEYS), on every master of a
// Redis Cluster, for the names of every limiter key with anything in
// Redis: what Keys did before the index, and does once to complete it.
func (l *Limiter) scanKeys(ctx context.Context) (map[string]bool, error) {
	var (
		mu    sync.Mutex
		found = map[string]bool{}
	)
	pattern := keyspace.ScanPattern(l.o.prefix)
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
			mu.Lock()
			for _, k := range p.keys {
				if name, ok := keyspace.NameOf(l.o.prefix, k); ok {
					found[name] = true
				}
			}
			mu.Unlock()
			if p.next == 0 {
				return nil
			}
			cursor = p.next
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
	return found, nil
}

// KeyStatus is one key's Status, or the error that kept it from being
// read, from InspectKeys.
type KeyStatus struct {
	Key    string
	Status Status
	// Err is what Inspect would have returned for the key: a *ConfigError
	// for invalid limits in Redis, an error reply of Redis (a key of the
	// wrong type under the limiter's prefix), or ErrInvalidKey.
	Err error
}

// inspectChunk bounds the keys one script call reads.
const inspectChunk = 100

// InspectKeys reports the status of each of keys, in their order, as
// Inspect does, but reads them together: one script call for up to 100
// keys, at one instant, on a Redis or a Sentinel-managed one (on a
// Cluster, whose keys lie in other slots, one call per key). A key that
// cannot be read has its error in its KeyStatus, and the others are read:
// one broken key does not hide the rest. The error is for a Redis that
// could not be asked (unreachable, past WithTimeout, ctx done); then no
// status is returned.
func (l *Limiter) InspectKeys(ctx context.Context, keys []string) ([]KeyStatus, error) {
	out := make([]KeyStatus, len(keys))
	if _, single := l.rdb.(*redis.Client); !single {
		for i, key := range keys {
			st, err := l.Inspect(ctx, key)
			if err != nil && !isKeyError(err) {
				return nil, err
			}
			out[i] = KeyStatus{Key: key, Status: st, Err: err}
		}
		return out, nil
	}
	var (
		idx  []int
		rkey []lua.Keys
	)
	for i, key := range keys {
		out[i].Key = key
		k, err := redisKeys(l.o.prefix, key)
		if err != nil {
			out[i].Err = err
			continue
		}
		idx, rkey = append(idx, i), append(rkey, k)
	}
	for start := 0; start < len(rkey); start += inspectChunk {
		end := min(start+inspectChunk, len(rkey))
		type reply struct {
			r    []lua.InspectReply
			errs []error
		}
		got, err := bounded(l, ctx, func(ctx context.Context) (reply, error) {
			r, errs, err := lua.InspectMany(ctx, l.runner, rkey[start:end], l.o.defaultTiers, l.o.lapse)
			return reply{r, errs}, err
		})
		if err != nil {
			return nil, fmt.Errorf("throttle: inspect %d keys: %w", end-start, err)
		}
		for j, r := range got.r {
			i := idx[start+j]
			if err := got.errs[j]; err != nil {
				out[i].Err = fmt.Errorf("throttle: key %q: inspect: %w", keys[i], err)
				continue
			}
			out[i].Status, out[i].Err = statusOf(keys[i], r)
		}
	}
	return out, nil
}

// isKeyError reports an error of one key's (what InspectKeys puts in a
// KeyStatus), not of Redis as a whole.
func isKeyError(err error) bool {
	return errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrInvalidKey) || isRedisError(err)
}
