// End-to-end tests: real redis-server processes, fleets of real asynq
// servers, a real asynq.Client, every task audited through asynq.Inspector.
package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// recorder notes every handler run by job (the task payload).
type recorder struct {
	mu    sync.Mutex
	runs  map[string][]time.Time // job -> start times of successful runs
	ids   map[string]string      // job -> task ID it succeeded under
	all   []time.Time            // every successful run start, any job
	byKey map[string][]time.Time
}

func newRecorder() *recorder {
	return &recorder{runs: map[string][]time.Time{}, ids: map[string]string{}, byKey: map[string][]time.Time{}}
}

func (r *recorder) done(ctx context.Context, t *asynq.Task, start time.Time) {
	id, _ := asynq.GetTaskID(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	job := string(t.Payload())
	r.runs[job] = append(r.runs[job], start)
	r.ids[job] = id
	r.all = append(r.all, start)
	k := t.Headers()[throttle.HeaderKey]
	r.byKey[k] = append(r.byKey[k], start)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

func (r *recorder) times(key string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.byKey[key])
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// maxInWindow is the most events in any half-open window [t, t+w).
func maxInWindow(ts []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

func countIn(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// events counts middleware events by job and outcome.
type events struct {
	mu       sync.Mutex
	byJob    map[string]map[throttle.Outcome]int
	copied   atomic.Int64
	deferred atomic.Int64
}

func newEvents() *events { return &events{byJob: map[string]map[throttle.Outcome]int{}} }

func (e *events) observe(job func(id string) string) func(throttle.Event) {
	return func(ev throttle.Event) {
		if ev.Copied {
			e.copied.Add(1)
		}
		if ev.Outcome == throttle.Deferred || ev.Outcome == throttle.Suspended {
			e.deferred.Add(1)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		j := job(ev.TaskID)
		if e.byJob[j] == nil {
			e.byJob[j] = map[throttle.Outcome]int{}
		}
		e.byJob[j][ev.Outcome]++
	}
}

type fleet struct {
	t       *testing.T
	redis   *redistest.Server // the tasks' Redis; nil when fleetConfig.tasks gave the clients
	rdb     redis.UniversalClient
	client  *asynq.Client
	insp    *asynq.Inspector
	rec     *recorder
	ev      *events
	jobOfID sync.Map // task ID -> job, filled at enqueue and by copies
	fc      fleetConfig
}

type fleetConfig struct {
	servers     int
	concurrency int
	plain       bool // plain asynq.Server instead of worker.NewServer
	cfg         asynq.Config
	opts        []throttle.Option
	handler     func(ctx context.Context, t *asynq.Task) error // nil: succeed
	limits      *redistest.Server                              // limiter's Redis, when not the tasks' one

	// tasks, when set, makes the clients of the tasks' Redis (one per
	// server, one for the test's asynq client and inspector) instead of a
	// fresh redistest.Start: a persistent server, a Cluster.
	tasks func(t *testing.T) redis.UniversalClient
	// limitsClient, when set, makes each server's limiter client (wins
	// over limits): a Sentinel failover client, say.
	limitsClient func(t *testing.T) redis.UniversalClient
	// observer, when set, sees every middleware event after the fleet's own.
	observer func(throttle.Event)
	// wrap, when set, is installed before (outside) the throttle middleware.
	wrap asynq.MiddlewareFunc
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func startFleet(t *testing.T, fc fleetConfig) *fleet {
	t.Helper()
	f := &fleet{t: t, rec: newRecorder(), ev: newEvents()}
	if fc.tasks == nil {
		f.redis = redistest.Start(t)
		fc.tasks = func(t *testing.T) redis.UniversalClient { return f.redis.Client(t) }
	}
	f.rdb = fc.tasks(t)
	f.client = asynq.NewClientFromRedisClient(f.rdb)
	f.insp = asynq.NewInspectorFromRedisClient(f.rdb)
	if fc.servers == 0 {
		fc.servers = 3
	}
	if fc.concurrency == 0 {
		fc.concurrency = 10
	}
	f.fc = fc
	for range fc.servers {
		f.addServer()
	}
	return f
}

// addServer starts one more server of the fleet (another process, as far
// as Redis can tell): a fresh asynq.Server, its Limiter and middleware.
func (f *fleet) addServer() {
	t, fc := f.t, f.fc
	rdb := fc.tasks(t) // one connection pool per server, as separate processes
	cfg := fc.cfg
	cfg.Concurrency = fc.concurrency
	cfg.LogLevel = asynq.FatalLevel
	cfg.ShutdownTimeout = 2 * time.Second
	if fc.plain && cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = time.Second // (worker.NewServer sets its own)
	}
	var srv *asynq.Server
	if fc.plain {
		srv = asynq.NewServerFromRedisClient(rdb, cfg)
	} else {
		srv = worker.NewServer(rdb, cfg)
	}
	observe := f.ev.observe(f.job)
	if fc.observer != nil {
		own := observe
		observe = func(ev throttle.Event) { own(ev); fc.observer(ev) }
	}
	opts := append([]throttle.Option{throttle.WithLogger(quiet)}, fc.opts...)
	limits := redis.UniversalClient(rdb)
	switch {
	case fc.limitsClient != nil:
		limits = fc.limitsClient(t)
	case fc.limits != nil:
		limits = redis.NewClient(&redis.Options{Addr: fc.limits.Addr, MaxRetries: -1})
		t.Cleanup(func() { limits.Close() })
	}
	mux := asynq.NewServeMux()
	if fc.wrap != nil {
		mux.Use(fc.wrap)
	}
	lim := throttle.NewLimiter(limits, opts...)
	lim.OnEvent(observe)
	mux.Use(lim.Middleware())
	mux.HandleFunc("sync:", func(ctx context.Context, task *asynq.Task) error {
		start := time.Now()
		if fc.handler != nil {
			if err := fc.handler(ctx, task); err != nil {
				return err
			}
		}
		f.rec.done(ctx, task, start)
		return nil
	})
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
}

// job maps a task ID (or a deferred copy's ID) to the job it runs.
func (f *fleet) job(id string) string {
	if j, ok := f.jobOfID.Load(id); ok {
		return j.(string)
	}
	// Copies are named <origin>~throttle-<n>.
	for i := range len(id) {
		if id[i] == '~' {
			return f.job(id[:i])
		}
	}
	return id
}

// enqueue enqueues n jobs named prefix-i under key and returns their task IDs.
func (f *fleet) enqueue(key, prefix string, n int, opts ...asynq.Option) []string {
	f.t.Helper()
	ids := make([]string, n)
	for i := range n {
		job := fmt.Sprintf("%s-%d", prefix, i)
		o := append([]asynq.Option{throttle.Key(key), asynq.Retention(time.Hour)}, opts...)
		info, err := f.client.Enqueue(newTask(f.t, "sync:"+key, []byte(job), o...))
		require.NoError(f.t, err)
		ids[i] = info.ID
		f.jobOfID.Store(info.ID, job)
	}
	return ids
}

func (f *fleet) waitDone(n int, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for f.rec.count() < n {
		if time.Now().After(deadline) {
			q, _ := f.insp.GetQueueInfo("default")
			f.t.Fatalf("only %d of %d jobs done after %v; queue: %+v", f.rec.count(), n, within, q)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Let late duplicates (there must be none) show up.
	time.Sleep(200 * time.Millisecond)
}

// auditCounts is what an audit found: jobs never done, tasks archived, and
// extra runs of jobs done more than once.
type auditCounts struct{ lost, archived, duplicates int }

func (c auditCounts) String() string {
	return fmt.Sprintf("lost %d archived %d duplicates %d", c.lost, c.archived, c.duplicates)
}

// audit checks every job ran exactly once and nothing is archived, pending
// or failed in asynq, and returns what it found.
func (f *fleet) audit(jobs int) auditCounts {
	f.t.Helper()
	var c auditCounts
	f.rec.mu.Lock()
	for job, runs := range f.rec.runs {
		assert.Len(f.t, runs, 1, "job %s ran %d times", job, len(runs))
		c.duplicates += max(0, len(runs)-1)
	}
	assert.Len(f.t, f.rec.runs, jobs, "distinct jobs done")
	c.lost = max(0, jobs-len(f.rec.runs))
	f.rec.mu.Unlock()
	q := f.queueInfo()
	assert.Zero(f.t, q.Pending+q.Active+q.Scheduled+q.Retry, "tasks left in the queue: %+v", q)
	c.archived = f.auditArchive(q)
	return c
}

func (f *fleet) queueInfo() *asynq.QueueInfo {
	f.t.Helper()
	q, err := f.insp.GetQueueInfo("default")
	require.NoError(f.t, err)
	return q
}

// auditArchive checks that q holds no archived task, names each one found,
// and returns how many there are.
func (f *fleet) auditArchive(q *asynq.QueueInfo) int {
	f.t.Helper()
	assert.Zero(f.t, q.Archived, "archived tasks")
	archived, err := f.insp.ListArchivedTasks("default")
	require.NoError(f.t, err)
	for _, a := range archived {
		f.t.Errorf("archived: %s %s: %s", a.ID, a.Payload, a.LastErr)
	}
	return q.Archived
}

func (f *fleet) setLimits(key string, limits ...throttle.Limit) {
	f.t.Helper()
	require.NoError(f.t, throttle.NewLimiter(f.rdb).SetLimits(context.Background(), key, limits...))
}

// 300 tasks at 50/s burst 10 across three servers: never more than 60 in any
// second, each task succeeds exactly once under its own ID, and throttling
// shows in no statistic and no retry count.
func TestE2EFleetHoldsTheLimit(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{})
	f.setLimits("crm", throttle.PerSecond(50).WithBurst(10))
	lag := redistest.StartLagMeter()
	ids := f.enqueue("crm", "job", 300)
	f.waitDone(300, 90*time.Second)
	lagged := lag.End()
	f.audit(300)

	ts := f.rec.times("crm")
	// The bound is on decisions; a handler starts up to the process's lag
	// later (see TestE2EBurstBelowTheRateDrainsAtTheRate).
	late := int(math.Ceil(50 * lagged.Seconds()))
	assert.LessOrEqual(t, maxInWindow(ts, time.Second), 60+late, "executions in a 1 s window (process lag %v)", lagged)
	t.Logf("300 tasks in %v, %d deferrals", ts[len(ts)-1].Sub(ts[0]), f.ev.deferred.Load())
	assert.Positive(t, f.ev.deferred.Load(), "the limit never bound: the test proves nothing")
	assert.Zero(t, f.ev.copied.Load(), "worker.NewServer deferrals must use the retry path")

	q, err := f.insp.GetQueueInfo("default")
	require.NoError(t, err)
	assert.Equal(t, 300, q.ProcessedTotal, "processed counts only the real runs")
	assert.Zero(t, q.FailedTotal, "deferrals counted as failures")
	for _, id := range ids {
		info, err := f.insp.GetTaskInfo("default", id)
		require.NoError(t, err, "task %s not found under the ID it was enqueued with", id)
		assert.Equal(t, asynq.TaskStateCompleted, info.State, id)
		assert.Zero(t, info.Retried, "retry count of %s spent by throttling", id)
	}
	f.rec.mu.Lock()
	for i, id := range ids {
		assert.Equal(t, id, f.rec.ids[fmt.Sprintf("job-%d", i)], "job-%d ran under another ID", i)
	}
	f.rec.mu.Unlock()
}

// Tasks asynq would archive on a throttling error (MaxRetry(0), or on their
// last attempt) are deferred by copy and all complete.
func TestE2EArchiveTrapTasksAreDeferredByCopy(t *testing.T) {
	t.Parallel()
	var failedOnce sync.Map
	f := startFleet(t, fleetConfig{
		// Failed tasks wait in the retry set until the test runs them.
		cfg: asynq.Config{RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }},
		handler: func(ctx context.Context, task *asynq.Task) error {
			job := string(task.Payload())
			if job[:4] == "last" {
				if _, seen := failedOnce.LoadOrStore(job, true); !seen {
					return errors.New("transient failure: spend the only retry")
				}
			}
			return nil
		},
	})
	f.setLimits("erp", throttle.PerSecond(20))
	lim := throttle.NewLimiter(f.rdb)
	ctx := context.Background()

	// The "last" tasks fail once (their only retry), then come back on their
	// last attempt into a suspension.
	f.enqueue("erp", "last", 50, asynq.MaxRetry(1))
	require.Eventually(t, func() bool {
		q, err := f.insp.GetQueueInfo("default")
		return err == nil && q.FailedTotal == 50 && q.Retry == 50
	}, 20*time.Second, 20*time.Millisecond)
	// Suspended until every task has met the suspension (a fixed 3 s ran
	// out before a loaded machine had dequeued them all), then resumed.
	require.NoError(t, lim.Suspend(ctx, "erp", time.Minute))
	n, err := f.insp.RunAllRetryTasks("default")
	require.NoError(t, err)
	require.Equal(t, 50, n)
	f.enqueue("erp", "zero", 50, asynq.MaxRetry(0))
	require.Eventually(t, func() bool {
		f.ev.mu.Lock()
		defer f.ev.mu.Unlock()
		met := 0
		for _, outcomes := range f.ev.byJob {
			if outcomes[throttle.Deferred]+outcomes[throttle.Suspended] > 0 {
				met++
			}
		}
		return met == 100
	}, 40*time.Second, 20*time.Millisecond, "every task deferred by the suspension")
	_, err = lim.Resume(ctx, "erp")
	require.NoError(t, err)

	f.waitDone(100, 60*time.Second)
	f.audit(100)
	f.ev.mu.Lock()
	for job, outcomes := range f.ev.byJob {
		assert.Positive(t, outcomes[throttle.Deferred]+outcomes[throttle.Suspended], "job %s was never throttled", job)
	}
	f.ev.mu.Unlock()
	assert.GreaterOrEqual(t, f.ev.copied.Load(), int64(100), "every trapped task deferred by copy")
}

// Under a plain asynq.Server (only mux.Use), deferrals re-enqueue copies:
// nothing is archived or failed, every job runs once.
func TestE2EPlainServerDefersByCopy(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{plain: true})
	f.setLimits("crm", throttle.PerSecond(25))
	require.NoError(t, throttle.NewLimiter(f.rdb).Suspend(context.Background(), "crm", 2*time.Second))
	f.enqueue("crm", "job", 100)
	f.waitDone(100, 60*time.Second)
	f.audit(100)
	q, err := f.insp.GetQueueInfo("default")
	require.NoError(t, err)
	assert.Zero(t, q.FailedTotal)
	assert.GreaterOrEqual(t, f.ev.copied.Load(), int64(100))
}

// A handler's RateLimited stops its key on every server for the suspension,
// while another key keeps running on the same servers.
func TestE2ERateLimitedSuspendsTheFleet(t *testing.T) {
	t.Parallel()
	var (
		once      sync.Once
		limitedAt atomic.Int64
		mu        sync.Mutex
		admitted  []time.Time // slack's admissions (Ran events), by any server
	)
	f := startFleet(t, fleetConfig{handler: func(ctx context.Context, task *asynq.Task) error {
		if string(task.Payload()) == "slack-20" {
			var err error
			once.Do(func() {
				limitedAt.Store(time.Now().UnixNano())
				err = throttle.RateLimited(3 * time.Second)
			})
			return err
		}
		time.Sleep(5 * time.Millisecond) // a short API call
		return nil
	}, observer: func(ev throttle.Event) {
		if ev.Key == "slack" && ev.Outcome == throttle.Ran {
			mu.Lock()
			admitted = append(admitted, time.Now())
			mu.Unlock()
		}
	}})
	f.setLimits("slack", throttle.PerSecond(40))
	f.setLimits("github", throttle.PerSecond(40))
	f.enqueue("slack", "slack", 150)
	f.enqueue("github", "github", 150)
	f.waitDone(300, 60*time.Second)
	f.audit(300)

	require.NotZero(t, limitedAt.Load(), "the rate-limited task never ran")
	t0 := time.Unix(0, limitedAt.Load())
	// No server admits slack from a moment after the 429 until the
	// suspension ends. Tasks admitted before it was written may still start
	// a moment after: at once, or (paced, admitted ahead) in a server that
	// has not seen the suspension yet, at their instant, up to about 1.2 s
	// on (the server that got the 429 stops its own), a timer's lateness
	// more; from then on, nothing until it ends.
	from, to := t0.Add(100*time.Millisecond), t0.Add(3*time.Second)
	mu.Lock()
	assert.Zero(t, countIn(admitted, from, to), "slack admitted during its suspension")
	mu.Unlock()
	assert.Zero(t, countIn(f.rec.times("slack"), t0.Add(1500*time.Millisecond), to), "slack ran during its suspension")
	assert.Positive(t, countIn(f.rec.times("github"), from, to), "github stopped during slack's suspension")
	f.ev.mu.Lock()
	assert.Equal(t, 1, f.ev.byJob["slack-20"][throttle.Suspended])
	f.ev.mu.Unlock()
}

// Lowering the limit mid-run takes effect from the next decision.
func TestE2ELoweredLimitAppliesFromTheNextDecision(t *testing.T) {
	t.Parallel()
	// When each admission was seen (the middleware's Ran event comes right
	// after its decision, before the handler): a handler that starts late
	// on a loaded machine is no admission under the new limit.
	var mu sync.Mutex
	var admitted []time.Time
	f := startFleet(t, fleetConfig{observer: func(ev throttle.Event) {
		if ev.Outcome == throttle.Ran {
			mu.Lock()
			admitted = append(admitted, time.Now())
			mu.Unlock()
		}
	}})
	f.setLimits("crm", throttle.PerSecond(50))
	f.enqueue("crm", "job", 250)
	require.Eventually(t, func() bool { return f.rec.count() >= 110 }, 20*time.Second, 10*time.Millisecond)
	f.setLimits("crm", throttle.PerSecond(5))
	changed := time.Now()
	// Observe the new rate. (Admissions made ahead under the old limit, at
	// paced instants up to a second on, are a debt the new one repays
	// first: the first seconds may see none.)
	time.Sleep(6 * time.Second)
	mu.Lock()
	ts := slices.Clone(admitted)
	mu.Unlock()
	before := countIn(ts, changed.Add(-2*time.Second), changed)
	after := countIn(ts, changed, changed.Add(6*time.Second))
	t.Logf("2 s before the change: %d admitted; 6 s after: %d admitted", before, after)
	assert.Greater(t, before, 40, "the old limit (50/s) was not in force before the change")
	assert.LessOrEqual(t, after, 5+5*6+1, "admitted after lowering to 5/s burst 5")
	assert.Positive(t, after, "nothing ran after the change")
}

// A raised limit reaches the backlog already deferred: the tasks waiting
// for slots spaced under the old limit are brought back and decided under
// the new one. (Regression: after raising 4/s to 8/s mid-drain, about 150
// deferred tasks kept their old times and the drain stayed at 4/s.)
func TestE2ERaisedLimitReachesTheDeferredBacklog(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{})
	f.setLimits("crm", throttle.PerSecond(4))
	f.enqueue("crm", "job", 60)
	require.Eventually(t, func() bool { return f.rec.count() >= 8 }, 20*time.Second, 10*time.Millisecond)
	lim := throttle.NewLimiter(f.rdb)
	st, err := lim.Inspect(context.Background(), "crm")
	require.NoError(t, err)
	require.Greater(t, st.Reservations, 30, "the backlog holds reservations at 4/s")
	f.setLimits("crm", throttle.PerSecond(30))
	changed := time.Now()
	left := 60 - f.rec.count()
	f.waitDone(60, 30*time.Second)
	took := time.Since(changed)
	t.Logf("%d tasks left at the change ran in %v (at 4/s: %v)", left, took, time.Duration(left)*time.Second/4)
	assert.Less(t, took, time.Duration(left)*time.Second/4/2, "the rest of the backlog drained at the raised limit")
	f.audit(60)
	// Limits set again as they are change nothing: not the queue.
	f.enqueue("crm", "more", 60)
	require.Eventually(t, func() bool {
		st, err := lim.Inspect(context.Background(), "crm")
		return err == nil && st.Reservations > 10
	}, 10*time.Second, 10*time.Millisecond)
	st, err = lim.Inspect(context.Background(), "crm")
	require.NoError(t, err)
	f.setLimits("crm", throttle.PerSecond(30))
	again, err := lim.Inspect(context.Background(), "crm")
	require.NoError(t, err)
	assert.Equal(t, st.Generation, again.Generation, "the generation of limits set as they are")
	assert.Positive(t, again.Reservations, "the reservation queue of limits set as they are")
	f.waitDone(120, 30*time.Second)
}

// The user's IsFailure, RetryDelayFunc and ErrorHandler still apply to
// ordinary errors, and never see deferrals.
func TestE2EUserConfigStillApplies(t *testing.T) {
	t.Parallel()
	errNotFailure := errors.New("benign: not a failure")
	errFailure := errors.New("real failure")
	var (
		handled  sync.Map // error text -> count
		delays   atomic.Int64
		attempts sync.Map
	)
	f := startFleet(t, fleetConfig{
		cfg: asynq.Config{
			IsFailure: func(err error) bool { return !errors.Is(err, errNotFailure) },
			RetryDelayFunc: func(n int, err error, task *asynq.Task) time.Duration {
				delays.Add(1)
				return time.Second
			},
			ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, task *asynq.Task, err error) {
				v, _ := handled.LoadOrStore(err.Error(), new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}),
		},
		handler: func(ctx context.Context, task *asynq.Task) error {
			job := string(task.Payload())
			v, _ := attempts.LoadOrStore(job, new(atomic.Int64))
			switch n := v.(*atomic.Int64).Add(1); {
			case job == "job-0" && n == 1:
				return errNotFailure
			case job == "job-1" && n == 1:
				return errFailure
			}
			return nil
		},
	})
	f.setLimits("crm", throttle.PerSecond(10))
	require.NoError(t, throttle.NewLimiter(f.rdb).Suspend(context.Background(), "crm", time.Second))
	ids := f.enqueue("crm", "job", 30)
	f.waitDone(30, 30*time.Second)
	f.audit(30)

	count := func(s string) int64 {
		v, ok := handled.Load(s)
		if !ok {
			return 0
		}
		return v.(*atomic.Int64).Load()
	}
	assert.Equal(t, int64(1), count(errNotFailure.Error()), "ErrorHandler for the benign error")
	assert.Equal(t, int64(1), count(errFailure.Error()), "ErrorHandler for the real failure")
	n := 0
	handled.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 2, n, "ErrorHandler saw something other than the two errors (a deferral?)")
	assert.Equal(t, int64(2), delays.Load(), "user RetryDelayFunc called for the two errors only")
	assert.Positive(t, f.ev.deferred.Load())

	info0, err := f.insp.GetTaskInfo("default", ids[0])
	require.NoError(t, err)
	assert.Zero(t, info0.Retried, "user IsFailure said the benign error is not a failure")
	info1, err := f.insp.GetTaskInfo("default", ids[1])
	require.NoError(t, err)
	assert.Equal(t, 1, info1.Retried, "a real failure spends a retry")
}

// When the limiter's Redis is down, FailOpen runs tasks unthrottled and
// FailClosed defers them (retry count untouched) until Redis is back.
func TestE2ERedisDownAppliesTheFailurePolicy(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{true, false} {
		t.Run(policyName(failOpen), func(t *testing.T) {
			limits := redistest.Start(t)
			opts := []throttle.Option{
				throttle.WithFailureDelay(time.Second),
				throttle.WithTimeout(200 * time.Millisecond),
				throttle.WithDefaultLimits(throttle.PerSecond(100)),
			}
			if failOpen {
				opts = append(opts, throttle.WithFailOpen())
			}
			f := startFleet(t, fleetConfig{limits: limits, opts: opts})
			limits.Stop()
			ids := f.enqueue("crm", "job", 20)
			if !failOpen {
				require.Eventually(t, func() bool { return f.ev.deferred.Load() == 0 && countFailed(f) >= 20 },
					10*time.Second, 20*time.Millisecond)
				assert.Zero(t, f.rec.count(), "a task ran while the limiter could not decide (fail closed)")
				limits.Restart(t)
			}
			f.waitDone(20, 30*time.Second)
			f.audit(20)
			for _, id := range ids {
				info, err := f.insp.GetTaskInfo("default", id)
				require.NoError(t, err)
				assert.Zero(t, info.Retried, "%s: retry spent by a Redis outage", id)
			}
			assert.GreaterOrEqual(t, countFailed(f), 20, "failed decisions observed")
		})
	}
}

func countFailed(f *fleet) int {
	f.ev.mu.Lock()
	defer f.ev.mu.Unlock()
	n := 0
	for _, o := range f.ev.byJob {
		n += o[throttle.Failed]
	}
	return n
}

// A suspended key costs no Redis call per task: once a process has been told
// the suspension (without a reserved slot), it defers the key's tasks itself
// until it is over, checking Redis again at most every few seconds.
func TestE2ESuspendedKeyCostsNoCallPerTask(t *testing.T) {
	t.Parallel()
	limits := redistest.Start(t)
	f := startFleet(t, fleetConfig{limits: limits, opts: []throttle.Option{throttle.WithReservationHorizon(0)}})
	lrdb := limits.Client(t)
	lim := throttle.NewLimiter(lrdb)
	ctx := context.Background()
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(200)))
	require.NoError(t, lim.Suspend(ctx, "crm", 4*time.Second))
	require.NoError(t, lrdb.ConfigResetStat(ctx).Err())

	f.enqueue("crm", "job", 150)
	require.Eventually(t, func() bool { return f.ev.deferred.Load() >= 150 }, 10*time.Second, 10*time.Millisecond)
	stats, err := lrdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	calls := evalCalls(stats)
	t.Logf("150 tasks deferred by a suspension with %d decisions in Redis", calls)
	// Only the decisions already in the air when each server first hears of
	// the suspension (at most its concurrency) reach Redis.
	assert.LessOrEqual(t, calls, 3*10, "decisions in Redis for 150 tasks of a suspended key (3 servers x 10)")

	f.waitDone(150, 40*time.Second)
	f.audit(150)
}

// evalCalls sums the script runs (FCALL, EVALSHA, EVAL) in an INFO
// commandstats reply.
func evalCalls(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") || strings.HasPrefix(line, "cmdstat_fcall:") {
			var c int
			if _, err := fmt.Sscanf(line[strings.IndexByte(line, ':')+1:], "calls=%d", &c); err == nil {
				n += c
			}
		}
	}
	return n
}

// A key without limits costs no Redis call per task either: the process
// remembers the answer for a few seconds and runs the tasks unthrottled.
func TestE2EKeyWithoutLimitsCostsNoCallPerTask(t *testing.T) {
	t.Parallel()
	limits := redistest.Start(t)
	f := startFleet(t, fleetConfig{limits: limits})
	lrdb := limits.Client(t)
	require.NoError(t, lrdb.ConfigResetStat(context.Background()).Err())
	f.enqueue("nolimit", "job", 200)
	f.waitDone(200, 30*time.Second)
	f.audit(200)
	stats, err := lrdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := evalCalls(stats)
	t.Logf("200 tasks of a key without limits with %d decisions in Redis", calls)
	assert.LessOrEqual(t, calls, 3*10, "decisions in Redis for 200 tasks of a key without limits (3 servers x 10)")
	f.ev.mu.Lock()
	defer f.ev.mu.Unlock()
	for job, o := range f.ev.byJob {
		assert.Equal(t, 1, o[throttle.Unthrottled], "job %s", job)
	}
}

// On a busy key far from its limit, one decision leases a few tokens to its
// process, which runs its next tasks of that key without asking Redis.
func TestE2ELeaseSavesDecisions(t *testing.T) {
	t.Parallel()
	limits := redistest.Start(t)
	f := startFleet(t, fleetConfig{limits: limits})
	lrdb := limits.Client(t)
	lim := throttle.NewLimiter(lrdb)
	ctx := context.Background()
	// A big burst that refills slowly (about one token a day), so the tokens
	// taken can be counted however long a loaded machine takes.
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.Limit{N: 1, Per: 24 * time.Hour, Burst: 100_000}))
	require.NoError(t, lrdb.ConfigResetStat(ctx).Err())
	f.enqueue("crm", "job", 300)
	f.waitDone(300, 30*time.Second)
	f.audit(300)
	stats, err := lrdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	calls := evalCalls(stats)
	f.ev.mu.Lock()
	for _, o := range f.ev.byJob {
		if o[throttle.Ran] != 1 {
			t.Errorf("a job ran %d times", o[throttle.Ran])
		}
	}
	f.ev.mu.Unlock()
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	used := 100_000 - st.Tokens[0]
	t.Logf("300 tasks, %d script runs in Redis, %.0f tokens taken", calls, used)
	assert.Less(t, calls, 150, "script runs for 300 tasks far from the limit")
	assert.GreaterOrEqual(t, used, 300.0, "every task's token was taken in Redis")
}

// newTask is throttle.NewTask for options a test knows are valid.
func newTask(t testing.TB, typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	t.Helper()
	task, err := throttle.NewTask(typename, payload, opts...)
	require.NoError(t, err, "NewTask(%q)", typename)
	return task
}

// policyName names the middleware's failure policy for a subtest.
func policyName(failOpen bool) string {
	if failOpen {
		return "fail open"
	}
	return "fail closed"
}
