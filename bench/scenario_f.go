package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	redisv8 "github.com/go-redis/redis/v8"
	"github.com/hibiken/asynq"
	semaphore "github.com/hibiken/asynq/x/rate"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario F's variants besides ours. (F's naive is not fleet.go's vNaive:
// it has its own slots, see blindMiddleware.)
const (
	// fNaive: Sidekiq-style. A fleet-wide semaphore with a lease on the
	// Redis clock (the same slot as ours), and a refused task retried after
	// a blind backoff of 1 to 5 s that knows nothing of when a slot frees.
	fNaive = "naive"
	// fSemaphore: asynq's own x/rate.Semaphore (worker clock in whole
	// seconds, a slot held until the task's deadline unless released), a
	// refused task retried after a fixed delay (-f-sema-retry).
	fSemaphore = "semaphore"
)

// Scenario F's fixed shape: InFlight(fSlots) on one key, a fleet of
// fServers x fConcurrency.
const (
	fSlots       = 4
	fServers     = 4
	fConcurrency = 10
	fKey         = "crm"
)

// Defaults of scenario F's flags.
const (
	defaultFShort     = 200             // tasks of 200 ms: ideal 10 s on 4 slots
	defaultFLong      = 16              // tasks of 3 s: ideal 12 s on 4 slots
	defaultFSemaRetry = 1 * time.Second // asynq's resolution: the kindest fixed delay
	defaultFLongTime  = 3 * time.Second // run time of the long case
)

// fVariants are scenario F's variants, in the order they run.
var fVariants = []string{vOurs, fNaive, fSemaphore}

// fCase is one run time of scenario F and its backlog.
type fCase struct {
	Name    string
	RunTime time.Duration
	Tasks   int
}

// ideal is the wall time of the backlog with every slot busy all the time.
func (c fCase) ideal() time.Duration {
	return time.Duration(float64(c.RunTime) * float64(c.Tasks) / fSlots)
}

// slotRun is one variant on one case of scenario F.
type slotRun struct {
	Variant  string
	Case     string
	Finished bool
	// Wall is from the first handler's start to the last one's end;
	// Completion from the fleet's start to the last end.
	Wall, Completion time.Duration
	// Busy is the slot-seconds the handlers ran; Utilisation is Busy /
	// (slots x Wall).
	Busy           time.Duration
	Utilisation    float64
	Deferrals      int64
	DeferralsPer   float64
	WorstInFlight  int
	Completed      int
	Duplicates     int
	Runs           int // handler runs (a task deferred after running would count twice)
	ScriptsPerTask float64
	Left           queueLeft
	Failed         int64
}

type scenarioF struct {
	Slots       int
	Servers     int
	Concurrency int
	SemaRetry   time.Duration
	Cases       []fCase
	Results     []slotRun
}

func runF(ctx context.Context, e *env, w io.Writer) (*scenarioF, error) {
	s := &scenarioF{Slots: fSlots, Servers: fServers, Concurrency: fConcurrency, SemaRetry: e.fSemaRetry,
		Cases: []fCase{
			{Name: "200ms", RunTime: 200 * time.Millisecond, Tasks: e.fShort},
			{Name: e.fLongTime.String(), RunTime: e.fLongTime, Tasks: e.fLong},
		}}
	fmt.Fprintf(w, "\n== F. slots in flight: a backlog on one key limited to InFlight(%d) beside PerSecond(100) (never binds), %d servers x concurrency %d, run times %v (%d tasks, ideal %v) and %v (%d tasks, ideal %v)\n",
		fSlots, fServers, fConcurrency, s.Cases[0].RunTime, s.Cases[0].Tasks, s.Cases[0].ideal(), s.Cases[1].RunTime, s.Cases[1].Tasks, s.Cases[1].ideal())
	fmt.Fprintf(w, "   ours: worker.NewServer + ByProvider; naive: a fleet-wide semaphore leased on the Redis clock, refused tasks retried after a blind 1-5 s;\n")
	fmt.Fprintf(w, "   semaphore: asynq x/rate.Semaphore, refused tasks retried after %v (-f-sema-retry); every server polls its delayed tasks every 1 s\n", s.SemaRetry)
	for _, c := range s.Cases {
		for _, v := range e.fVariants {
			r, err := slotsOnce(ctx, e, c, v, s.SemaRetry)
			if err != nil {
				return s, fmt.Errorf("F/%s/%s: %w", c.Name, v, err)
			}
			progress("F/%s/%s: %d/%d in %v, utilisation %.2f", c.Name, v, r.Completed, c.Tasks, r.Wall.Round(time.Millisecond), r.Utilisation)
			s.Results = append(s.Results, r)
			if ctx.Err() != nil {
				return s, ctx.Err()
			}
		}
	}
	s.print(w)
	return s, nil
}

// slotLedger records when each handler run started and ended.
type slotLedger struct {
	mu    sync.Mutex
	spans [][2]time.Time
}

func (l *slotLedger) add(start, end time.Time) {
	l.mu.Lock()
	l.spans = append(l.spans, [2]time.Time{start, end})
	l.mu.Unlock()
}

// summary returns the first start, the last end, the summed run time and
// the most runs overlapping at any instant (an end and a start at the same
// instant do not overlap).
func (l *slotLedger) summary() (first, last time.Time, busy time.Duration, worst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(l.spans))
	for _, sp := range l.spans {
		busy += sp[1].Sub(sp[0])
		edges = append(edges, edge{sp[0], 1}, edge{sp[1], -1})
		if first.IsZero() || sp[0].Before(first) {
			first = sp[0]
		}
		if sp[1].After(last) {
			last = sp[1]
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends first
	})
	cur := 0
	for _, ed := range edges {
		cur += ed.delta
		worst = max(worst, cur)
	}
	return first, last, busy, worst
}

func slotsOnce(ctx context.Context, e *env, c fCase, variant string, semaRetry time.Duration) (slotRun, error) {
	queue, prefix := e.names("f", c.Name+"-"+variant)
	semaScope := prefix
	defer func() {
		_ = e.cleanup(context.Background(), queue, prefix)
		if !e.own {
			_ = e.ctl.Del(context.Background(), "asynq:sema:"+semaScope).Err()
		}
	}()
	set := newTaskSet(c.Tasks)
	cnt := newCounters()
	var led slotLedger
	spec := fleetSpec{
		variant: variant, servers: fServers, concurrency: fConcurrency, queue: queue, prefix: prefix,
		handlers: map[string]func(limitedFunc) asynq.Handler{fKey + ":call": slotsHandler(c.RunTime, set, &led)},
	}
	if err := slotsVariant(ctx, e, &spec, cnt, semaScope, semaRetry); err != nil {
		return slotRun{}, err
	}
	err := enqueue(ctx, e, queue, c.Tasks, func(i int) *asynq.Task {
		return keyedTask(fKey+":call", payload(i), throttle.Key(fKey))
	})
	if err != nil {
		return slotRun{}, err
	}
	_, scripts0, err := redisCalls(ctx, e.ctl)
	if err != nil {
		return slotRun{}, err
	}
	// Blind backoffs take 2-5x the ideal on short tasks: they are cut off
	// (DNF) and measured up to there, so that F stays near 2 minutes.
	capAt := 2*c.ideal() + 5*time.Second
	began := time.Now()
	f, err := startFleet(e, spec, cnt)
	if err != nil {
		return slotRun{}, err
	}
	finished := waitFor(ctx, began.Add(capAt), set.finished)
	_, scripts1, err := redisCalls(ctx, e.ctl)
	f.stop()
	if err != nil {
		return slotRun{}, err
	}
	r := slotRun{
		Variant: variant, Case: c.Name, Finished: finished,
		Deferrals: cnt.denials.Load(), Failed: cnt.failed.Load(),
		Completed: int(set.done.Load()), Duplicates: set.duplicates(),
		Left: inspectQueue(e, queue),
	}
	r.fromLedger(&led, began)
	if r.Completed > 0 {
		r.DeferralsPer = float64(r.Deferrals) / float64(r.Completed)
		r.ScriptsPerTask = float64(scripts1-scripts0) / float64(r.Completed)
	}
	return r, nil
}

// slotsHandler is scenario F's task: a call to the provider that takes
// runTime, recorded in led.
func slotsHandler(runTime time.Duration, set *taskSet, led *slotLedger) func(limitedFunc) asynq.Handler {
	return func(limitedFunc) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			idx, enq, err := parsePayload(t.Payload())
			if err != nil {
				return fmt.Errorf("%w: %v", asynq.SkipRetry, err)
			}
			start := time.Now()
			if err := sleepCtx(ctx, runTime); err != nil { // the call to the provider
				return err
			}
			led.add(start, time.Now())
			set.complete(idx, enq, start)
			return nil
		})
	}
}

// slotsVariant sets up spec's variant: ours' limits in Redis, or the
// middleware of the blind-backoff semaphore (naive) or asynq's semaphore
// (scoped to semaScope, deferring a refused task by semaRetry).
func slotsVariant(ctx context.Context, e *env, spec *fleetSpec, cnt *counters, semaScope string, semaRetry time.Duration) error {
	switch spec.variant {
	case vOurs:
		l := throttle.NewLimiter(e.ctl, throttle.WithPrefix(spec.prefix))
		return l.SetLimits(ctx, fKey, throttle.PerSecond(100), throttle.InFlight(fSlots))
	case fNaive:
		prefix := spec.prefix
		spec.custom = func(i int, rdb *redis.Client, cfg *asynq.Config) (asynq.MiddlewareFunc, func(), error) {
			blindConfig(cfg)
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			return blindMiddleware(rdb, prefix+":slots", fSlots, 30*time.Second, rng, cnt), nil, nil
		}
	case fSemaphore:
		spec.custom = func(i int, rdb *redis.Client, cfg *asynq.Config) (asynq.MiddlewareFunc, func(), error) {
			blindConfig(cfg)
			sema, err := newAsynqSemaphore(e, semaScope)
			if err != nil {
				return nil, nil, err
			}
			return semaphoreMiddleware(sema, semaRetry, cnt), func() { _ = sema.Close() }, nil
		}
	}
	return nil
}

// fromLedger fills in what the ledger of the handlers' runs says: how busy
// the slots were, the most in flight at once, and when the runs began and
// ended (the fleet started at began).
func (r *slotRun) fromLedger(led *slotLedger, began time.Time) {
	first, last, busy, worst := led.summary()
	r.Busy, r.WorstInFlight = busy, worst
	led.mu.Lock()
	r.Runs = len(led.spans)
	led.mu.Unlock()
	if !first.IsZero() {
		r.Wall, r.Completion = last.Sub(first), last.Sub(began)
		r.Utilisation = busy.Seconds() / (fSlots * r.Wall.Seconds())
	}
}

// blindConfig makes a server of naive or semaphore defer as ours does on
// worker.NewServer: a RateLimitError is no failure (retry count kept) and
// waits its own delay; delayed tasks are polled every second and an idle
// server looks for tasks every 100 ms. Only the waiting strategy differs.
func blindConfig(cfg *asynq.Config) {
	cfg.IsFailure = func(err error) bool { return !IsRateLimitError(err) }
	cfg.RetryDelayFunc = wikiRetryDelay
	cfg.DelayedTaskCheckInterval = time.Second
	cfg.TaskCheckInterval = 100 * time.Millisecond
}

// acquireScript takes one of ARGV[1] slots of the sorted set KEYS[1] for
// ARGV[3], leased ARGV[2] microseconds on the Redis clock, after dropping
// the holders whose lease ended. Reply: 1 taken, 0 all held.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) / 1000))
return 1
`)

// blindMiddleware is the naive variant: Sidekiq Enterprise's concurrent
// limiter in spirit. A task takes a slot of a fleet-wide semaphore leased
// on the Redis clock (the lease outlives every run here, so no renewal),
// gives it back when its handler returns, and when every slot is held is
// retried after a backoff of 1 to 5 whole seconds that does not know when
// a slot frees.
func blindMiddleware(rdb *redis.Client, key string, slots int, lease time.Duration, rng *rand.Rand, c *counters) asynq.MiddlewareFunc {
	var mu sync.Mutex
	var seq atomic.Int64
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			member := id + "." + strconv.FormatInt(seq.Add(1), 10)
			ok, err := acquireScript.Run(ctx, rdb, []string{key}, slots, lease.Microseconds(), member).Int()
			if err != nil {
				c.failed.Add(1)
				return err
			}
			if ok != 1 {
				c.denials.Add(1)
				mu.Lock()
				backoff := time.Duration(1+rng.IntN(5)) * time.Second
				mu.Unlock()
				return &RateLimitError{RetryIn: backoff}
			}
			defer rdb.ZRem(context.Background(), key, member)
			return next.ProcessTask(ctx, t)
		})
	}
}

// v8ConnOpt hands x/rate.Semaphore the go-redis v8 client it asserts its
// connection to (asynq v0.26's own RedisClientOpt makes a v9 client, and
// NewSemaphore panics "unsupported RedisConnOpt type" on it).
type v8ConnOpt struct{ o *redis.Options }

func (c v8ConnOpt) MakeRedisClient() any {
	return redisv8.NewClient(&redisv8.Options{
		Addr: c.o.Addr, Username: c.o.Username, Password: c.o.Password, DB: c.o.DB,
		PoolSize: fConcurrency + 10,
	})
}

// newAsynqSemaphore is asynq's x/rate.NewSemaphore for one server process.
func newAsynqSemaphore(e *env, scope string) (sema *semaphore.Semaphore, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("x/rate.NewSemaphore: %v", p)
		}
	}()
	return semaphore.NewSemaphore(v8ConnOpt{e.opts}, scope, fSlots), nil
}

// semaphoreMiddleware is x/rate's documented use (its example): Acquire,
// a RateLimitError when no token is free, Release when the handler returns.
// The example retries in 30 s; here retry (1 s by default) is the kindest
// fixed delay asynq honours.
func semaphoreMiddleware(sema *semaphore.Semaphore, retry time.Duration, c *counters) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			ok, err := sema.Acquire(ctx)
			if err != nil {
				c.failed.Add(1)
				return err
			}
			if !ok {
				c.denials.Add(1)
				return &RateLimitError{RetryIn: retry}
			}
			// Release finds the slot by the task ID in ctx, as Acquire did.
			defer func() { _ = sema.Release(ctx) }()
			return next.ProcessTask(ctx, t)
		})
	}
}

func (s *scenarioF) print(w io.Writer) {
	for _, c := range s.Cases {
		var rs []slotRun
		for _, r := range s.Results {
			if r.Case == c.Name {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(w, "-- run time %v: %d tasks on %d slots, ideal %v\n", c.RunTime, c.Tasks, fSlots, c.ideal())
		t := newTable("metric")
		for _, r := range rs {
			t.col(r.Variant)
		}
		t.row("slot utilisation = busy slot-s / (slots x wall)", each(rs, func(r slotRun) string { return fmt.Sprintf("%.2f", r.Utilisation) }))
		t.row("wall time (first start to last end)", each(rs, func(r slotRun) string {
			if !r.Finished {
				return "DNF>" + secs(r.Wall)
			}
			return secs(r.Wall)
		}))
		t.row("  wall / ideal", each(rs, func(r slotRun) string {
			return fmt.Sprintf("%.2fx", r.Wall.Seconds()/c.ideal().Seconds())
		}))
		t.row("  fleet start to last end", each(rs, func(r slotRun) string { return secs(r.Completion) }))
		t.row("  busy slot-seconds", each(rs, func(r slotRun) string { return fmt.Sprintf("%.1f", r.Busy.Seconds()) }))
		t.row(fmt.Sprintf("  mean handler run (sleeps %v)", c.RunTime), each(rs, func(r slotRun) string {
			if r.Runs == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3fs", r.Busy.Seconds()/float64(r.Runs))
		}))
		t.row("deferrals per task", each(rs, func(r slotRun) string { return fmt.Sprintf("%.2f", r.DeferralsPer) }))
		t.row("  deferrals total", each(rs, func(r slotRun) string { return fmt.Sprint(r.Deferrals) }))
		t.row(fmt.Sprintf("worst in flight at any instant (limit %d)", fSlots), each(rs, func(r slotRun) string {
			if r.WorstInFlight > fSlots {
				return fmt.Sprintf("%d OVER", r.WorstInFlight)
			}
			return fmt.Sprint(r.WorstInFlight)
		}))
		t.row(fmt.Sprintf("completed (of %d), exactly once", c.Tasks), each(rs, func(r slotRun) string {
			return onceness(r.Completed, c.Tasks, r.Duplicates)
		}))
		t.row("  handler runs", each(rs, func(r slotRun) string { return fmt.Sprint(r.Runs) }))
		t.row("  decisions Redis could not make", each(rs, func(r slotRun) string { return fmt.Sprint(r.Failed) }))
		t.row("Redis script calls per task (asynq's own included)", each(rs, func(r slotRun) string { return fmt.Sprintf("%.1f", r.ScriptsPerTask) }))
		t.row("left: pending/active/sched/retry/archived", each(rs, func(r slotRun) string { return r.Left.String() }))
		t.print(w)
	}
	for _, base := range []string{fNaive, fSemaphore} {
		line := fmt.Sprintf("ratio ours/%-9s", base)
		for _, c := range s.Cases {
			ours := find(s.Results, func(r slotRun) bool { return r.Case == c.Name && r.Variant == vOurs })
			other := find(s.Results, func(r slotRun) bool { return r.Case == c.Name && r.Variant == base })
			if ours == nil || other == nil {
				continue
			}
			line += fmt.Sprintf("  %s: utilisation %s, wall %s, deferrals/task %s, worst in flight %d vs %d;",
				c.Name, ratio(ours.Utilisation, other.Utilisation), ratio(ours.Wall.Seconds(), other.Wall.Seconds()),
				ratio(ours.DeferralsPer, other.DeferralsPer), ours.WorstInFlight, other.WorstInFlight)
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w, "notes: handler run = the provider call (a sleep of the run time) inside the slot; start/end in the harness's ledger, every server in this process.")
	fmt.Fprintln(w, "       a mean handler run above the run time means a starved process (timers fire late on a busy machine): it inflates busy time for every variant.")
	fmt.Fprintln(w, "       deferrals: ours = Deferred events (a slot expected free within 1 s is waited for in the worker, not counted); naive/semaphore = refused acquisitions (one retry each).")
	fmt.Fprintln(w, "       asynq brings a deferred task back on a whole second of its clock (and the forwarder runs every 1 s): a slot that frees between two ticks")
	fmt.Fprintln(w, "       stays idle until a task comes back, unless a waiting worker or a pending task takes it.")
}
