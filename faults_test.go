// Fault tests: real redis-server processes killed, failed over and paused
// under a fleet of real asynq servers draining throttled tasks, every task
// audited through asynq.Inspector. Each test prints its figures on one line
// starting with FIGURE.
package throttle_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// The limit every fault test drains under: 50/s with a burst of 50, so a
// backlog drains at the full rate (asynq brings deferred tasks back on whole
// seconds, so a smaller burst would cap the drain at burst per second) and
// the busiest second comes near its bound of 100.
const (
	faultRate  = 50
	faultBurst = 50
	faultBound = faultRate + faultBurst
)

func faultLimit() throttle.Limit { return throttle.PerSecond(faultRate).WithBurst(faultBurst) }

// asynqLease is how long asynq v0.26 leases a task it dequeued (and renews
// the lease by while the task runs): its internal rdb.LeaseDuration, kept
// in asynq:{<queue>}:lease scored in Unix seconds.
const asynqLease = 30 * time.Second

// timeline keeps every middleware event with the time it was observed.
type timeline struct {
	mu  sync.Mutex
	evs []timedEvent
}

type timedEvent struct {
	at time.Time
	ev throttle.Event
}

func (tl *timeline) observe(ev throttle.Event) {
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.evs = append(tl.evs, timedEvent{now, ev})
}

// decided reports whether Redis made the event's decision: a task run on a
// token of its own (not leased) or deferred by a refusal.
func decided(ev throttle.Event) bool {
	return (ev.Outcome == throttle.Ran && !ev.Leased) || ev.Outcome == throttle.Deferred
}

// firstDecisionAfter returns when the first decision made by Redis after t
// was observed.
func (tl *timeline) firstDecisionAfter(t time.Time) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, e := range tl.evs {
		if e.at.After(t) && decided(e.ev) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// outcomeCounts counts events as ran, deferred, failed closed (deferred
// because Redis could not decide) and failed open (run unthrottled).
type outcomeCounts struct{ ran, deferred, failedClosed, failedOpen int }

func (c outcomeCounts) String() string {
	return fmt.Sprintf("ran %d deferred %d failed-closed %d failed-open %d", c.ran, c.deferred, c.failedClosed, c.failedOpen)
}

// longestDecision returns the longest time a decision took, round trip
// included (Event.Latency), and how many were timed.
func (tl *timeline) longestDecision() (time.Duration, int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var longest time.Duration
	n := 0
	for _, e := range tl.evs {
		if e.ev.Latency > 0 {
			longest = max(longest, e.ev.Latency)
			n++
		}
	}
	return longest, n
}

func (tl *timeline) counts() outcomeCounts {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var c outcomeCounts
	for _, e := range tl.evs {
		switch {
		case e.ev.Outcome == throttle.Ran:
			c.ran++
		case e.ev.Outcome == throttle.Deferred:
			c.deferred++
		case e.ev.Outcome == throttle.Failed && e.ev.HandlerRan:
			c.failedOpen++
		case e.ev.Outcome == throttle.Failed:
			c.failedClosed++
		}
	}
	return c
}

// probe is an outer middleware that remembers when each task last entered
// the throttle middleware.
type probe struct {
	mu      sync.Mutex
	entered map[string]time.Time // task ID -> last entry
}

func newProbe() *probe { return &probe{entered: map[string]time.Time{}} }

func (p *probe) middleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		p.mu.Lock()
		p.entered[id] = time.Now()
		p.mu.Unlock()
		return next.ProcessTask(ctx, t)
	})
}

func (p *probe) lastEntry(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.entered[id]
	return t, ok
}

// waitAllRan waits until each of jobs has run at least once and nothing is
// left in the queue (pending, active, scheduled or retry).
func (f *fleet) waitAllRan(jobs int, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		f.rec.mu.Lock()
		n := len(f.rec.runs)
		f.rec.mu.Unlock()
		q, err := f.insp.GetQueueInfo("default")
		if n >= jobs && err == nil && q.Pending+q.Active+q.Scheduled+q.Retry == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("after %v: %d of %d jobs ran; queue: %+v (%v)", within, n, jobs, q, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// auditAtLeastOnce checks that every job ran at least once and that nothing
// was archived, and returns what it found (duplicates: the extra runs) and
// the jobs that ran more than once with their number of extra runs.
func (f *fleet) auditAtLeastOnce(jobs int) (c auditCounts, dups map[string]int) {
	f.t.Helper()
	dups = map[string]int{}
	f.rec.mu.Lock()
	for job, runs := range f.rec.runs {
		if len(runs) > 1 {
			dups[job] = len(runs) - 1
			c.duplicates += len(runs) - 1
		}
	}
	assert.Len(f.t, f.rec.runs, jobs, "distinct jobs done (the others are lost)")
	c.lost = max(0, jobs-len(f.rec.runs))
	f.rec.mu.Unlock()
	c.archived = f.auditArchive(f.queueInfo())
	return c, dups
}

// excessOver returns how far the busiest 1 s window of ts goes over bound.
func excessOver(ts []time.Time, bound int) (busiest, excess int) {
	busiest = maxInWindow(ts, time.Second)
	return busiest, max(0, busiest-bound)
}

func since(ts []time.Time, from time.Time) []time.Time {
	i, _ := slices.BinarySearchFunc(ts, from, func(a, b time.Time) int { return a.Compare(b) })
	return ts[i:]
}

// Redis killed mid-drain: SIGKILL, restarted 5 s later on the same port with
// appendonly yes / appendfsync always. Nothing is lost or archived; tasks
// in flight at the kill may run twice (asynq is at-least-once: their
// completion never reached Redis), and only they; decisions resume at once
// and the bound holds after the restart.
//
// In flight at the kill means dequeued before it (asynq moved the task to
// active) and not finished in Redis: the restored AOF holds it active, with
// the lease asynq wrote at the dequeue. Its handler may start after the
// kill, on an admission made before it: at a paced slot a moment ahead, or
// on a token its process leased. When the handler itself starts says
// nothing: on a loaded machine a task dequeued just before the kill
// reaches the middleware after the test read its clock.
//
// asynq v0.26 retries a failed completion with a context that is already
// cancelled, so the tasks in flight at the kill stay active until asynq's
// recoverer finds their lease expired (lease 30 s, then 30 s of grace, and
// it runs every minute): up to about 2 minutes. This test waits for that;
// it runs in parallel with the others.
func TestFaultRedisKilledMidDrainLosesNoTask(t *testing.T) {
	t.Parallel()
	s := redistest.StartPersistent(t)
	tl := &timeline{}
	f := startFleet(t, fleetConfig{
		tasks: func(t *testing.T) redis.UniversalClient { return s.Client(t) },
		cfg: asynq.Config{RetryDelayFunc: func(n int, err error, task *asynq.Task) time.Duration {
			if err == asynq.ErrLeaseExpired {
				return time.Second // bring recovered tasks back at once (asynq's default: 15-45 s)
			}
			return asynq.DefaultRetryDelayFunc(n, err, task)
		}},
		observer: tl.observe,
	})
	f.setLimits("crm", faultLimit())
	ids := f.enqueue("crm", "job", 300)
	idOf := map[string]string{}
	for i, id := range ids {
		idOf[fmt.Sprintf("job-%d", i)] = id
	}

	require.Eventually(t, func() bool { return f.rec.count() >= 100 }, 30*time.Second, 5*time.Millisecond)
	killedAt := time.Now()
	s.Stop()
	deadAt := time.Now() // the process has exited: nothing is dequeued after this until the restart
	doneAtKill := f.rec.count()
	time.Sleep(5 * time.Second) // the outage
	s.Restart(t)
	readyAt := time.Now()

	// What the AOF says was active at the kill: tasks dequeued before it
	// whose completion (or deferral) never reached Redis. asynq keeps a
	// lease per active task, due LeaseDuration (30 s) after its dequeue or
	// last renewal, in whole seconds (asynq v0.26's layout): one due by
	// deadAt+30s was written before the kill; one written after the
	// restart is due 35 s after the kill or later. (No worker of a task in
	// flight at the kill outlives the 5 s outage to renew its lease: its
	// Redis calls fail at once, its decision within WithTimeout.)
	leases, err := f.rdb.ZRangeWithScores(context.Background(), "asynq:{default}:lease", 0, -1).Result()
	require.NoError(t, err)
	inFlight := map[string]bool{}
	for _, l := range leases {
		if int64(l.Score) <= deadAt.Add(asynqLease).Unix() {
			inFlight[l.Member.(string)] = true
		}
	}

	// The tasks in flight at the kill are asynq's to recover: their leases
	// run out 30 s after the last renewal, and a recoverer takes a task
	// whose lease ran out 30 s ago or more. The fleet's recoverers look
	// once a minute; a server started then looks at once.
	recoverable := func() bool {
		leases, err := f.rdb.ZRangeWithScores(context.Background(), "asynq:{default}:lease", 0, -1).Result() // (asynq v0.26's layout)
		require.NoError(t, err)
		for _, l := range leases {
			if time.Unix(int64(l.Score), 0).Add(31 * time.Second).After(time.Now()) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, recoverable, 90*time.Second, 250*time.Millisecond, "leases of the tasks in flight at the kill")
	f.addServer()
	f.waitAllRan(300, 60*time.Second)
	allDone := time.Since(killedAt)
	found, dups := f.auditAtLeastOnce(300)
	for job, n := range dups {
		assert.True(t, inFlight[idOf[job]], "%s ran %d extra times but was not in flight at the kill", job, n)
	}
	assert.LessOrEqual(t, len(dups), len(inFlight), "jobs run twice: at most the tasks in flight at the kill")

	first, ok := tl.firstDecisionAfter(readyAt)
	require.True(t, ok, "no decision after the restart")
	ts := f.rec.times("crm")
	after, _ := excessOver(since(ts, readyAt), faultBound)
	busiest, excess := excessOver(ts, faultBound)
	t.Logf("FIGURE redis-killed: %v (in flight at kill: %d; %d done before it) first decision %.2fs after Redis accepted; max in 1s window after restart %d (bound %d; whole run %d, excess %d); all done %.0fs after the kill (killed in %v)",
		found, len(inFlight), doneAtKill, first.Sub(readyAt).Seconds(), after, faultBound, busiest, excess, allDone.Seconds(), deadAt.Sub(killedAt).Round(time.Millisecond))
	assert.Less(t, first.Sub(readyAt), 2*time.Second, "decisions did not resume within 2 s of Redis accepting connections")
	assert.LessOrEqual(t, after, faultBound, "runs in a 1 s window after the restart")
	assert.Zero(t, excess, "runs in a 1 s window, whole run")
}

// scriptRuns returns how many script calls (EVALSHA and EVAL) the server of
// c ran without error, from INFO commandstats.
func scriptRuns(ctx context.Context, c *redis.Client) (int, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		var calls, failed int
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				fmt.Sscan(v, &calls)
			case "failed_calls":
				fmt.Sscan(v, &failed)
			}
		}
		n += calls - failed
	}
	return n, nil
}

// failoverWatch is what watchFailover saw on the node being promoted.
type failoverWatch struct {
	promoted time.Time            // first answer with role:master
	changed  map[string]time.Time // limiter key -> first change of its Redis keys after that
}

// watchFailover polls the node at addr every 10 ms from now on: when it
// first answers as a master, and when, after that, the Redis keys of each of
// the limiter keys (all keys with its hash tag, whatever the layout) first
// change there, that is when the first decision on that key ran on the new
// master. wait stops it once every key changed or within passed.
func watchFailover(t *testing.T, addr string, keys ...string) (wait func(within time.Duration) failoverWatch) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan failoverWatch, 1)
	snapshot := func(key string) map[string]string {
		names, _ := c.Keys(ctx, "*{"+key+"}*").Result()
		m := map[string]string{}
		for _, n := range names {
			m[n], _ = c.Dump(ctx, n).Result()
		}
		return m
	}
	go func() {
		w := failoverWatch{changed: map[string]time.Time{}}
		defer func() { out <- w }()
		var base map[string]map[string]string
		for {
			if w.promoted.IsZero() {
				if info, err := c.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, "role:master") {
					w.promoted = time.Now()
					base = map[string]map[string]string{}
					for _, k := range keys {
						base[k] = snapshot(k)
					}
				}
			} else {
				for _, k := range keys {
					if _, seen := w.changed[k]; !seen && !maps.Equal(base[k], snapshot(k)) {
						w.changed[k] = time.Now()
					}
				}
				if len(w.changed) == len(keys) {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func(within time.Duration) failoverWatch {
		select {
		case w := <-out:
			cancel()
			return w
		case <-time.After(within):
			cancel()
			return <-out
		}
	}
}

// prober takes from its own key every 10 ms on its own client, as a busy
// process would, and notes errors and the longest time between two
// decisions.
type prober struct {
	stop    chan struct{}
	done    chan struct{}
	errs    int
	longest time.Duration
}

func startProber(t *testing.T, rdb redis.UniversalClient, key string) *prober {
	l := throttle.NewLimiter(rdb, throttle.WithLogger(quiet))
	require.NoError(t, l.SetLimits(context.Background(), key, throttle.PerSecond(100_000)))
	p := &prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		last := time.Now()
		for {
			if _, err := l.Take(context.Background(), key); err != nil {
				p.errs++
			} else {
				p.longest = max(p.longest, time.Since(last))
				last = time.Now()
			}
			select {
			case <-p.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(p.end)
	return p
}

// end stops the prober (once) and waits for it.
func (p *prober) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// decisionsBack checks that decisions ran on the new master within 2 s:
// those of a Limiter that decides all the time within 2 s of the promotion,
// and the fleet's within 2 s of the failover being complete (the Sentinels
// agreeing, the cluster settled), because a draining fleet decides in bursts
// on whole seconds, when asynq brings its deferred tasks back.
func decisionsBack(t *testing.T, w failoverWatch, probeKey string, complete time.Time) {
	t.Helper()
	require.False(t, w.promoted.IsZero(), "the replica never reported role:master")
	require.False(t, w.changed[probeKey].IsZero(), "no decision of the prober ran on the new master")
	require.False(t, w.changed["crm"].IsZero(), "no decision of the fleet ran on the new master")
	assert.Less(t, w.changed[probeKey].Sub(w.promoted), 2*time.Second, "decisions on the new master within 2 s of the promotion")
	assert.Less(t, w.changed["crm"].Sub(complete), 2*time.Second, "the fleet's decisions on the new master within 2 s of the failover")
}

func seconds(from, to time.Time) string {
	if from.IsZero() || to.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%.2fs", to.Sub(from).Seconds())
}

// Sentinel failover mid-drain: the limits live on a master with a replica
// and 3 Sentinels (the tasks on a Redis of their own), and SENTINEL FAILOVER
// promotes the replica while 3 servers drain 300 tasks. The failover clients
// follow it; no task is lost; the fleet decides on the new master within
// 2 s of the promotion; decisions written to the old master after the
// promotion are lost with it (asynchronous replication), so the bound may
// be exceeded, by at most one burst.
func TestFaultSentinelFailoverLosesNoTask(t *testing.T) {
	t.Parallel()
	sen := redistest.StartSentinel(t)
	tl := &timeline{}
	f := startFleet(t, fleetConfig{
		limitsClient: func(t *testing.T) redis.UniversalClient { return sen.Client(t) },
		observer:     tl.observe,
		opts:         []throttle.Option{throttle.WithFailureDelay(time.Second)},
	})
	require.NoError(t, throttle.NewLimiter(sen.Client(t)).SetLimits(context.Background(), "crm", faultLimit()))
	f.enqueue("crm", "job", 300)

	require.Eventually(t, func() bool { return f.rec.count() >= 100 }, 30*time.Second, 5*time.Millisecond)
	old := redis.NewClient(&redis.Options{Addr: sen.Master(t)})
	t.Cleanup(func() { _ = old.Close() })
	ctx := context.Background()
	oldBefore, err := scriptRuns(ctx, old)
	require.NoError(t, err)
	pr := startProber(t, sen.Client(t), "probe")
	wait := watchFailover(t, sen.Replica(t), "crm", "probe")
	start := time.Now()
	from, to := sen.Failover(t)
	agreed := time.Now()
	w := wait(15 * time.Second)
	pr.end()

	f.waitDone(300, 60*time.Second)
	found := f.audit(300)
	oldAfter, err := scriptRuns(ctx, old)
	require.NoError(t, err)
	busiest, excess := excessOver(f.rec.times("crm"), faultBound)
	t.Logf("FIGURE sentinel-failover: %v; promoted %s after SENTINEL FAILOVER, Sentinels agreed after %s; first decision on the new master after the promotion: a Limiter taking every 10 ms %s (%d errors, longest between two decisions %v), the fleet %s (%s after the Sentinels agreed); %d script runs on the old master after SENTINEL FAILOVER (their writes lost); max in 1s window %d (bound %d, excess %d, allowed %d); %v (%s -> %s)",
		found, seconds(start, w.promoted), seconds(start, agreed), seconds(w.promoted, w.changed["probe"]), pr.errs, pr.longest.Round(time.Millisecond),
		seconds(w.promoted, w.changed["crm"]), seconds(agreed, w.changed["crm"]), oldAfter-oldBefore, busiest, faultBound, excess, faultBurst, tl.counts(), from, to)
	decisionsBack(t, w, "probe", agreed)
	assert.LessOrEqual(t, excess, faultBurst, "admissions over the bound across the failover: at most one burst")
}

// Cluster failover mid-drain: tasks and limits both on a 3-master Cluster
// with one replica each; CLUSTER FAILOVER moves the masters of the
// limiter's key and of asynq's queue to their replicas while 3 servers drain
// 300 tasks. A manual failover loses no acknowledged write, so every task
// runs exactly once and the bound holds.
func TestFaultClusterFailoverRunsEveryTaskOnce(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterWithReplicas(t)
	tl := &timeline{}
	f := startFleet(t, fleetConfig{
		tasks:    func(t *testing.T) redis.UniversalClient { return c.Client(t) },
		observer: tl.observe,
		opts:     []throttle.Option{throttle.WithFailureDelay(time.Second)},
	})
	f.setLimits("crm", faultLimit())
	f.enqueue("crm", "job", 300)

	const limitKey, queueKey = "throttle:{crm}:cfg", "asynq:{default}:pending"
	keyMaster, keyReplica := c.SlotNodes(t, limitKey)
	queueMaster, _ := c.SlotNodes(t, queueKey)
	require.Eventually(t, func() bool { return f.rec.count() >= 100 }, 30*time.Second, 5*time.Millisecond)
	probeKey := ""
	for i := 0; probeKey == ""; i++ { // a key served by the same master
		if m, _ := c.SlotNodes(t, fmt.Sprintf("{probe-%d}", i)); m == keyMaster {
			probeKey = fmt.Sprintf("probe-%d", i)
		}
	}
	pr := startProber(t, c.Client(t), probeKey)
	wait := watchFailover(t, keyReplica, "crm", probeKey)
	start := time.Now()
	from, to := c.Failover(t, limitKey)
	require.Equal(t, keyMaster, from)
	settled := time.Now()
	if queueMaster != keyMaster {
		c.Failover(t, queueKey)
	}
	w := wait(15 * time.Second)
	pr.end()

	f.waitDone(300, 60*time.Second)
	found := f.audit(300)
	busiest, excess := excessOver(f.rec.times("crm"), faultBound)
	t.Logf("FIGURE cluster-failover: %v; promoted %s after CLUSTER FAILOVER, cluster settled after %s; first decision on the new master after the promotion: a Limiter taking every 10 ms %s (%d errors, longest between two decisions %v), the fleet %s (%s after the cluster settled); max in 1s window %d (bound %d, excess %d); queue's master failed over too: %v; %v (%s -> %s)",
		found, seconds(start, w.promoted), seconds(start, settled), seconds(w.promoted, w.changed[probeKey]), pr.errs, pr.longest.Round(time.Millisecond),
		seconds(w.promoted, w.changed["crm"]), seconds(settled, w.changed["crm"]), busiest, faultBound, excess, queueMaster != keyMaster, tl.counts(), from, to)
	decisionsBack(t, w, probeKey, settled)
	assert.LessOrEqual(t, excess, faultBurst, "admissions over the bound across the failover: at most one burst")
}

// A paused Redis: the limiter's Redis stops answering for 3 s, by CLIENT
// PAUSE 3000 ALL (it reads commands but runs none) or by SIGSTOP/SIGCONT
// (sockets open, no answer). Every decision returns within WithTimeout, the
// failure policy decides (FailClosed defers, FailOpen runs), and every task
// runs exactly once.
func TestFaultPausedRedisLeavesDecisionsToTheFailurePolicy(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	// Each pause returns a time after it took effect and one before it
	// could end: Redis answers again at once, and tasks it then admits start
	// within a millisecond or two, while the test goroutine may wait longer
	// than that for a CPU on a loaded machine before it reads the clock.
	pauses := []struct {
		name  string
		pause func(t *testing.T, s *redistest.Server) (from, to time.Time)
	}{
		{"CLIENT PAUSE", func(t *testing.T, s *redistest.Server) (time.Time, time.Time) {
			sent := time.Now() // Redis pauses from when it runs the command, not before
			require.NoError(t, s.Client(t).Do(context.Background(), "CLIENT", "PAUSE", 3000, "ALL").Err())
			from := time.Now()
			time.Sleep(3 * time.Second) // the pause, ended by Redis
			return from, sent.Add(3 * time.Second)
		}},
		{"SIGSTOP", func(t *testing.T, s *redistest.Server) (time.Time, time.Time) {
			s.Pause(t)
			from := time.Now()
			time.Sleep(3 * time.Second) // the pause
			to := time.Now()
			s.Resume(t)
			return from, to
		}},
	}
	for _, p := range pauses {
		for _, failOpen := range []bool{false, true} {
			t.Run(p.name+"/"+policyName(failOpen), func(t *testing.T) {
				t.Parallel()
				limits := redistest.Start(t)
				tl, pr := &timeline{}, newProbe()
				f := startFleet(t, fleetConfig{
					limits:   limits,
					observer: tl.observe,
					wrap:     pr.middleware,
					opts: append([]throttle.Option{
						throttle.WithTimeout(timeout),
						throttle.WithFailureDelay(time.Second),
					}, failOpenOption(failOpen)...),
				})
				require.NoError(t, throttle.NewLimiter(limits.Client(t)).SetLimits(context.Background(), "crm", faultLimit()))
				f.enqueue("crm", "job", 200)
				require.Eventually(t, func() bool { return f.rec.count() >= 40 }, 30*time.Second, 5*time.Millisecond)
				lag := redistest.StartLagMeter()
				pausedAt, resumedAt := p.pause(t, limits)

				f.waitDone(200, 60*time.Second)
				lagged := lag.End()
				found := f.audit(200)
				longest, n := tl.longestDecision()
				c := tl.counts()
				ts := f.rec.times("crm")
				busiest, _ := excessOver(ts, faultBound)
				// Tasks that reached the middleware during the pause and ran
				// during it. (Tasks admitted just before the pause may start
				// during it: on tokens their process leased then, or at a
				// paced slot a moment ahead.)
				during := 0
				f.rec.mu.Lock()
				for job, runs := range f.rec.runs {
					entered, _ := pr.lastEntry(f.rec.ids[job])
					if len(runs) > 0 && runs[0].After(pausedAt) && runs[0].Before(resumedAt) && entered.After(pausedAt.Add(50*time.Millisecond)) {
						during++
					}
				}
				f.rec.mu.Unlock()
				t.Logf("FIGURE paused %s %s: longest decision %v of %d (WithTimeout %v; the process woke up to %v late meanwhile); %v; decided and ran during the %.1fs pause %d (after its first 50 ms); max in 1s window %d (bound %d); %v",
					p.name, policyName(failOpen), longest.Round(time.Millisecond), n, timeout, lagged.Round(time.Millisecond), c, resumedAt.Sub(pausedAt).Seconds(), during, busiest, faultBound, found)
				// A decision ends at WithTimeout, and returns once its
				// goroutine gets a CPU again: as late as the process woke.
				assert.Less(t, longest, timeout+500*time.Millisecond+lagged, "a decision outlived WithTimeout (the pause lasted 3 s), beyond the process's own lag")
				if !failOpen {
					assert.Positive(t, c.failedClosed, "FailClosed deferred no task while Redis was paused")
					assert.Zero(t, c.failedOpen)
					assert.Zero(t, during, "FailClosed ran tasks while Redis was paused")
					assert.LessOrEqual(t, busiest, faultBound, "FailClosed keeps the bound")
				} else {
					assert.Positive(t, c.failedOpen, "FailOpen ran no task while Redis was paused")
					assert.Zero(t, c.failedClosed)
				}
			})
		}
	}
}

// failOpenOption is WithFailOpen when failOpen, else nothing.
func failOpenOption(failOpen bool) []throttle.Option {
	if failOpen {
		return []throttle.Option{throttle.WithFailOpen()}
	}
	return nil
}
