package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterMasters is the number of masters in a Cluster.
const clusterMasters = 3

// Cluster is a Redis Cluster of 3 masters (and, from
// StartClusterWithReplicas, one replica each) started for one test.
type Cluster struct {
	// Addrs are the "127.0.0.1:port" addresses of the nodes: the 3 masters
	// from StartCluster, all 6 nodes from StartClusterWithReplicas.
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
	return startCluster(t, 0)
}

// StartClusterWithReplicas is StartCluster with one replica per master: 6
// nodes joined with --cluster-replicas 1. It also waits until every replica
// is in sync with its master, so that Failover can run at once.
func StartClusterWithReplicas(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, 1)
}

func startCluster(t testing.TB, replicas int) *Cluster {
	t.Helper()
	Require(t)
	requireBinary(t, "redis-cli")

	c := &Cluster{}
	for i := 0; i < clusterMasters*(1+replicas); i++ {
		n := startServer(t, clusterNode, freeClusterPort, nil)
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()

	if err := c.join(ctx, replicas); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// join joins the started nodes into a cluster with redis-cli --cluster
// create and waits until every node reports it ready.
func (c *Cluster) join(ctx context.Context, replicas int) error {
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli %s: %v\n%s\n%s", strings.Join(args, " "), err, out, c.logTails())
	}
	if err := c.waitReady(ctx); err != nil {
		return fmt.Errorf("cluster %v not ready: %v\nredis-cli output:\n%s\n%s", c.Addrs, err, out, c.logTails())
	}
	return nil
}

// LaunchCluster starts a 3-master Cluster as StartCluster does, for
// programs that are not tests (the bench harness): each node's files go in
// a directory of its own under dir, which the caller removes after Stop.
// The error names what went wrong and includes the nodes' logs.
func LaunchCluster(dir string) (*Cluster, error) {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s not on PATH: %w", bin, err)
		}
	}
	c := &Cluster{}
	for i := range clusterMasters {
		nodeDir := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		n, err := launchIn(nodeDir, clusterNode, freeClusterPort, nil)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := c.join(ctx, 0); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop kills every node of a Cluster from LaunchCluster (StartCluster's
// nodes are killed on t.Cleanup) and waits for them to exit.
func (c *Cluster) Stop() {
	for _, n := range c.nodes {
		n.Stop()
	}
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
// cluster_state:ok, all slots assigned and all nodes known, and every
// replica reports its link to its master up, or ctx ends.
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
		"cluster_known_nodes":    fmt.Sprint(len(c.nodes)),
	}
	var lastErr error
	for {
		lastErr = nil
		for i, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil {
				err = checkClusterInfo(info, want)
			}
			if err == nil {
				err = replicaInSync(ctx, cl)
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

// replicaInSync returns an error while the node is a replica whose link to
// its master is not up (a master is always in sync).
func replicaInSync(ctx context.Context, cl *redis.Client) error {
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:slave") {
		return nil
	}
	return checkClusterInfo(info, map[string]string{"master_link_status": "up"})
}

// checkClusterInfo checks that a CLUSTER INFO (or INFO) reply has the
// wanted fields.
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

// SlotNodes returns the addresses of the master that serves key's slot and
// of its replica ("" without replicas): the nodes Failover(t, key) swaps.
func (c *Cluster) SlotNodes(t testing.TB, key string) (master, replica string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	m, r, _ := c.slotNodes(ctx, t, key)
	if r == nil {
		return m.addr, ""
	}
	return m.addr, r.addr
}

// slotNodes finds the master of key's slot and its replica (nil if none).
func (c *Cluster) slotNodes(ctx context.Context, t testing.TB, key string) (master, replica *clusterNodeInfo, slot int) {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: c.nodes[0].Addr, MaxRetries: -1, PoolSize: 1})
	defer cl.Close()
	s, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("redistest: CLUSTER KEYSLOT %s: %v", key, err)
	}
	table, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatalf("redistest: CLUSTER NODES: %v", err)
	}
	nodes := parseClusterNodes(table)
	master = ownerOf(nodes, int(s))
	if master == nil {
		t.Fatalf("redistest: no master serves slot %d of %q:\n%s", s, key, table)
	}
	for i := range nodes {
		if nodes[i].masterID == master.id {
			replica = &nodes[i]
		}
	}
	return master, replica, int(s)
}

// Failover makes the replica of the master that serves key's slot take the
// master's place with CLUSTER FAILOVER, sent to the replica: a manual
// failover, in which the master holds its clients' writes until the replica
// has caught up, so no acknowledged write is lost. It waits until every node
// names the replica as the slot's master and the old master as its replica,
// and reports cluster_state:ok, and
// returns the addresses of the old and the new master. The cluster must have
// replicas (StartClusterWithReplicas).
func (c *Cluster) Failover(t testing.TB, key string) (from, to string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	master, replica, slot := c.slotNodes(ctx, t, key)
	if replica == nil {
		t.Fatalf("redistest: master %s of slot %d has no replica (use StartClusterWithReplicas)", master.addr, slot)
	}
	clients := map[string]*redis.Client{}
	for _, n := range c.nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1, PoolSize: 1})
		defer cl.Close()
		clients[n.Addr] = cl
	}
	if err := clients[replica.addr].Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("redistest: CLUSTER FAILOVER on %s: %v", replica.addr, err)
	}

	want := map[string]string{"cluster_state": "ok"}
	var lastErr error
	for {
		lastErr = nil
		for addr, cl := range clients {
			table, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				lastErr = fmt.Errorf("node %s: %w", addr, err)
				break
			}
			nodes := parseClusterNodes(table)
			if o := ownerOf(nodes, slot); o == nil || o.addr != replica.addr {
				lastErr = fmt.Errorf("node %s does not name %s master of slot %d yet", addr, replica.addr, slot)
				break
			}
			if !slices.ContainsFunc(nodes, func(n clusterNodeInfo) bool { return n.addr == master.addr && n.masterID == replica.id }) {
				lastErr = fmt.Errorf("node %s does not name %s a replica of %s yet", addr, master.addr, replica.addr)
				break
			}
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil {
				err = checkClusterInfo(info, want)
			}
			if err != nil {
				lastErr = fmt.Errorf("node %s: %w", addr, err)
				break
			}
		}
		if lastErr == nil {
			return master.addr, replica.addr
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: failover of slot %d from %s to %s: %v (last: %v)\n%s", slot, master.addr, replica.addr, ctx.Err(), lastErr, c.logTails())
		case <-time.After(pollInterval):
		}
	}
}

// clusterNodeInfo is one line of CLUSTER NODES.
type clusterNodeInfo struct {
	id, addr, masterID string
	master             bool
	slots              [][2]int // inclusive ranges
}

// parseClusterNodes parses a CLUSTER NODES reply: "<id> <ip:port@bus[,host]>
// <flags> <master id or -> <ping> <pong> <epoch> <link> <slot ranges>...".
func parseClusterNodes(table string) []clusterNodeInfo {
	var out []clusterNodeInfo
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNodeInfo{id: f[0], addr: addr, master: strings.Contains(f[2], "master")}
		if f[3] != "-" {
			n.masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, ranged := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := a, error(nil)
			if ranged {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out
}

// ownerOf returns the master that serves slot, or nil.
func ownerOf(nodes []clusterNodeInfo, slot int) *clusterNodeInfo {
	for i := range nodes {
		if !nodes[i].master {
			continue
		}
		for _, r := range nodes[i].slots {
			if r[0] <= slot && slot <= r[1] {
				return &nodes[i]
			}
		}
	}
	return nil
}

// StopNode kills the node at addr (one of Addrs) with SIGKILL.
func (c *Cluster) StopNode(t testing.TB, addr string) {
	t.Helper()
	for _, n := range c.nodes {
		if n.Addr == addr {
			n.Stop()
			return
		}
	}
	t.Fatalf("redistest: no cluster node at %s", addr)
}
