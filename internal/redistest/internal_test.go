package redistest

import (
	"flag"
	"testing"

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
