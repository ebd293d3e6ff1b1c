package throttle_test

// End-to-end: slots in flight across a fleet of real asynq servers, a worker
// process killed mid-task, and a handler that panics.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// TestMain lets the test binary act as a worker process that a test kills
// (THROTTLE_TEST_WORKER=<redis addr>), and runs the tests of this package
// four at a time unless -parallel says otherwise: they wait on real time
// (drains at a rate, outages, leases running out) far more than they use
// the CPU, and at GOMAXPROCS (2 here) the package took 165 s. What go-redis
// logs about a test's Redis (every failed dial while a fault test keeps it
// down) goes to that test, not to stderr amid the other tests' output.
func TestMain(m *testing.M) {
	if addr := os.Getenv("THROTTLE_TEST_WORKER"); addr != "" {
		runWorkerProcess(addr)
		return
	}
	redistest.RaiseParallel(4)
	redistest.RouteRedisLogs()
	os.Exit(m.Run())
}

// runWorkerProcess runs one asynq server whose handler holds its task (and
// its slot) until the process is killed.
func runWorkerProcess(addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 2, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb, throttle.WithLogger(quiet), throttle.WithSlotExpiry(2*time.Second)))
	mux.HandleFunc("sync:", func(ctx context.Context, t *asynq.Task) error {
		fmt.Println("holding", string(t.Payload()))
		<-ctx.Done()
		return ctx.Err()
	})
	if err := srv.Run(mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// ledger records when each handler of a key started and ended.
type ledger struct {
	mu     sync.Mutex
	starts []time.Time
	ends   []time.Time
}

func (l *ledger) run(d time.Duration) {
	l.mu.Lock()
	l.starts = append(l.starts, time.Now())
	l.mu.Unlock()
	time.Sleep(d) // the call to the provider
	l.mu.Lock()
	l.ends = append(l.ends, time.Now())
	l.mu.Unlock()
}

// maxConcurrent is the most handlers running at any instant.
func (l *ledger) maxConcurrent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, s := range l.starts {
		edges = append(edges, edge{s, 1})
	}
	for _, e := range l.ends {
		edges = append(edges, edge{e, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta // ends first
		}
		return edges[i].at.Before(edges[j].at)
	})
	best, cur := 0, 0
	for _, e := range edges {
		cur += e.delta
		best = max(best, cur)
	}
	return best
}

// InFlight(3) beside a rate: across three servers (30 workers), never more
// than 3 handlers of the key run at once, every task runs once, and a
// handler that panics gives its slot back.
func TestE2EInFlightHoldsAcrossTheFleet(t *testing.T) {
	t.Parallel()
	var led ledger
	var panicked atomic.Bool
	f := startFleet(t, fleetConfig{handler: func(ctx context.Context, task *asynq.Task) error {
		if string(task.Payload()) == "job-7" && panicked.CompareAndSwap(false, true) {
			panic("a handler that panics")
		}
		led.run(200 * time.Millisecond)
		return nil
	}})
	f.setLimits("crm", throttle.PerSecond(100), throttle.InFlight(3))
	f.enqueue("crm", "job", 40)
	f.waitDone(40, 60*time.Second)
	f.audit(40)
	led.mu.Lock()
	ends := slices.Clone(led.ends)
	led.mu.Unlock()
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	// The panicking task comes back on asynq's retry backoff; the other 39
	// show what the slots allow.
	t.Logf("39 tasks of 200 ms on 3 slots ended %v after the first started (ideal 2.6 s)",
		ends[38].Sub(led.starts[0]).Round(10*time.Millisecond))
	assert.True(t, panicked.Load(), "the panicking handler ran")
	assert.LessOrEqual(t, led.maxConcurrent(), 3, "handlers of the key running at once")
	assert.Equal(t, 3, led.maxConcurrent(), "the slots were used")
	st, err := throttle.NewLimiter(f.rdb).Inspect(context.Background(), "crm")
	require.NoError(t, err)
	assert.Zero(t, st.InFlight, "slots still held after every task (the panic's included)")
}

// A worker process killed with SIGKILL while its handler holds a slot gives
// the slot back when the slot's lease ends, and the next task runs.
func TestE2EKilledWorkerGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := context.Background()
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.InFlight(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { _ = client.Close() })
	_, err := client.Enqueue(newTask(t, "sync:crm", []byte("first"), throttle.Key("crm")))
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "THROTTLE_TEST_WORKER="+s.Addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	require.Eventually(t, func() bool {
		st, err := lim.Inspect(ctx, "crm")
		return err == nil && st.InFlight == 1
	}, 15*time.Second, 20*time.Millisecond, "the worker process holds the slot")
	time.Sleep(3 * time.Second) // renewed past its 2 s lease while alive
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	require.Equal(t, 1, st.InFlight, "a live handler keeps its slot past the lease (renewed)")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_, _ = cmd.Process.Wait()
	require.Eventually(t, func() bool {
		d, err := lim.Take(ctx, "crm")
		if err == nil && d.Allowed {
			_ = lim.Release(ctx, "crm", d.Slot)
			return true
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the killed worker's slot comes back")
	t.Logf("slot back %v after SIGKILL (lease 2 s)", time.Since(killed).Round(10*time.Millisecond))
	assert.Less(t, time.Since(killed), 2*time.Second+time.Second, "the slot came back within its lease")
}
