package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// Scenario M, stacked limits (issue 30's targets): a provider that meters
// every call per workspace AND per app, as Slack does. Two workspace keys
// at PerSecond(10) each under one app key at PerSecond(15); a strict fake
// provider at exactly those quotas (token buckets, burst = rate: a call
// over its workspace's bucket or over the app's gets a 429, and a refused
// call takes from neither); 600 tasks, 300 per workspace, each carrying
// both keys, throttle.Key(workspace, app), the most specific first; a
// fleet of 3 servers x concurrency 8 that runs first.
//
// Two paths: the backlog through the middleware alone (asynq's
// Client.Enqueue) and through Limiter.Enqueue (each task books its run
// time when enqueued). Two backends: the harness's single Redis, and a
// 3-master Redis Cluster it starts, where the three keys are one family
// ({slack}:T1, {slack}:T2, {slack}:app), so one slot, one master: issue
// 30's design (a), colocation by rule.

// Scenario M's fixed shape.
const (
	mWSRate      = 10 // each workspace key and its provider quota, per second (burst the same)
	mAppRate     = 15 // the app key and its provider quota, per second (burst the same)
	mTasks       = 600
	mServers     = 3
	mConcurrency = 8
	mProducers   = 16 // enqueueWith's goroutines
)

// Scenario M's targets (issue 30).
const (
	targetMDrain     = 1.05 // drain over the ideal the binding key sets, at most
	targetMDeferrals = 1.3  // deferrals per task, at most
)

// Scenario M's backends and paths, in the order they run.
const (
	mRedis      = "redis"
	mCluster    = "cluster"
	mMiddleware = "middleware"
	mEnqueue    = "Limiter.Enqueue"
)

// mWorkspaces are the two workspaces: the provider's endpoint of each (the
// task type is "m:" + it).
var mWorkspaces = []string{"T1", "T2"}

// mKeys are the limiter keys of a backend: one per workspace (in
// mWorkspaces' order) and the app's. On the single Redis plain names; on
// the Cluster one family, so that one script can decide over them.
func mKeys(backend string) (ws []string, app string) {
	if backend == mCluster {
		return []string{"{slack}:T1", "{slack}:T2"}, "{slack}:app"
	}
	return []string{"slack:T1", "slack:T2"}, "slack"
}

// mQuota is one key's quota (and its provider meter's): rate per second,
// burst, and the tasks that count against it.
type mQuota struct {
	Key         string
	Rate, Burst int
	Tasks       int
}

// mQuotas are the backend's keys with their quotas and tasks: the
// workspaces, then the app.
func mQuotas(backend string) []mQuota {
	ws, app := mKeys(backend)
	per := mTasks / len(ws)
	out := make([]mQuota, 0, len(ws)+1)
	for _, k := range ws {
		out = append(out, mQuota{Key: k, Rate: mWSRate, Burst: mWSRate, Tasks: per})
	}
	return append(out, mQuota{Key: app, Rate: mAppRate, Burst: mAppRate, Tasks: mTasks})
}

// mIdeal is the drain time the keys allow and the key that sets it: for
// each key its burst at once and the rest of its tasks at its rate; the
// slowest key binds.
func mIdeal(qs []mQuota) (time.Duration, string) {
	var ideal float64
	binding := ""
	for _, q := range qs {
		if t := float64(max(q.Tasks-q.Burst, 0)) / float64(q.Rate); t > ideal || binding == "" {
			ideal, binding = t, q.Key
		}
	}
	return time.Duration(ideal * float64(time.Second)), binding
}

// stackedModel is one workspace's endpoint of a provider that meters per
// workspace and per app (Slack's limits are per workspace per app): a call
// is admitted only when its workspace's bucket and the app's bucket (shared
// by every workspace's endpoint) both hold a token, and then takes one from
// each; a refused call takes from neither and gets a 429 with Retry-After
// (whole seconds, at least 1), as Slack sends. The strict provider serves
// calls one at a time, so the shared bucket needs no lock of its own.
type stackedModel struct {
	ws, app *bucket
	// refusedBy counts the 429s by the quota that refused them ("workspace",
	// "app", "both"); shared by the endpoints of one provider.
	refusedBy map[string]int
}

// newStackedModels makes the endpoints of one run: one per workspace, each
// at wsRate/s (burst wsRate), sharing one app bucket at appRate/s (burst
// appRate), all full at now.
func newStackedModels(workspaces []string, wsRate, appRate int, now time.Time) (map[string]quotaModel, map[string]int) {
	app := &bucket{q: quota{Rate: float64(appRate), Burst: float64(appRate)}, tokens: float64(appRate), last: now}
	refused := map[string]int{}
	models := map[string]quotaModel{}
	for _, w := range workspaces {
		ws := &bucket{q: quota{Rate: float64(wsRate), Burst: float64(wsRate)}, tokens: float64(wsRate), last: now}
		models[w] = &stackedModel{ws: ws, app: app, refusedBy: refused}
	}
	return models, refused
}

// mDecidedHeader carries the instant the provider decided a call (Unix
// nanoseconds), for the lag from the task's admission.
const mDecidedHeader = "X-Bench-Decided"

func (m *stackedModel) serve(now time.Time, h http.Header) bool {
	m.ws.refill(now)
	m.app.refill(now)
	wsOK, appOK := m.ws.tokens >= 1-tokenEps, m.app.tokens >= 1-tokenEps
	if wsOK && appOK {
		m.ws.tokens--
		m.app.tokens--
		h.Set(mDecidedHeader, strconv.FormatInt(now.UnixNano(), 10))
		return true
	}
	h.Set(mDecidedHeader, strconv.FormatInt(now.UnixNano(), 10))
	var wait float64
	switch {
	case !wsOK && !appOK:
		m.refusedBy["both"]++
	case !wsOK:
		m.refusedBy["workspace"]++
	default:
		m.refusedBy["app"]++
	}
	for _, b := range []*bucket{m.ws, m.app} {
		if b.tokens < 1-tokenEps {
			wait = max(wait, (1-b.tokens)/b.q.Rate)
		}
	}
	h.Set("Retry-After", strconv.Itoa(max(int(math.Ceil(wait)), 1)))
	return false
}

// mBackend is where one run's limiter and queue live: a client maker for
// the fleet (a client per server, as separate processes have), a control
// client, how to empty it, and a line saying where the keys are.
type mBackend struct {
	name      string
	newClient func(poolSize int) redis.UniversalClient
	ctl       redis.UniversalClient
	flush     func(ctx context.Context, queue, prefix string) error
	// placement says where the keys' Redis keys are (Cluster: slot and
	// master of each), for the output.
	placement func(ctx context.Context, prefix string, keys []string) string
	stop      func()
}

// singleBackend is the harness's Redis.
func singleBackend(e *env) *mBackend {
	return &mBackend{
		name:      mRedis,
		newClient: func(pool int) redis.UniversalClient { return e.newClient(pool) },
		ctl:       e.ctl,
		flush:     e.cleanup,
		placement: func(context.Context, string, []string) string { return "one Redis: one script decides over every key" },
		stop:      func() {},
	}
}

// clusterBackend starts a 3-master Redis Cluster (internal/redistest) for
// the scenario and stops it with stop.
func clusterBackend() (*mBackend, error) {
	dir, err := os.MkdirTemp("", "asynq-throttle-bench-cluster-")
	if err != nil {
		return nil, err
	}
	c, err := redistest.LaunchCluster(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n(scenario M's Cluster needs redis-server and redis-cli)", err)
	}
	opts := func(pool int) *redis.ClusterOptions {
		return &redis.ClusterOptions{Addrs: slices.Clone(c.Addrs), PoolSize: pool, ContextTimeoutEnabled: true}
	}
	ctl := redis.NewClusterClient(opts(32))
	return &mBackend{
		name:      mCluster,
		newClient: func(pool int) redis.UniversalClient { return redis.NewClusterClient(opts(pool)) },
		ctl:       ctl,
		flush: func(ctx context.Context, _, _ string) error {
			return ctl.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushAll(ctx).Err() })
		},
		placement: func(ctx context.Context, prefix string, keys []string) string {
			return clusterPlacement(ctx, ctl, c.Addrs, prefix, keys)
		},
		stop: func() {
			_ = ctl.Close()
			c.Stop()
			_ = os.RemoveAll(dir)
		},
	}, nil
}

// clusterPlacement names the slot and the master of each key's Redis keys.
func clusterPlacement(ctx context.Context, cc *redis.ClusterClient, addrs []string, prefix string, keys []string) string {
	var parts []string
	masters := map[string]bool{}
	for _, k := range keys {
		rk, err := keyspace.RedisKeys(prefix, k)
		if err != nil {
			return fmt.Sprintf("placement: %v", err)
		}
		slot, err := cc.ClusterKeySlot(ctx, rk.Bucket).Result()
		if err != nil {
			return fmt.Sprintf("placement: CLUSTER KEYSLOT: %v", err)
		}
		node, err := cc.MasterForKey(ctx, rk.Bucket)
		if err != nil {
			return fmt.Sprintf("placement: %v", err)
		}
		addr := node.Options().Addr
		masters[addr] = true
		parts = append(parts, fmt.Sprintf("%s slot %d on %s", k, slot, addr))
	}
	return fmt.Sprintf("3 masters %s; %s: %d master(s) for %d keys", strings.Join(addrs, " "), strings.Join(parts, ", "), len(masters), len(keys))
}

// mLedger records one run's provider calls and each task's first success,
// on the harness's clock since the first enqueue.
type mLedger struct {
	mu    sync.Mutex
	start time.Time
	seen  map[string]int // task "workspace/index" -> successful calls
	last  time.Duration  // the latest first success
	done  int
	// byKey counts deferrals by the key the Event names.
	byKey map[string]int64
	// admitted is when the middleware let each task run (a Ran event's
	// time plus its Wait), by task ID; lag the longest time from there to
	// the provider's decision on its call, late the calls decided later
	// than the middleware's headroom after it, and refusedLags the lags
	// of the calls the provider refused.
	admitted    map[string]time.Time
	lag         time.Duration
	late        int
	refusedLags []time.Duration
}

func newMLedger() *mLedger {
	return &mLedger{seen: map[string]int{}, byKey: map[string]int64{}, admitted: map[string]time.Time{}}
}

func (l *mLedger) event(ev throttle.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ev.Outcome {
	case throttle.Deferred, throttle.Suspended:
		l.byKey[ev.Key]++
	case throttle.Ran:
		if ev.TaskID != "" {
			l.admitted[ev.TaskID] = time.Now().Add(ev.Wait)
		}
	}
}

// arrived notes the lag from the task's admission to the provider's
// decision on its call.
func (l *mLedger) arrived(ctx context.Context, resp *http.Response) {
	id, _ := asynq.GetTaskID(ctx)
	ns, err := strconv.ParseInt(resp.Header.Get(mDecidedHeader), 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.admitted[id]
	if err != nil || !ok {
		return
	}
	delete(l.admitted, id)
	lag := time.Unix(0, ns).Sub(at)
	l.lag = max(l.lag, lag)
	if lag > lHeadroom {
		l.late++
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		l.refusedLags = append(l.refusedLags, lag)
	}
}

func (l *mLedger) record(ws string, idx int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := ws + "/" + strconv.Itoa(idx)
	l.seen[id]++
	if l.seen[id] == 1 {
		l.done++
		l.last = max(l.last, at.Sub(l.start))
	}
}

func (l *mLedger) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// handler is workspace ws's task: one call to its endpoint; a 429 goes to
// throttle.Observe (RateLimited: the task's key is suspended fleet-wide).
func (l *mLedger) handler(sp *strictProvider, ws string) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		idx, err := strconv.Atoi(string(t.Payload()))
		if err != nil {
			return fmt.Errorf("%w: bad payload %q", asynq.SkipRetry, t.Payload())
		}
		at := time.Now()
		resp, err := sp.call(ctx, ws)
		if err != nil {
			return err
		}
		l.arrived(ctx, resp)
		if resp.StatusCode == http.StatusTooManyRequests {
			return throttle.Observe(ctx, resp)
		}
		l.record(ws, idx, at)
		return nil
	})
}

// mKeyResult is one key's calls in one run, at the provider.
type mKeyResult struct {
	mQuota
	// Calls are the calls that counted against the key (admitted or not);
	// Most1s the most of them in any 1 s, against Burst + Rate; Worst the
	// window of them furthest above (or least below) burst + rate x span.
	Calls  int
	Most1s int
	Worst  windowResult
}

// mRun is one backend and path of scenario M.
type mRun struct {
	Backend, Path string
	Finished      bool
	// Drain is from the first enqueue to the last task's first successful
	// call; Ideal what the binding key allows.
	Drain, Ideal time.Duration
	Binding      string
	Completed    int
	Duplicates   int
	Calls, Over  int            // provider calls, and its 429s
	RefusedBy    map[string]int // the 429s by the quota that refused
	Deferrals    int64
	DeferralsPer float64
	ByReason     string
	ByKey        string // deferrals by the key the Event names
	Suspensions  int64
	Failed       int64
	FailedErrs   string
	Keys         []mKeyResult
	// Lag is the longest time from a task's admission to the provider's
	// decision on its call, Late the calls decided later than the
	// middleware's headroom after their admission, RefusedLags the lags of
	// the calls the provider refused.
	Lag         time.Duration
	Late        int
	RefusedLags []time.Duration
	Left        queueLeft
	Placement   string
}

type scenarioM struct {
	Runs []mRun
}

func runM(ctx context.Context, e *env, w io.Writer) (*scenarioM, error) {
	s := &scenarioM{}
	qs := mQuotas(mRedis)
	ideal, _ := mIdeal(qs)
	fmt.Fprintf(w, "\n== M. stacked limits (issue 30): 2 workspace keys at PerSecond(%d) under 1 app key at PerSecond(%d) (bursts = rates), %d tasks (%d per workspace), each throttle.Key(workspace, app); %d servers x concurrency %d\n",
		mWSRate, mAppRate, mTasks, mTasks/len(mWorkspaces), mServers, mConcurrency)
	fmt.Fprintf(w, "   a strict provider meters every call per workspace (%d/s burst %d) AND per app (%d/s burst %d) as token buckets: a call over either gets a 429\n",
		mWSRate, mWSRate, mAppRate, mAppRate)
	fmt.Fprintf(w, "   ideal %v: the binding key is the app's, (%d - %d) / %d/s (each workspace alone would allow (%d - %d) / %d/s = %.0fs)\n",
		ideal, mTasks, mAppRate, mAppRate, mTasks/2, mWSRate, mWSRate, float64(mTasks/2-mWSRate)/mWSRate)
	fmt.Fprintln(w, "   redis: the harness's Redis, keys slack:T1, slack:T2, slack; cluster: a 3-master Redis Cluster, keys {slack}:T1, {slack}:T2, {slack}:app, one family")
	fmt.Fprintln(w, "   (design (a), colocation by rule: one slot, so ONE master holds the three keys; issue 30's \"keys on different masters\" is design (b), not built)")
	sp := newStrictProvider()
	defer sp.Close()
	backends := []func() (*mBackend, error){
		func() (*mBackend, error) { return singleBackend(e), nil },
		clusterBackend,
	}
	for _, mk := range backends {
		b, err := mk()
		if err != nil {
			return s, err
		}
		for _, path := range []string{mMiddleware, mEnqueue} {
			r, err := mOnce(ctx, e, b, sp, path)
			if err != nil {
				b.stop()
				return s, fmt.Errorf("M/%s/%s: %w", b.name, path, err)
			}
			progress("M/%s/%s: %d/%d in %v (ideal %v), %d 429s, %.2f deferrals per task", b.name, path, r.Completed, mTasks,
				r.Drain.Round(time.Millisecond), r.Ideal, r.Over, r.DeferralsPer)
			s.Runs = append(s.Runs, r)
			if ctx.Err() != nil {
				b.stop()
				return s, ctx.Err()
			}
		}
		b.stop()
	}
	s.print(w)
	return s, nil
}

// mOnce runs one path on one backend: limits set, the fleet started, the
// 600 tasks enqueued, the drain awaited, the provider's calls checked.
func mOnce(ctx context.Context, e *env, b *mBackend, sp *strictProvider, path string) (mRun, error) {
	queue, prefix := e.names("m", b.name+"-"+strings.ReplaceAll(path, ".", ""))
	defer func() { _ = b.flush(context.Background(), queue, prefix) }()
	qs := mQuotas(b.name)
	ws, app := mKeys(b.name)
	r := mRun{Backend: b.name, Path: path}
	r.Ideal, r.Binding = mIdeal(qs)

	ctl := throttle.NewLimiter(b.ctl, throttle.WithPrefix(prefix), throttle.WithLogger(slog.New(slog.DiscardHandler)))
	defer ctl.Close()
	for _, q := range qs {
		if err := ctl.SetLimits(ctx, q.Key, throttle.PerSecond(q.Rate)); err != nil {
			return r, fmt.Errorf("SetLimits %s: %w", q.Key, err)
		}
	}
	r.Placement = b.placement(ctx, prefix, append(slices.Clone(ws), app))

	models, refused := newStackedModels(mWorkspaces, mWSRate, mAppRate, time.Now())
	sp.reset(models)
	led := newMLedger()
	cnt := newCounters()
	cnt.tap = led.event
	stop, err := mStartFleet(e, b, prefix, queue, sp, led, cnt)
	if err != nil {
		return r, err
	}
	client := asynq.NewClientFromRedisClient(b.ctl)
	led.mu.Lock()
	led.start = time.Now()
	led.mu.Unlock()
	err = enqueueWith(ctx, mTasks, func(ctx context.Context, i int) error {
		k := i % len(mWorkspaces)
		t := keyedTask("m:"+mWorkspaces[k], []byte(strconv.Itoa(i/len(mWorkspaces))), mTaskKey(ws[k], app))
		if path == mEnqueue {
			_, err := ctl.Enqueue(ctx, client, t, asynq.Queue(queue))
			return err
		}
		_, err := client.EnqueueContext(ctx, t, asynq.Queue(queue))
		return err
	})
	if err != nil {
		stop()
		return r, fmt.Errorf("enqueue: %w", err)
	}
	capAt := led.start.Add(2*r.Ideal + 15*time.Second)
	r.Finished = waitFor(ctx, capAt, func() bool { return led.completed() >= mTasks })
	stop()

	led.mu.Lock()
	r.Drain, r.Completed = led.last, led.done
	for _, n := range led.seen {
		if n > 1 {
			r.Duplicates++
		}
	}
	r.ByKey = reasons(led.byKey)
	r.Lag, r.Late, r.RefusedLags = led.lag, led.late, led.refusedLags
	led.mu.Unlock()
	r.Deferrals, r.Suspensions, r.Failed = cnt.denials.Load(), cnt.suspensions.Load(), cnt.failed.Load()
	r.DeferralsPer = float64(r.Deferrals) / mTasks
	cnt.mu.Lock()
	r.ByReason, r.FailedErrs = reasons(cnt.byReason), reasons(cnt.failedErrs)
	cnt.mu.Unlock()
	r.Left = mInspectQueue(b.ctl, queue)

	sp.mu.Lock()
	r.RefusedBy = maps.Clone(refused)
	sp.mu.Unlock()
	var all []float64
	for k, w := range mWorkspaces {
		calls := mCallTimes(sp.snapshot(w), led.start)
		all = append(all, calls...)
		r.Keys = append(r.Keys, mKeyCheck(qs[k], calls))
		for _, c := range sp.snapshot(w) {
			r.Calls++
			if !c.ok {
				r.Over++
			}
		}
	}
	r.Keys = append(r.Keys, mKeyCheck(qs[len(qs)-1], all))
	return r, nil
}

// mTaskKey is the task's keys, the most specific first.
func mTaskKey(ws, app string) asynq.Option { return throttle.Key(ws, app) }

// mCallTimes are the calls' times in seconds since start.
func mCallTimes(calls []callRecord, start time.Time) []float64 {
	out := make([]float64, len(calls))
	for i, c := range calls {
		out[i] = c.at.Sub(start).Seconds()
	}
	return out
}

// mKeyCheck checks one key's calls (seconds, any order, every call that
// counted against it, admitted or refused): the most in any 1 s against
// burst + rate, and the worst window against burst + rate x span.
func mKeyCheck(q mQuota, calls []float64) mKeyResult {
	adm := make([]admission, len(calls))
	for i, c := range calls {
		adm[i] = admission{t: c}
	}
	sched := tierSchedule{name: q.Key, steps: []tierStep{{rate: float64(q.Rate), burst: float64(q.Burst)}}}
	return mKeyResult{mQuota: q, Calls: len(calls), Most1s: mostWithin(calls, 1), Worst: worstWindow(adm, sched)}
}

// mInspectQueue reads what is left in queue through asynq's Inspector.
func mInspectQueue(rdb redis.UniversalClient, queue string) queueLeft {
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(queue)
	if err != nil {
		return queueLeft{Pending: -1}
	}
	return queueLeft{info.Pending, info.Active, info.Scheduled, info.Retry, info.Archived}
}

// mStartFleet starts mServers servers of worker.NewServer with the
// middleware, each on a client of its own on b, and returns how to stop
// them.
func mStartFleet(e *env, b *mBackend, prefix, queue string, sp *strictProvider, led *mLedger, cnt *counters) (func(), error) {
	var servers []*asynq.Server
	var clients []redis.UniversalClient
	stop := func() {
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Go(s.Shutdown)
		}
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for i := range mServers {
		rdb := b.newClient(mConcurrency + 20)
		clients = append(clients, rdb)
		lim := throttle.NewLimiter(rdb, throttle.WithPrefix(prefix), throttle.WithLogger(slog.New(slog.DiscardHandler)))
		lim.OnEvent(cnt.observe)
		mux := asynq.NewServeMux()
		mux.Use(lim.Middleware())
		for _, ws := range mWorkspaces {
			mux.Handle("m:"+ws, led.handler(sp, ws))
		}
		srv := worker.NewServer(rdb, asynq.Config{
			Concurrency:     mConcurrency,
			Queues:          map[string]int{queue: 1},
			Logger:          asynqLogger{verbose: e.verbose, prefix: fmt.Sprintf("[M %s #%d] ", b.name, i)},
			ShutdownTimeout: 3 * time.Second,
		})
		if err := srv.Start(mux); err != nil {
			stop()
			return nil, fmt.Errorf("start server %d: %w", i, err)
		}
		servers = append(servers, srv)
	}
	return stop, nil
}

func (s *scenarioM) print(w io.Writer) {
	if len(s.Runs) == 0 {
		return
	}
	t := newTable("metric")
	for _, r := range s.Runs {
		t.col(r.Backend + " " + r.Path)
	}
	rs := s.Runs
	t.row("provider 429s (target 0)", each(rs, func(r mRun) string { return strconv.Itoa(r.Over) }))
	t.row("  refused by: workspace/app/both", each(rs, func(r mRun) string {
		return fmt.Sprintf("%d/%d/%d", r.RefusedBy["workspace"], r.RefusedBy["app"], r.RefusedBy["both"])
	}))
	t.row(fmt.Sprintf("drain / ideal (target <= %.2fx)", targetMDrain), each(rs, func(r mRun) string {
		if !r.Finished {
			return fmt.Sprintf("DNF>%s (ideal %s)", secs(r.Drain), secs(r.Ideal))
		}
		return fmt.Sprintf("%s / %s = %s", secs(r.Drain), secs(r.Ideal), ratio(r.Drain.Seconds(), r.Ideal.Seconds()))
	}))
	t.row("  binding key", each(rs, func(r mRun) string { return r.Binding }))
	for k := range len(mWorkspaces) + 1 {
		name := "app"
		if k < len(mWorkspaces) {
			name = "workspace " + mWorkspaces[k]
		}
		t.row(fmt.Sprintf("%s: most calls in any 1 s (<= burst + rate)", name), each(rs, func(r mRun) string {
			kr := r.Keys[k]
			return fmt.Sprintf("%d of %d", kr.Most1s, kr.Burst+kr.Rate)
		}))
		t.row("  worst window: calls - (burst + rate x span)", each(rs, func(r mRun) string {
			kr := r.Keys[k]
			return fmt.Sprintf("%+.2f (%d in %.2fs)", kr.Worst.Excess, kr.Worst.Count, kr.Worst.Span)
		}))
		t.row("  calls", each(rs, func(r mRun) string { return strconv.Itoa(r.Keys[k].Calls) }))
	}
	t.row(fmt.Sprintf("deferrals per task (target <= %.1f)", targetMDeferrals), each(rs, func(r mRun) string {
		return fmt.Sprintf("%.2f (%d)", r.DeferralsPer, r.Deferrals)
	}))
	t.row("  by reason", each(rs, func(r mRun) string { return r.ByReason }))
	t.row("  by the key the event names", each(rs, func(r mRun) string { return r.ByKey }))
	t.row("  suspensions (429 -> key paused)", each(rs, func(r mRun) string { return strconv.FormatInt(r.Suspensions, 10) }))
	t.row(fmt.Sprintf("admission to the provider's decision: longest / calls later than the %v headroom", lHeadroom), each(rs, func(r mRun) string {
		return fmt.Sprintf("%dms / %d", r.Lag.Milliseconds(), r.Late)
	}))
	t.row("  the refused calls' lags", each(rs, func(r mRun) string {
		if len(r.RefusedLags) == 0 {
			return "-"
		}
		return strings.Join(each(r.RefusedLags, func(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }), " ")
	}))
	t.row("decisions Redis could not make", each(rs, func(r mRun) string { return strconv.FormatInt(r.Failed, 10) }))
	t.row(fmt.Sprintf("completed (of %d), exactly once", mTasks), each(rs, func(r mRun) string { return onceness(r.Completed, mTasks, r.Duplicates) }))
	t.row("left: pending/active/sched/retry/archived", each(rs, func(r mRun) string { return r.Left.String() }))
	t.print(w)
	for _, r := range rs {
		if r.Failed > 0 {
			fmt.Fprintf(w, "%s %s: decisions Redis could not make: %s\n", r.Backend, r.Path, r.FailedErrs)
		}
	}
	seen := map[string]bool{}
	for _, r := range rs {
		if !seen[r.Backend] {
			seen[r.Backend] = true
			fmt.Fprintf(w, "%s: %s\n", r.Backend, r.Placement)
		}
	}
	for _, r := range rs {
		printMTargets(w, r)
	}
	fmt.Fprintln(w, "notes: times since the first enqueue (the fleet runs before it); drain = to the last task's first successful call, timed at its handler.")
	fmt.Fprintln(w, "       the windows count every call the provider saw against the key (admitted or refused), on the harness's clock at the provider;")
	fmt.Fprintln(w, "       the app's are both workspaces' calls. Deferrals: Deferred and Suspended events over the tasks; a 429 goes to throttle.Observe.")
}

// mWindowsOK reports whether every key's every 1 s window held at most
// burst + rate calls.
func (r mRun) mWindowsOK() bool {
	for _, k := range r.Keys {
		if k.Most1s > k.Burst+k.Rate {
			return false
		}
	}
	return len(r.Keys) > 0
}

func printMTargets(w io.Writer, r mRun) {
	drain := r.Drain.Seconds() / r.Ideal.Seconds()
	var most []string
	for _, k := range r.Keys {
		most = append(most, fmt.Sprintf("%s %d/%d", k.Key, k.Most1s, k.Burst+k.Rate))
	}
	once := r.Completed == mTasks && r.Duplicates == 0 && r.Left == (queueLeft{})
	fmt.Fprintf(w, "targets M %s %s: 429s %d %s (0); drain %.2fx of %s %s (<= %.2fx); 1 s windows %s %s (<= burst + rate); deferrals per task %.2f %s (<= %.1f); exactly once, none archived: %s %s\n",
		r.Backend, r.Path, r.Over, verdict(r.Over == 0), drain, secs(r.Ideal), verdict(r.Finished && drain <= targetMDrain), targetMDrain,
		strings.Join(most, ", "), verdict(r.mWindowsOK()), r.DeferralsPer, verdict(r.DeferralsPer <= targetMDeferrals), targetMDeferrals,
		fmt.Sprintf("%d of %d, %d duplicated, left %s", r.Completed, mTasks, r.Duplicates, r.Left), verdict(once))
}
