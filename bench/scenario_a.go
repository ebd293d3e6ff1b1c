package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// vOursEnqueue is ours with enqueue-time throttling: the producer enqueues
// with Limiter.Enqueue, the workers run ByProvider as in ours.
const vOursEnqueue = "ours-enqueue"

// vAsynqPaced is asynq alone with a producer that enqueues the tasks at the
// limit's rate while the fleet runs: the same tasks at the same pace over
// the same time as a throttled drain, with nothing throttling them. It
// tells what a drain spread over 20 s costs Redis by itself (the fleet's
// polling meanwhile, commands that no longer come in batches) from what
// throttling adds.
const vAsynqPaced = "asynq-paced"

// drainResult is one variant's backlog drain (scenario A).
type drainResult struct {
	Variant        string
	Finished       bool
	Elapsed        time.Duration
	Enqueue        time.Duration // wall time of enqueueing the backlog
	Scheduled      int64         // ours-enqueue: tasks enqueued for a slot ahead (ProcessIn)
	Completed      int
	Duplicates     int
	ProviderCalls  int64
	Provider429    int64
	First429       []time.Duration // since fleet start
	Denials        int64
	DenialsPerTask float64
	Suspensions    int64
	Reserved       int64
	Copied         int64
	Failed         int64
	ByReason       map[string]int64
	RedisCmds      int64
	RedisScripts   int64
	CmdsPerTask    float64
	ScriptsPerTask float64
	// RedisCPU is redis-server's used_cpu_user+sys over enqueue and drain;
	// CPUPerTask that per completed task.
	RedisCPU   time.Duration
	CPUPerTask time.Duration
	// ByCommand is the INFO commandstats delta by command name.
	ByCommand map[string]cmdStat `json:"-"`
	// Span is the wall time the Redis figures cover (enqueue and drain);
	// IdleCmds and IdleCPU are the fleet's own Redis traffic per second
	// with no task left (asynq's polling, heartbeats, forwarder), sampled
	// for idleSample after the drain.
	Span            time.Duration
	IdleCmdsPerSec  float64
	IdleCPUPerSec   time.Duration
	NetCPUPerTask   time.Duration // CPUPerTask less the idle rate over Span
	IdleCmdsPerTask float64       // the idle rate over Span, per task
	P50, P99        time.Duration
	Left            queueLeft
}

// drainCase is one quota of scenario A and the variants run under it.
type drainCase struct {
	Name        string
	Tasks       int
	Rate, Burst float64
	Variants    []string
	Ideal       time.Duration
	Results     []drainResult
}

type scenarioA struct {
	Servers     int
	Concurrency int
	Cap         time.Duration
	Cases       []*drainCase
	// Small are A3's drains: small rates at the default burst.
	Small []*smallCase
}

// headroom is how far under the provider's quota every variant's limiter is
// set in scenario A, as the README advises: calls reach the provider a few
// milliseconds after their decision, and a strict provider sees that jitter.
const headroom = 0.98

// Targets of issue 16, against asynq alone draining the same tasks.
const (
	targetEnqueueRatio    = 2.0  // ours-enqueue: Redis commands and CPU per task
	targetMiddlewareRatio = 2.5  // ours (middleware only): the same
	targetPacedDrain      = 1.15 // burst 10 at 100/s: completion / (tasks/rate)
)

func runA(ctx context.Context, e *env, w io.Writer) (*scenarioA, error) {
	s := &scenarioA{Servers: 4, Concurrency: 10, Cap: 40 * time.Second}
	tasks := 2000
	if e.quick {
		tasks, s.Cap = 400, 30*time.Second
	}
	s.Cases = []*drainCase{
		{Name: "burst 100", Tasks: tasks, Rate: 100, Burst: 100,
			Variants: []string{vAsynq, vAsynqPaced, vSleep, vWiki, vNaive, vOurs, vOursEnqueue}},
		{Name: "burst 10 (paced)", Tasks: tasks, Rate: 100, Burst: 10,
			Variants: []string{vOurs, vOursEnqueue}},
	}
	var base, paced *drainResult
	for i, c := range s.Cases {
		c.Ideal = time.Duration(float64(c.Tasks) / c.Rate * float64(time.Second))
		fastest := time.Duration((float64(c.Tasks) - c.Burst) / c.Rate * float64(time.Second))
		fmt.Fprintf(w, "\n== A%d. backlog drain: %d tasks on one key, quota %.0f/s burst %.0f (every variant's limit %.0f/s burst %.0f), %d servers x concurrency %d\n   ideal %v = tasks/rate (a strict bucket allows %v = (tasks-burst)/rate); cap %v per variant\n",
			i+1, c.Tasks, c.Rate, c.Burst, c.Rate*headroom, math.Floor(c.Burst*headroom), s.Servers, s.Concurrency, c.Ideal, fastest, s.Cap)
		for _, v := range c.Variants {
			r, err := drainOnce(ctx, e, s, c, v)
			if err != nil {
				return s, fmt.Errorf("A/%s/%s: %w", c.Name, v, err)
			}
			progress("A/%s/%s: %d/%d in %v", c.Name, v, r.Completed, c.Tasks, r.Elapsed.Round(time.Millisecond))
			c.Results = append(c.Results, r)
		}
		if b := find(c.Results, func(r drainResult) bool { return r.Variant == vAsynq }); b != nil {
			base = b
		}
		if b := find(c.Results, func(r drainResult) bool { return r.Variant == vAsynqPaced }); b != nil {
			paced = b
		}
		c.print(w, s, base, paced, i == 0)
	}
	small, err := runA3(ctx, e)
	s.Small = small
	printA3(w, small)
	if err != nil {
		return s, fmt.Errorf("A3: %w", err)
	}
	return s, nil
}

func drainOnce(ctx context.Context, e *env, s *scenarioA, dc *drainCase, variant string) (drainResult, error) {
	const key = "api"
	queue, prefix := e.names("a", variant)
	defer func() { _ = e.cleanup(context.Background(), queue, prefix) }()
	set := newTaskSet(dc.Tasks)
	c := newCounters()
	spec := drainSpec(e, s, dc, variant, queue, prefix, key, set)
	if err := setLimits(ctx, e, spec); err != nil {
		return drainResult{}, err
	}
	d := &drain{e: e, dc: dc, variant: variant, spec: spec, key: key, c: c,
		mk: func(i int) *asynq.Task { return keyedTask("api:call", payload(i), throttle.Key(key)) }}
	r := drainResult{Variant: variant}
	before, err := redisStats(ctx, e)
	if err != nil {
		return drainResult{}, err
	}
	spanStart := time.Now()
	f, start, err := d.start(ctx, &r)
	if err != nil {
		return drainResult{}, err
	}
	finished := waitFor(ctx, start.Add(s.Cap), set.finished)
	after, err := redisStats(ctx, e)
	r.Span = time.Since(spanStart)
	if err == nil {
		err = r.sampleIdle(ctx, e)
	}
	f.stop()
	if err != nil {
		return drainResult{}, err
	}
	ep := e.prov.endpoint(key)
	r.Finished = finished
	r.Elapsed = set.elapsed(start)
	r.Completed = int(set.done.Load())
	r.Duplicates = set.duplicates()
	r.ProviderCalls, r.Provider429, r.First429 = ep.calls.Load(), ep.limited.Load(), ep.firstLimited()
	r.Denials, r.Suspensions, r.Reserved = c.denials.Load(), c.suspensions.Load(), c.reserved.Load()
	r.Copied, r.Failed, r.ByReason = c.copied.Load(), c.failed.Load(), c.byReason
	r.ByCommand = after.sub(before)
	r.RedisCmds, r.RedisScripts = sumCalls(r.ByCommand)
	r.RedisCPU = time.Duration((after.cpu - before.cpu) * float64(time.Second))
	r.Left = inspectQueue(e, queue)
	if !finished {
		r.Elapsed = s.Cap
	}
	r.perTask()
	p := set.percentiles(0.5, 0.99)
	r.P50, r.P99 = p[0], p[1]
	return r, nil
}

// drainSpec is the fleet of variant for a drain of dc's tasks on key:
// ours-enqueue runs ours' workers, asynq-paced asynq's; asynq alone has no
// limits (and the provider does not limit it either).
func drainSpec(e *env, s *scenarioA, dc *drainCase, variant, queue, prefix, key string, set *taskSet) fleetSpec {
	fleetVariant := variant
	switch variant {
	case vOursEnqueue:
		fleetVariant = vOurs
	case vAsynqPaced:
		fleetVariant = vAsynq
	}
	spec := fleetSpec{
		variant: fleetVariant, servers: s.Servers, concurrency: s.Concurrency,
		queue: queue, prefix: prefix,
		limits:   map[string]quota{key: {Rate: dc.Rate * headroom, Burst: math.Floor(dc.Burst * headroom)}},
		handlers: map[string]func(limitedFunc) asynq.Handler{"api:call": providerHandler(e.prov, set, key)},
	}
	if fleetVariant == vAsynq {
		spec.limits = nil
	}
	return spec
}

// drain is one variant's drain of scenario A on its way to the fleet.
type drain struct {
	e       *env
	dc      *drainCase
	variant string
	spec    fleetSpec
	key     string
	c       *counters
	mk      func(i int) *asynq.Task
}

// start puts the tasks in the queue and starts the fleet, each in the
// order the variant's producer and workers would, and returns the fleet
// and when the drain's clock started. It records the enqueue's time in r.
func (d *drain) start(ctx context.Context, r *drainResult) (*fleet, time.Time, error) {
	switch d.variant {
	case vAsynqPaced:
		return d.startPaced(ctx, r)
	case vOursEnqueue:
		return d.startEnqueueTime(ctx, r)
	}
	t0 := time.Now()
	if err := enqueue(ctx, d.e, d.spec.queue, d.dc.Tasks, d.mk); err != nil {
		return nil, time.Time{}, err
	}
	r.Enqueue = time.Since(t0)
	if d.variant == vAsynq {
		d.e.prov.reset(nil)
	} else {
		d.e.prov.reset(map[string]quota{d.key: {Rate: d.dc.Rate, Burst: d.dc.Burst}})
	}
	start := time.Now()
	f, err := startFleet(d.e, d.spec, d.c)
	return f, start, err
}

// startPaced starts the fleet, then one producer that enqueues a task
// every 1/rate of the limit while it runs.
func (d *drain) startPaced(ctx context.Context, r *drainResult) (*fleet, time.Time, error) {
	d.e.prov.reset(nil)
	f, err := startFleet(d.e, d.spec, d.c)
	if err != nil {
		return nil, time.Time{}, err
	}
	client := asynq.NewClientFromRedisClient(d.e.ctl)
	every := time.Duration(float64(time.Second) / (d.dc.Rate * headroom))
	start := time.Now()
	for i := range d.dc.Tasks {
		if w := time.Until(start.Add(time.Duration(i) * every)); w > 0 {
			time.Sleep(w)
		}
		if _, err = client.EnqueueContext(ctx, d.mk(i), asynq.Queue(d.spec.queue)); err != nil {
			f.stop()
			return nil, time.Time{}, fmt.Errorf("enqueue task %d: %w", i, err)
		}
	}
	r.Enqueue = time.Since(start)
	return f, start, nil
}

// startEnqueueTime starts the fleet, then a producer that enqueues through
// Limiter.Enqueue while it runs, as in production: slots are reserved from
// the first Enqueue, so the clock starts there (the enqueue's own time
// counts against the drain).
func (d *drain) startEnqueueTime(ctx context.Context, r *drainResult) (*fleet, time.Time, error) {
	d.e.prov.reset(map[string]quota{d.key: {Rate: d.dc.Rate, Burst: d.dc.Burst}})
	f, err := startFleet(d.e, d.spec, d.c)
	if err != nil {
		return nil, time.Time{}, err
	}
	start := time.Now()
	lim := throttle.NewLimiter(d.e.ctl, throttle.WithPrefix(d.spec.prefix))
	client := asynq.NewClientFromRedisClient(d.e.ctl)
	var scheduled atomic.Int64
	err = enqueueWith(ctx, d.dc.Tasks, func(ctx context.Context, i int) error {
		info, err := lim.Enqueue(ctx, client, d.mk(i), asynq.Queue(d.spec.queue))
		if err == nil && info.State == asynq.TaskStateScheduled {
			scheduled.Add(1)
		}
		return err
	})
	r.Enqueue, r.Scheduled = time.Since(start), scheduled.Load()
	if err != nil {
		f.stop()
		return nil, time.Time{}, err
	}
	return f, start, nil
}

// sampleIdle measures what the fleet costs Redis per second with nothing
// left to do.
func (r *drainResult) sampleIdle(ctx context.Context, e *env) error {
	idle0, err := redisStats(ctx, e)
	time.Sleep(idleSample)
	if err != nil {
		return err
	}
	idle1, err := redisStats(ctx, e)
	if err != nil {
		return err
	}
	idleCmds, _ := sumCalls(idle1.sub(idle0))
	r.IdleCmdsPerSec = float64(idleCmds) / idleSample.Seconds()
	r.IdleCPUPerSec = time.Duration((idle1.cpu - idle0.cpu) / idleSample.Seconds() * float64(time.Second))
	return nil
}

// perTask divides the run's counts by the tasks completed.
func (r *drainResult) perTask() {
	if r.Completed == 0 {
		return
	}
	n := float64(r.Completed)
	r.DenialsPerTask = float64(r.Denials) / n
	r.CmdsPerTask = float64(r.RedisCmds) / n
	r.ScriptsPerTask = float64(r.RedisScripts) / n
	r.CPUPerTask = time.Duration(float64(r.RedisCPU) / n)
	r.NetCPUPerTask = time.Duration((float64(r.RedisCPU) - float64(r.IdleCPUPerSec)*r.Span.Seconds()) / n)
	r.IdleCmdsPerTask = r.IdleCmdsPerSec * r.Span.Seconds() / n
}

// idleSample is how long scenario A samples a fleet's idle Redis traffic.
const idleSample = time.Second

// enqueueWith calls enq for tasks 0..n-1 from 16 goroutines and returns the
// first error.
func enqueueWith(ctx context.Context, n int, enq func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := enq(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("enqueue task %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// redisSnapshot is what scenario A reads from Redis before and after a run.
type redisSnapshot struct {
	cmds map[string]cmdStat
	cpu  float64 // used_cpu_user + used_cpu_sys, seconds
}

func redisStats(ctx context.Context, e *env) (redisSnapshot, error) {
	cmds, err1 := commandStats(ctx, e.ctl)
	cpu, err2 := redisCPU(ctx, e.ctl)
	return redisSnapshot{cmds, cpu}, errors.Join(err1, err2)
}

// sub returns the commandstats delta from before to s.
func (s redisSnapshot) sub(before redisSnapshot) map[string]cmdStat {
	d := map[string]cmdStat{}
	for name, st := range s.cmds {
		b := before.cmds[name]
		if st.calls > b.calls {
			d[name] = cmdStat{calls: st.calls - b.calls, usec: st.usec - b.usec}
		}
	}
	return d
}

// sumCalls totals a commandstats delta (commands run inside scripts count,
// as Redis counts them) and, separately, the script calls.
func sumCalls(m map[string]cmdStat) (total, scripts int64) {
	for name, st := range m {
		total += st.calls
		if isScriptCall(name) {
			scripts += st.calls
		}
	}
	return total, scripts
}

func isScriptCall(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

func (c *drainCase) print(w io.Writer, s *scenarioA, base, paced *drainResult, first bool) {
	t := newTable("metric")
	for _, r := range c.Results {
		t.col(r.Variant)
	}
	c.outcomeRows(t)
	c.costRows(t, base, paced)
	t.row("enqueue->run p50", each(c.Results, func(r drainResult) string { return secs(r.P50) }))
	t.row("enqueue->run p99", each(c.Results, func(r drainResult) string { return secs(r.P99) }))
	t.row("left: pending/active/sched/retry/archived", each(c.Results, func(r drainResult) string { return r.Left.String() }))
	t.print(w)

	c.printCommands(w, base, paced)
	if base != nil {
		c.printTargets(w, base, paced)
	}
	if c.Burst < c.Rate {
		c.printPacedDrains(w)
	}
	if ours := find(c.Results, func(r drainResult) bool { return r.Variant == vOurs }); ours != nil {
		c.printAgainstOurs(w, ours)
	}
	if first {
		printANotes(w)
	}
}

// outcomeRows are what each variant's drain achieved: completion, tasks
// done once, the provider's calls and 429s, and the denials on the way.
func (c *drainCase) outcomeRows(t *table) {
	target := time.Duration(1.05*float64(c.Ideal)) + 2*time.Second
	if c.Burst < c.Rate {
		target = time.Duration(targetPacedDrain * float64(c.Ideal))
	}
	t.row(fmt.Sprintf("completion time (target <= %v)", target), each(c.Results, func(r drainResult) string {
		if !r.Finished {
			return "DNF>" + secs(r.Elapsed)
		}
		return secs(r.Elapsed)
	}))
	t.row("completion / ideal", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2fx", r.Elapsed.Seconds()/c.Ideal.Seconds())
	}))
	t.row(fmt.Sprintf("completed (of %d), exactly once", c.Tasks), each(c.Results, func(r drainResult) string {
		return onceness(r.Completed, c.Tasks, r.Duplicates)
	}))
	t.row("provider calls", each(c.Results, func(r drainResult) string { return fmt.Sprint(r.ProviderCalls) }))
	t.row("provider 429s (target 0)", each(c.Results, func(r drainResult) string {
		if r.Variant == vAsynq || r.Variant == vAsynqPaced {
			return "- (no quota)"
		}
		return fmt.Sprint(r.Provider429)
	}))
	t.row("  first 429s at (s after start)", each(c.Results, func(r drainResult) string {
		if len(r.First429) == 0 {
			return "-"
		}
		var l []string
		for _, d := range r.First429 {
			l = append(l, fmt.Sprintf("%.3f", d.Seconds()))
		}
		return strings.Join(l, " ")
	}))
	t.row("denials per completed task (target <= 1.2)", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2f", r.DenialsPerTask)
	}))
	t.row("  denials total", each(c.Results, func(r drainResult) string { return fmt.Sprint(r.Denials) }))
	t.row("  of which with a reservation", each(c.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, fmt.Sprint(r.Reserved))
	}))
	t.row("  by reason", each(c.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, reasons(r.ByReason))
	}))
	t.row("  suspensions (429 -> fleet pause)", each(c.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, fmt.Sprint(r.Suspensions))
	}))
	t.row("  decisions Redis could not make", each(c.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, fmt.Sprint(r.Failed))
	}))
}

// costRows are what each variant's drain cost: enqueue time, and Redis
// commands and CPU per task, against asynq alone (base) and asynq-paced.
func (c *drainCase) costRows(t *table, base, paced *drainResult) {
	t.row("enqueue wall time (16 producers)", each(c.Results, func(r drainResult) string { return secs(r.Enqueue) }))
	t.row("  enqueued for a slot ahead (ProcessIn)", each(c.Results, func(r drainResult) string {
		if r.Variant != vOursEnqueue {
			return "-"
		}
		return fmt.Sprint(r.Scheduled)
	}))
	t.row("Redis commands per completed task", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.1f", r.CmdsPerTask)
	}))
	t.row("  of which script calls", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2f", r.ScriptsPerTask)
	}))
	t.row("Redis CPU per completed task", each(c.Results, func(r drainResult) string {
		return micros(r.CPUPerTask)
	}))
	t.row("  fleet idle after the drain: commands/s, Redis CPU/s", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.0f, %s", r.IdleCmdsPerSec, micros(r.IdleCPUPerSec))
	}))
	t.row("  idle rate over the run, per task: commands, CPU", each(c.Results, func(r drainResult) string {
		return fmt.Sprintf("%.1f, %s", r.IdleCmdsPerTask, micros(r.CPUPerTask-r.NetCPUPerTask))
	}))
	if base != nil {
		t.row("commands per task / asynq alone", each(c.Results, func(r drainResult) string {
			return ratio(r.CmdsPerTask, base.CmdsPerTask)
		}))
		t.row("Redis CPU per task / asynq alone", each(c.Results, func(r drainResult) string {
			return ratio(float64(r.CPUPerTask), float64(base.CPUPerTask))
		}))
		t.row("  the same, each less its fleet's idle rate", each(c.Results, func(r drainResult) string {
			if r.NetCPUPerTask <= 0 {
				return "- (not idle)"
			}
			return ratio(float64(r.NetCPUPerTask), float64(base.NetCPUPerTask))
		}))
	}
	if paced != nil {
		t.row("commands per task / asynq-paced", each(c.Results, func(r drainResult) string {
			return ratio(r.CmdsPerTask, paced.CmdsPerTask)
		}))
		t.row("Redis CPU per task / asynq-paced", each(c.Results, func(r drainResult) string {
			return ratio(float64(r.CPUPerTask), float64(paced.CPUPerTask))
		}))
	}
}

// printTargets compares ours and ours-enqueue with asynq alone (base) on
// issue 16's targets.
func (c *drainCase) printTargets(w io.Writer, base, paced *drainResult) {
	for _, tg := range []struct {
		variant string
		target  float64
	}{{vOursEnqueue, targetEnqueueRatio}, {vOurs, targetMiddlewareRatio}} {
		r := find(c.Results, func(r drainResult) bool { return r.Variant == tg.variant })
		if r == nil {
			continue
		}
		fmt.Fprintf(w, "ratio %s/asynq alone  Redis cmds/task %s %s  Redis CPU/task %s %s  (targets <= %.1fx)", tg.variant,
			ratio(r.CmdsPerTask, base.CmdsPerTask), verdict(r.CmdsPerTask/base.CmdsPerTask <= tg.target),
			ratio(float64(r.CPUPerTask), float64(base.CPUPerTask)), verdict(float64(r.CPUPerTask)/float64(base.CPUPerTask) <= tg.target),
			tg.target)
		if paced != nil {
			fmt.Fprintf(w, "; against asynq-paced: cmds %s, CPU %s", ratio(r.CmdsPerTask, paced.CmdsPerTask),
				ratio(float64(r.CPUPerTask), float64(paced.CPUPerTask)))
		}
		fmt.Fprintln(w)
	}
}

// printPacedDrains says, for a burst below the rate, how long each
// variant's drain took against tasks/rate.
func (c *drainCase) printPacedDrains(w io.Writer) {
	for _, r := range c.Results {
		fmt.Fprintf(w, "drain %-12s %.2fx of tasks/rate %s (target <= %.2fx), %d 429s (target 0)\n", r.Variant,
			r.Elapsed.Seconds()/c.Ideal.Seconds(), verdict(r.Finished && r.Elapsed.Seconds()/c.Ideal.Seconds() <= targetPacedDrain),
			targetPacedDrain, r.Provider429)
	}
}

// printAgainstOurs compares ours with each of the other throttles.
func (c *drainCase) printAgainstOurs(w io.Writer, ours *drainResult) {
	for _, r := range c.Results {
		if r.Variant == vOurs || r.Variant == vAsynq || r.Variant == vAsynqPaced || r.Variant == vOursEnqueue {
			continue
		}
		fmt.Fprintf(w, "ratio ours/%-5s  completion %s  denials/task %s  Redis cmds/task %s  Redis CPU/task %s  p99 %s  429s %d vs %d\n",
			r.Variant, ratio(ours.Elapsed.Seconds(), r.Elapsed.Seconds()),
			ratio(ours.DenialsPerTask, r.DenialsPerTask), ratio(ours.CmdsPerTask, r.CmdsPerTask),
			ratio(float64(ours.CPUPerTask), float64(r.CPUPerTask)),
			ratio(ours.P99.Seconds(), r.P99.Seconds()), ours.Provider429, r.Provider429)
	}
}

// printANotes explains scenario A's figures.
func printANotes(w io.Writer) {
	fmt.Fprintln(w, "notes: completion = fleet start to the last task's success (tasks are enqueued first; the provider's bucket starts full at fleet start);")
	fmt.Fprintln(w, "       ours-enqueue: the fleet runs first and 16 producers call Limiter.Enqueue; completion counts from the first Enqueue.")
	fmt.Fprintln(w, "       asynq alone: no limiter and a provider without quota, the reference of the Redis cost per task (issue 16's targets);")
	fmt.Fprintln(w, "       asynq-paced: the same, its producer enqueueing one task every 1/limit while the fleet runs: a drain as long as a throttled one, nothing throttling.")
	fmt.Fprintln(w, "       denials: sleep = refused redis_rate Allow (one sleep each); wiki = RateLimitError from the local limiter; naive/ours = Deferred+Suspended events.")
	fmt.Fprintln(w, "       wiki and asynq alone run on asynq's defaults (forwarder every 5 s); naive and ours on worker.NewServer (1 s).")
	fmt.Fprintln(w, "       Redis commands = INFO commandstats delta over enqueue and drain, all clients (asynq's own traffic included, commands inside scripts counted);")
	fmt.Fprintln(w, "       Redis CPU = redis-server used_cpu_user+sys (INFO cpu) delta over the same span, per completed task (a longer drain also pays the fleet's polling meanwhile);")
	fmt.Fprintf(w, "       fleet idle = the same two figures over %v after the last task, the fleet still running; \"less its idle rate\" subtracts that rate over the run's span.\n", idleSample)
}

// printCommands shows where each variant's Redis commands go: calls and
// Redis time per completed task by command name (commandstats; a script
// call's time includes the commands it runs, which are counted again on
// their own rows).
func (c *drainCase) printCommands(w io.Writer, base, paced *drainResult) {
	rs := slices.Clone(c.Results)
	for _, b := range []*drainResult{paced, base} {
		if b != nil && find(rs, func(r drainResult) bool { return r.Variant == b.Variant }) == nil {
			rs = append([]drainResult{*b}, rs...)
		}
	}
	// Only the variants the targets name, and naive for scale.
	rs = slices.DeleteFunc(rs, func(r drainResult) bool { return r.Variant == vSleep || r.Variant == vWiki })
	names := map[string]float64{}
	for _, r := range rs {
		for name, st := range r.ByCommand {
			if r.Completed > 0 {
				names[name] = max(names[name], float64(st.calls)/float64(r.Completed))
			}
		}
	}
	var order []string
	for name, per := range names {
		if per >= 0.05 {
			order = append(order, name)
		}
	}
	slices.SortFunc(order, func(a, b string) int {
		if names[a] != names[b] {
			if names[a] > names[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	t := newTable("  commands per task (usec per task)")
	for _, r := range rs {
		t.col(r.Variant)
	}
	for _, name := range order {
		t.row("  "+name, each(rs, func(r drainResult) string {
			st := r.ByCommand[name]
			if st.calls == 0 || r.Completed == 0 {
				return "-"
			}
			n := float64(r.Completed)
			return fmt.Sprintf("%.2f (%.1f)", float64(st.calls)/n, float64(st.usec)/n)
		}))
	}
	fmt.Fprintln(w, "where the Redis commands go, by name, per completed task (INFO commandstats delta; usec of a script call includes the commands it runs):")
	t.print(w)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func micros(d time.Duration) string {
	return fmt.Sprintf("%.1fus", float64(d)/float64(time.Microsecond))
}

func ifThrottle(variant, s string) string {
	if variant == vOurs || variant == vNaive || variant == vOursEnqueue {
		return s
	}
	return "-"
}

func reasons(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range []string{"tier", "queued", "reserved", "suspended"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", strings.ReplaceAll(k, " ", "_"), m[k]))
		}
	}
	for k, v := range m {
		switch k {
		case "tier", "queued", "reserved", "suspended":
		default:
			parts = append(parts, fmt.Sprintf("%s:%d", k, v))
		}
	}
	return strings.Join(parts, " ")
}
