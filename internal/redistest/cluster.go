package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterNodes is the number of masters in a Cluster.
const clusterNodes = 3

// Cluster is a 3-master Redis Cluster (no replicas) started for one test.
type Cluster struct {
	// Addrs are the "127.0.0.1:port" addresses of the master nodes.
	Addrs []string

	nodes []*Server
}

// StartCluster starts 3 cluster-enabled redis-server processes (each in its
// own temp dir, --cluster-node-timeout 2000), joins them with
// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, and
// waits until every node reports cluster_state:ok with all 16384 slots
// assigned. All nodes are killed on t.Cleanup.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	Require(t)
	requireBinary(t, "redis-cli")

	c := &Cluster{}
	for i := 0; i < clusterNodes; i++ {
		n := startServer(t, true, freeClusterPort, nil)
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()

	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s\n%s", strings.Join(args, " "), err, out, c.logTails())
	}

	if err := c.waitReady(ctx); err != nil {
		t.Fatalf("redistest: cluster %v not ready: %v\nredis-cli output:\n%s\n%s", c.Addrs, err, out, c.logTails())
	}
	return c
}

// Client returns a new cluster client for the cluster that is closed on
// t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: append([]string(nil), c.Addrs...)})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// waitReady polls CLUSTER INFO on every node until all of them report
// cluster_state:ok, all slots assigned and all nodes known, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1, PoolSize: 1})
		defer clients[i].Close()
	}
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": "16384",
		"cluster_slots_ok":       "16384",
		"cluster_known_nodes":    fmt.Sprint(clusterNodes),
	}
	var lastErr error
	for {
		lastErr = nil
		for i, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil {
				err = checkClusterInfo(info, want)
			}
			if err != nil {
				lastErr = fmt.Errorf("node %s: %w", c.nodes[i].Addr, err)
				break
			}
		}
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(pollInterval):
		}
	}
}

// checkClusterInfo checks that the CLUSTER INFO output has the wanted fields.
func checkClusterInfo(info string, want map[string]string) error {
	got := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			got[k] = v
		}
	}
	for k, v := range want {
		if got[k] != v {
			return fmt.Errorf("%s is %q, want %q", k, got[k], v)
		}
	}
	return nil
}

// logTails returns the log tails of all nodes.
func (c *Cluster) logTails() string {
	var sb strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&sb, "=== node %s ===\n%s\n", n.Addr, n.logTail())
	}
	return sb.String()
}
