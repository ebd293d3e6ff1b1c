package redistest_test

// This test uses only the standard library: go.sum currently lacks the
// entries for testify's own dependencies.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

func TestStartServesOnALoopbackPort(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	if s.Addr == "127.0.0.1:6379" || !strings.HasPrefix(s.Addr, "127.0.0.1:") {
		t.Fatalf("unexpected Addr %q", s.Addr)
	}

	ctx := context.Background()
	c := s.Client(t)
	if got, err := c.Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v", got, err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}

	want := map[string]string{"maxmemory-policy": "noeviction", "save": "", "appendonly": "no"}
	for name, w := range want {
		got, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", name, err)
		}
		if got[name] != w {
			t.Errorf("CONFIG GET %s = %q, want %q", name, got[name], w)
		}
	}
}

func TestStartPassesExtraArgsToTheServer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, "--databases", "4")
	got, err := s.Client(t).ConfigGet(context.Background(), "databases").Result()
	if err != nil || got["databases"] != "4" {
		t.Fatalf("CONFIG GET databases = %v, %v; want 4", got, err)
	}
}

func TestStartTwoServersAreIndependent(t *testing.T) {
	t.Parallel()
	a, b := redistest.Start(t), redistest.Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("both servers on %s", a.Addr)
	}
	ctx := context.Background()
	if err := a.Client(t).Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Client(t).Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET on other server: %v, want redis.Nil", err)
	}
}

func TestRestartKeepsTheAddressAndLosesTheData(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	addr := s.Addr
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sha, err := c.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		t.Fatal(err)
	}

	s.Restart(t)
	if s.Addr != addr {
		t.Fatalf("Addr after restart = %s, want %s", s.Addr, addr)
	}
	// The old client reconnects to the same address; data and scripts are gone.
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart: %v, want redis.Nil", err)
	}
	if err := c.EvalSha(ctx, sha, nil).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA after restart: %v, want NOSCRIPT", err)
	}

	// Restarting is repeatable.
	s.Restart(t)
	if got, err := s.Client(t).Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING after second restart = %q, %v", got, err)
	}
}

func TestStopEndsTheServer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	s.Stop() // idempotent
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after second Stop")
	}
}

func TestStartClusterSpreadsKeysOverThreeMasters(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := redistest.StartCluster(t)
	t.Logf("cluster %v ready in %v", cl.Addrs, time.Since(start).Round(time.Millisecond))
	if len(cl.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3", cl.Addrs)
	}

	ctx := context.Background()
	cc := cl.Client(t)
	slots := map[int64]bool{}
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("key:%d", i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		slot, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) < 90 {
		t.Fatalf("100 keys hashed to only %d slots", len(slots))
	}
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
		}
	}

	// Every master holds some of the keys and reports the cluster ok.
	var total int64
	for _, addr := range cl.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = node.Close() })
		info, err := node.ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") {
			t.Fatalf("CLUSTER INFO on %s:\n%s", addr, info)
		}
		n, err := node.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("node %s holds no keys", addr)
		}
		total += n
	}
	if total != 100 {
		t.Fatalf("nodes hold %d keys in total, want 100", total)
	}
}

func BenchmarkPing(b *testing.B) {
	s := redistest.Start(b)
	c := s.Client(b)
	ctx := context.Background()
	for b.Loop() {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// Launch is Start for programs that are not tests: a server in the caller's
// dir, gone after Stop.
func TestLaunchRunsAServerUntilStop(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	dir := t.TempDir()
	s, err := redistest.Launch(dir, "--maxmemory", "64mb")
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	defer s.Stop()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 250 * time.Millisecond})
	defer c.Close()
	if got, err := c.ConfigGet(ctx, "maxmemory").Result(); err != nil || got["maxmemory"] != "67108864" {
		t.Fatalf("CONFIG GET maxmemory = %v, %v; want the extra argument applied", got, err)
	}
	if got, err := c.ConfigGet(ctx, "dir").Result(); err != nil || got["dir"] != dir {
		t.Fatalf("CONFIG GET dir = %v, %v; want %s", got, err, dir)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

func TestLaunchClusterRunsThreeMastersUntilStop(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	c, err := redistest.LaunchCluster(t.TempDir())
	if err != nil {
		t.Fatalf("LaunchCluster: %v", err)
	}
	defer c.Stop()
	if len(c.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3 masters", c.Addrs)
	}
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, MaxRetries: -1, DialTimeout: 250 * time.Millisecond})
	defer cc.Close()
	masters := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatalf("MasterForKey %s: %v", key, err)
		}
		masters[node.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("30 keys on masters %v, want all 3 serving slots", masters)
	}
	c.Stop()
	for _, addr := range c.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 250 * time.Millisecond})
		err := n.Ping(ctx).Err()
		_ = n.Close()
		if err == nil {
			t.Fatalf("node %s still answers after Stop", addr)
		}
	}
}

// A persistent server killed with SIGKILL comes back on the same address
// with every acknowledged write.
func TestPersistentServerKeepsWritesAcrossAKill(t *testing.T) {
	t.Parallel()
	s := redistest.StartPersistent(t)
	ctx := context.Background()
	c := s.Client(t)
	for name, w := range map[string]string{"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"} {
		got, err := c.ConfigGet(ctx, name).Result()
		if err != nil || got[name] != w {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", name, got, err, w)
		}
	}
	for i := range 100 {
		if err := c.Incr(ctx, "n").Err(); err != nil {
			t.Fatalf("INCR %d: %v", i, err)
		}
	}
	addr := s.Addr
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	s.Restart(t)
	if s.Addr != addr {
		t.Fatalf("Addr after restart = %s, want %s", s.Addr, addr)
	}
	if got, err := c.Get(ctx, "n").Int(); err != nil || got != 100 {
		t.Fatalf("GET n after SIGKILL and restart = %d, %v; want 100", got, err)
	}
}

// The Sentinels promote the replica, and a failover client follows them.
func TestSentinelFailoverIsFollowedByTheClient(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := redistest.StartSentinel(t)
	t.Logf("master, replica and 3 Sentinels ready in %v", time.Since(start).Round(time.Millisecond))
	if len(s.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3 Sentinels", s.Addrs)
	}
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
	before, replica := s.Master(t), s.Replica(t)

	start = time.Now()
	from, to := s.Failover(t)
	t.Logf("failover %s -> %s in %v", from, to, time.Since(start).Round(time.Millisecond))
	if from != before || to != replica || to == from || s.Master(t) != to {
		t.Fatalf("failover from %s to %s; master before %s, now %s", from, to, before, s.Master(t))
	}
	// The client writes to the new master once it has heard of the switch.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Set(ctx, "k2", "v2", 0).Err()
		addr := ""
		if err == nil {
			node := redis.NewClient(&redis.Options{Addr: to})
			addr = to
			got, gerr := node.Get(ctx, "k2").Result()
			node.Close()
			if gerr == nil && got == "v2" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes through the failover client do not reach the new master %s: %v %s", to, err, addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k after failover = %q, %v; want the replicated v", got, err)
	}
}

// CLUSTER FAILOVER moves a slot to the replica without losing a write.
func TestClusterFailoverLosesNoWrite(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := redistest.StartClusterWithReplicas(t)
	t.Logf("6-node cluster ready in %v", time.Since(start).Round(time.Millisecond))
	if len(cl.Addrs) != 6 {
		t.Fatalf("Addrs = %v, want 6 nodes", cl.Addrs)
	}
	ctx := context.Background()
	cc := cl.Client(t)
	for i := range 100 {
		if err := cc.Incr(ctx, "{k}n").Err(); err != nil {
			t.Fatalf("INCR %d: %v", i, err)
		}
	}
	master, replica := cl.SlotNodes(t, "{k}n")
	start = time.Now()
	from, to := cl.Failover(t, "{k}n")
	t.Logf("failover %s -> %s in %v", from, to, time.Since(start).Round(time.Millisecond))
	if from == to || from != master || to != replica {
		t.Fatalf("failover from %s to %s; SlotNodes said %s and its replica %s", from, to, master, replica)
	}
	if m, r := cl.SlotNodes(t, "{k}n"); m != to || r != from {
		t.Fatalf("after the failover SlotNodes = %s, %s; want %s and its replica %s", m, r, to, from)
	}
	if got, err := cc.Incr(ctx, "{k}n").Result(); err != nil || got != 101 {
		t.Fatalf("INCR after failover = %d, %v; want 101 (no write lost)", got, err)
	}
	node := redis.NewClient(&redis.Options{Addr: to})
	defer node.Close()
	if got, err := node.Get(ctx, "{k}n").Int(); err != nil || got != 101 {
		t.Fatalf("GET on the new master %s = %d, %v; want 101", to, got, err)
	}
}
