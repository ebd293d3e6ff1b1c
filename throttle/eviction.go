package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// evictionCheckTimeout bounds the one look at Redis's eviction policy that
// NewLimiter takes in the background.
const evictionCheckTimeout = 2 * time.Second

// safePolicy is the only maxmemory-policy under which Redis never drops a
// limiter key: every other one evicts keys with a TTL (volatile-*), and all
// of ours have one, or any key (allkeys-*).
const safePolicy = "noeviction"

// checkEviction reads maxmemory-policy once, in the background, from every
// master that may hold the limiter's keys, and warns (once) when Redis may
// evict them, and (once) when it persists nothing (a restart without AOF or
// RDB loses asynq's tasks: 26 of 40 in a kill -9 test): an evicted bucket forgets what it admitted and over-admits,
// an evicted suspension or limit silently disappears. It reads INFO memory,
// not CONFIG GET, which managed Redis services often forbid. A policy it
// cannot read (a fake Redis, INFO renamed, Redis down) costs one Debug line
// and nothing else.
func (l *Limiter) checkEviction() {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
		defer cancel()
		policies, err := evictionPolicies(ctx, l.rdb)
		log := l.o.logger
		if err != nil {
			log.Debug("throttle: cannot read maxmemory-policy (INFO memory); Redis must not evict the limiter's keys: use maxmemory-policy noeviction",
				"err", err)
			return
		}
		var bad, addrs []string
		for _, p := range policies {
			if p.policy != safePolicy {
				bad = append(bad, p.policy)
				addrs = append(addrs, p.addr)
			}
		}
		var volatile []string
		for _, p := range policies {
			// (once per process and server, whatever the Limiters)
			if _, seen := warnedNoPersistence.LoadOrStore(p.addr+" "+p.runID, true); p.persists == persistsNothing && !seen {
				volatile = append(volatile, p.addr)
			}
		}
		if len(volatile) > 0 {
			log.Warn("throttle: Redis persists nothing (appendonly no, and no save points): a restart loses asynq's tasks (every queued, scheduled and deferred one) and the limiter's limits, suspensions and reservations; set appendonly yes (or save points) on a Redis that holds tasks",
				"appendonly", "no", "save", "", "redis", strings.Join(volatile, ","))
		}
		if len(bad) == 0 {
			log.Debug("throttle: Redis maxmemory-policy is noeviction", "redis", joinAddrs(policies))
			return
		}
		slices.Sort(bad)
		log.Warn("throttle: Redis may evict the limiter's keys: when it reaches maxmemory, an evicted bucket forgets what it admitted and over-admits (up to a whole burst), and an evicted suspension or limit disappears; set maxmemory-policy noeviction (asynq requires it too)",
			"maxmemory_policy", strings.Join(slices.Compact(bad), ","), "redis", strings.Join(addrs, ","))
	}()
}

// warnedNoPersistence holds the servers a Limiter of this process warned
// about persisting nothing: the warning is the process's, not each
// Limiter's.
var warnedNoPersistence sync.Map

// What a server keeps across a restart, as far as it tells.
const (
	persistsUnknown   = iota // CONFIG GET save refused (managed Redis), or no INFO persistence
	persistsNothing          // appendonly no, and no save points
	persistsSomething        // AOF or RDB save points
)

// readPersistence tells whether c persists anything, and the server's
// run_id (INFO server), which tells one server process from another at the
// same address. INFO persistence answers when it shows persistence at
// work: AOF on (aof_enabled), or an RDB snapshot made since the start.
// Otherwise only the save points can tell (CONFIG GET save): asked then
// only, since a user without the right to it (a worker's ACL, a managed
// Redis) is refused, and a refusal is logged by the server (ACL LOG): then
// unknown.
func readPersistence(ctx context.Context, c redis.Cmdable) (int, string) {
	field := func(section string, names ...string) []string {
		out := make([]string, len(names))
		info, err := c.Info(ctx, section).Result()
		if err != nil {
			return out
		}
		for _, line := range strings.Split(info, "\n") {
			for i, name := range names {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
					out[i] = v
				}
			}
		}
		return out
	}
	runID := field("server", "run_id")[0]
	p := field("persistence", "aof_enabled", "rdb_saves", "rdb_last_bgsave_time_sec")
	switch {
	case p[0] == "":
		return persistsUnknown, runID
	case p[0] == "1", p[1] != "" && p[1] != "0", p[2] != "" && p[2] != "-1":
		return persistsSomething, runID
	}
	save, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		return persistsUnknown, runID
	}
	v, ok := save["save"]
	switch {
	case !ok:
		return persistsUnknown, runID
	case strings.TrimSpace(v) == "":
		return persistsNothing, runID
	}
	return persistsSomething, runID
}

// nodePolicy is the eviction policy of one Redis server, and whether it
// persists anything (persistsUnknown, ...).
type nodePolicy struct {
	addr, policy string
	persists     int
	runID        string // the server's run_id, "" unknown
}

// evictionPolicies returns the maxmemory-policy of every server that holds
// data for rdb: the masters of a Cluster, the shards of a Ring, the server of
// a plain or failover client.
func evictionPolicies(ctx context.Context, rdb redis.UniversalClient) ([]nodePolicy, error) {
	var (
		mu  sync.Mutex
		out []nodePolicy
	)
	each := func(ctx context.Context, c *redis.Client) error {
		p, err := readPolicy(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		persists, runID := readPersistence(ctx, c)
		mu.Lock()
		out = append(out, nodePolicy{addr: c.Options().Addr, policy: p, persists: persists, runID: runID})
		mu.Unlock()
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Ring:
		err = c.ForEachShard(ctx, each)
	case *redis.Client:
		// A client of its own, one connection, closed at once: the check
		// takes nothing from the application's pool and leaves its
		// statistics alone. Only what reaches and authenticates to the
		// server is carried over (a failover client's Dialer finds the
		// master); the rest of the options may hold state that belongs to
		// the application's client (push handlers, caches).
		u := c.Options()
		addr, dial := u.Addr, u.Dialer
		if dial != nil {
			// A failover client's Addr is a placeholder: name the server
			// its Dialer reached.
			dial = func(ctx context.Context, network, a string) (net.Conn, error) {
				cn, err := u.Dialer(ctx, network, a)
				if err == nil {
					mu.Lock()
					addr = cn.RemoteAddr().String()
					mu.Unlock()
				}
				return cn, err
			}
		}
		own := redis.NewClient(&redis.Options{
			Network: u.Network, Addr: u.Addr, Dialer: dial, TLSConfig: u.TLSConfig,
			Username: u.Username, Password: u.Password, DB: u.DB,
			CredentialsProvider:          u.CredentialsProvider,
			CredentialsProviderContext:   u.CredentialsProviderContext,
			StreamingCredentialsProvider: u.StreamingCredentialsProvider,
			Protocol:                     2,
			DisableIdentity:              true,
			DialTimeout:                  u.DialTimeout,
			PoolSize:                     1,
			MaxRetries:                   -1,
			DialerRetries:                1,
			ContextTimeoutEnabled:        true, // the check's deadline bounds its socket I/O
		})
		defer own.Close()
		err = each(ctx, own)
		if err == nil {
			mu.Lock()
			out[0].addr = addr
			mu.Unlock()
		}
	default:
		var p string
		if p, err = readPolicy(ctx, rdb); err == nil {
			persists, runID := readPersistence(ctx, rdb)
			out = append(out, nodePolicy{addr: "redis", policy: p, persists: persists, runID: runID})
		}
	}
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no Redis server to ask")
	}
	slices.SortFunc(out, func(a, b nodePolicy) int { return strings.Compare(a.addr, b.addr) })
	return out, nil
}

// readPolicy returns the maxmemory_policy field of INFO memory.
func readPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok && v != "" {
			return v, nil
		}
	}
	return "", errors.New("INFO memory has no maxmemory_policy field")
}

// joinAddrs lists the servers that were asked.
func joinAddrs(ps []nodePolicy) string {
	addrs := make([]string, len(ps))
	for i, p := range ps {
		addrs[i] = p.addr
	}
	return strings.Join(addrs, ",")
}
