package redistest

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinels is how many Sentinels watch the master: the smallest
	// number that still agrees after losing one.
	sentinels = 3
	// sentinelQuorum is how many Sentinels must find the master down.
	sentinelQuorum = 2
	// SentinelMaster is the name the Sentinels of StartSentinel monitor
	// the master under (redis.FailoverOptions.MasterName).
	SentinelMaster = "redistest"
)

// Sentinel is a Redis master with one replica, watched by three Sentinels,
// started for one test. Connect with Client (a go-redis failover client), or
// with redis.NewFailoverClient on SentinelMaster and Addrs.
type Sentinel struct {
	// Addrs are the "127.0.0.1:port" addresses of the three Sentinels.
	Addrs []string

	data      []*Server // the master and the replica, in start order
	sentinels []*Server
}

// StartSentinel starts a master and one replica of it (--replicaof), waits
// until the replica is in sync, starts three Sentinels (redis-server <conf>
// --sentinel) that monitor the master as SentinelMaster with a quorum of 2
// (down-after-milliseconds 2000), and waits until each of them knows the
// replica and the two other Sentinels, so that Failover can run at once.
// extraArgs are given to the master and the replica. Everything is killed on
// t.Cleanup.
func StartSentinel(t testing.TB, extraArgs ...string) *Sentinel {
	t.Helper()
	Require(t)
	s := &Sentinel{}
	master := startServer(t, standalone, freePort, extraArgs)
	replica := startServer(t, standalone, freePort,
		append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.port)}, extraArgs...))
	s.data = []*Server{master, replica}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := s.poll(ctx, func(ctx context.Context) error {
		return withClient(replica.Addr, func(c *redis.Client) error { return replicaInSync(ctx, c) })
	}); err != nil {
		t.Fatalf("redistest: replica %s of %s not in sync: %v\n%s", replica.Addr, master.Addr, err, s.logTails())
	}

	for range sentinels {
		n := startServer(t, sentinelNode, freePort, nil)
		s.sentinels = append(s.sentinels, n)
		s.Addrs = append(s.Addrs, n.Addr)
		err := withClient(n.Addr, func(c *redis.Client) error {
			if err := c.Do(ctx, "SENTINEL", "MONITOR", SentinelMaster, "127.0.0.1", master.port, sentinelQuorum).Err(); err != nil {
				return err
			}
			return c.Do(ctx, "SENTINEL", "SET", SentinelMaster,
				"down-after-milliseconds", "2000", "failover-timeout", "10000").Err()
		})
		if err != nil {
			t.Fatalf("redistest: Sentinel %s: SENTINEL MONITOR %s: %v\n%s", n.Addr, master.Addr, err, s.logTails())
		}
	}
	if err := s.poll(ctx, s.agree(master.Addr)); err != nil {
		t.Fatalf("redistest: Sentinels %v not ready: %v\n%s", s.Addrs, err, s.logTails())
	}
	return s
}

// Client returns a go-redis failover client (redis.NewFailoverClient) on the
// Sentinels, closed on t.Cleanup. opts may adjust its options.
func (s *Sentinel) Client(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	o := &redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: append([]string(nil), s.Addrs...)}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Master returns the address of the current master as the first Sentinel
// names it.
func (s *Sentinel) Master(t testing.TB) string {
	t.Helper()
	var addr string
	err := withClient(s.Addrs[0], func(c *redis.Client) error {
		a, err := c.Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
		if err == nil && len(a) == 2 {
			addr = a[0] + ":" + a[1]
		}
		return err
	})
	if err != nil || addr == "" {
		t.Fatalf("redistest: SENTINEL GET-MASTER-ADDR-BY-NAME on %s: %q, %v", s.Addrs[0], addr, err)
	}
	return addr
}

// Replica returns the address of the data node that is not the master the
// first Sentinel names: the one Failover will promote.
func (s *Sentinel) Replica(t testing.TB) string {
	t.Helper()
	if m := s.Master(t); m != s.data[0].Addr {
		return s.data[0].Addr
	}
	return s.data[1].Addr
}

// Failover makes the Sentinels promote the replica with SENTINEL FAILOVER
// (sent to the first Sentinel) and waits until the promoted replica reports
// role:master and every Sentinel names it. It returns the addresses of the
// old and the new master. As in production, the old master keeps accepting
// writes from the clients still connected to it until they learn of the
// switch (go-redis: the +switch-master message), and the Sentinels make it a
// replica of the new master a few seconds later; what was written to it
// meanwhile is lost.
func (s *Sentinel) Failover(t testing.TB) (from, to string) {
	t.Helper()
	from, to = s.Master(t), s.Replica(t)
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := withClient(s.Addrs[0], func(c *redis.Client) error {
		return c.Do(ctx, "SENTINEL", "FAILOVER", SentinelMaster).Err()
	}); err != nil {
		t.Fatalf("redistest: SENTINEL FAILOVER on %s: %v\n%s", s.Addrs[0], err, s.logTails())
	}
	err := s.poll(ctx, func(ctx context.Context) error {
		if err := withClient(to, func(c *redis.Client) error {
			info, err := c.Info(ctx, "replication").Result()
			if err == nil {
				err = checkClusterInfo(info, map[string]string{"role": "master"})
			}
			return err
		}); err != nil {
			return fmt.Errorf("new master %s: %w", to, err)
		}
		for _, a := range s.Addrs {
			if err := withClient(a, func(c *redis.Client) error {
				m, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
				if err == nil && (len(m) != 2 || m[0]+":"+m[1] != to) {
					err = fmt.Errorf("names %v", m)
				}
				return err
			}); err != nil {
				return fmt.Errorf("Sentinel %s: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: failover from %s to %s: %v\n%s", from, to, err, s.logTails())
	}
	return from, to
}

// agree returns a check that every Sentinel monitors master, not down, with
// one replica and the other Sentinels known.
func (s *Sentinel) agree(master string) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, a := range s.Addrs {
			err := withClient(a, func(c *redis.Client) error {
				m, err := c.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Result()
				if err != nil {
					return err
				}
				f := sentinelFields(m)
				switch {
				case f["ip"]+":"+f["port"] != master:
					return fmt.Errorf("master is %s:%s, want %s", f["ip"], f["port"], master)
				case f["flags"] != "master":
					return fmt.Errorf("master flags %q", f["flags"])
				case f["num-slaves"] != "1":
					return fmt.Errorf("knows %s replicas, want 1", f["num-slaves"])
				case f["num-other-sentinels"] != strconv.Itoa(sentinels-1):
					return fmt.Errorf("knows %s other Sentinels, want %d", f["num-other-sentinels"], sentinels-1)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("Sentinel %s: %w", a, err)
			}
		}
		return nil
	}
}

// sentinelFields turns a SENTINEL MASTER reply (a flat list of names and
// values under RESP2, a map under RESP3) into a map.
func sentinelFields(v any) map[string]string {
	out := map[string]string{}
	switch r := v.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			out[fmt.Sprint(r[i])] = fmt.Sprint(r[i+1])
		}
	case map[any]any:
		for k, v := range r {
			out[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	}
	return out
}

// poll runs check until it returns nil or ctx ends.
func (s *Sentinel) poll(ctx context.Context, check func(context.Context) error) error {
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

// withClient runs f with a one-connection client on addr.
func withClient(addr string, f func(*redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	return f(c)
}

// logTails returns the log tails of every process.
func (s *Sentinel) logTails() string {
	var sb strings.Builder
	for _, n := range append(append([]*Server(nil), s.data...), s.sentinels...) {
		fmt.Fprintf(&sb, "=== %s ===\n%s\n", n.Addr, n.logTail())
	}
	return sb.String()
}

// sentinelConf is the config file of a Sentinel.
func (s *Server) sentinelConf() string { return filepath.Join(s.dir, "sentinel.conf") }
