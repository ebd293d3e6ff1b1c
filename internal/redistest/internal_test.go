package redistest

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStartRetriesWhenPortTaken simulates losing the race for a free port:
// the first port offered is already used by another redis-server, which also
// answers PING, so Start must detect that the answering server is not its
// own process and retry on a new port.
func TestStartRetriesWhenPortTaken(t *testing.T) {
	t.Parallel()
	Require(t)
	other := Start(t)

	calls := 0
	pick := func() (int, error) {
		calls++
		if calls == 1 {
			return other.port, nil
		}
		return freePort()
	}
	s := startServer(t, standalone, pick, nil)
	if calls < 2 {
		t.Fatalf("pickPort called %d times, want a retry", calls)
	}
	if s.Addr == other.Addr {
		t.Fatalf("started on the taken address %s", s.Addr)
	}
	if err := pingOwn(s.Addr, s.proc.cmd.Process.Pid); err != nil {
		t.Fatalf("new server: %v", err)
	}
	if err := pingOwn(other.Addr, other.proc.cmd.Process.Pid); err != nil {
		t.Fatalf("other server disturbed: %v", err)
	}
}

func TestFreeClusterPortLeavesRoomForTheBusPort(t *testing.T) {
	t.Parallel()
	for i := 0; i < 20; i++ {
		p, err := freeClusterPort()
		if err != nil {
			t.Fatal(err)
		}
		if p < clusterPortMin || p >= clusterPortMax || p+clusterBusOffset > 65535 {
			t.Fatalf("port %d out of range", p)
		}
	}
}

// RaiseParallel sets -test.parallel when it was not given, and never lowers
// it.
func TestRaiseParallelSetsTheFlagOnlyUpwards(t *testing.T) {
	f := flag.Lookup("test.parallel")
	require.NotNil(t, f)
	old := f.Value.String()
	t.Cleanup(func() { _ = f.Value.Set(old) })
	require.NoError(t, f.Value.Set("1"))
	RaiseParallel(3)
	assert.Equal(t, "3", f.Value.String(), "raised from 1")
	RaiseParallel(2)
	assert.Equal(t, "3", f.Value.String(), "never lowered")
}

// tbLog is a testing.TB whose Logf and Cleanup are kept, to check what a
// test would log when its cleanups run.
type tbLog struct {
	testing.TB
	logs     []string
	cleanups []func()
}

func (tb *tbLog) Helper()          {}
func (tb *tbLog) Cleanup(f func()) { tb.cleanups = append(tb.cleanups, f) }
func (tb *tbLog) Logf(format string, args ...any) {
	tb.logs = append(tb.logs, fmt.Sprintf(format, args...))
}

// cleanUp runs the cleanups, last in first out, as testing does.
func (tb *tbLog) cleanUp() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

// A server's clients that fail to dial it (it was stopped) make go-redis
// log; RouteRedisLogs (installed by this package's TestMain) gives those
// lines to the test that started the server, which reports them in one
// line at its cleanup, and prints none to stderr.
func TestRedisLogsGoToTheTestThatStartedTheServer(t *testing.T) {
	t.Parallel()
	Require(t)
	tb := &tbLog{TB: t}
	s := startServer(tb, standalone, freePort, nil)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	s.Stop()
	require.Error(t, c.Ping(context.Background()).Err(), "the server is stopped")
	require.NoError(t, c.Close())
	tb.cleanUp()
	require.Len(t, tb.logs, 1, "what the test logged: %q", tb.logs)
	assert.Contains(t, tb.logs[0], "about "+s.Addr)
	assert.Contains(t, tb.logs[0], "failed to dial")
	routes.mu.Lock()
	defer routes.mu.Unlock()
	assert.NotContains(t, routes.byAddr, s.Addr, "the route ends with the test")
}

// Lines that name no server of a test go to stderr as go-redis prints
// them; an address is matched whole, not as the prefix of a longer port.
func TestRedisLogsNamingNoServerGoToStderr(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	r := &logRouter{byAddr: map[string]*logRoute{}, stderr: log.New(&stderr, "redis: ", 0)}
	rt := &logRoute{}
	r.byAddr["127.0.0.1:1500"] = rt
	ctx := context.Background()
	r.Printf(ctx, "dial tcp %s: connect: connection refused", "127.0.0.1:15000")
	r.Printf(ctx, "Conn has unread data (not push notification), removing it")
	r.Printf(ctx, "dial tcp %s: connect: connection refused", "127.0.0.1:1500")
	r.Printf(ctx, "dial tcp 127.0.0.1:15001, then %s", "127.0.0.1:1500")
	assert.Equal(t, "redis: dial tcp 127.0.0.1:15000: connect: connection refused\nredis: Conn has unread data (not push notification), removing it\n", stderr.String())
	assert.Equal(t, 2, rt.lines)
	assert.Equal(t, "dial tcp 127.0.0.1:1500: connect: connection refused", rt.first)
}
