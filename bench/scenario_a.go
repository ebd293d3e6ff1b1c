package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// drainResult is one variant's backlog drain (scenario A).
type drainResult struct {
	Variant        string
	Finished       bool
	Elapsed        time.Duration
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
	P50, P99       time.Duration
	Left           queueLeft
}

type scenarioA struct {
	Tasks       int
	Rate, Burst float64
	Servers     int
	Concurrency int
	Cap         time.Duration
	Ideal       time.Duration
	Results     []drainResult
}

// headroom is how far under the provider's quota every variant's limiter is
// set in scenario A, as the README advises: calls reach the provider a few
// milliseconds after their decision, and a strict provider sees that jitter.
const headroom = 0.98

func runA(ctx context.Context, e *env, w io.Writer) (*scenarioA, error) {
	s := &scenarioA{Tasks: 2000, Rate: 100, Burst: 100, Servers: 4, Concurrency: 10, Cap: 40 * time.Second}
	if e.quick {
		s.Tasks, s.Cap = 400, 30*time.Second
	}
	s.Ideal = time.Duration(float64(s.Tasks) / s.Rate * float64(time.Second))
	fastest := time.Duration((float64(s.Tasks) - s.Burst) / s.Rate * float64(time.Second))
	fmt.Fprintf(w, "\n== A. backlog drain: %d tasks on one key, quota %.0f/s burst %.0f (every variant's limit %.0f/s burst %.0f), %d servers x concurrency %d\n   ideal %v = tasks/rate (a strict bucket allows %v = (tasks-burst)/rate); cap %v per variant\n",
		s.Tasks, s.Rate, s.Burst, s.Rate*headroom, math.Floor(s.Burst*headroom), s.Servers, s.Concurrency, s.Ideal, fastest, s.Cap)
	for _, v := range []string{vSleep, vWiki, vNaive, vOurs} {
		r, err := drainOnce(ctx, e, s, v)
		if err != nil {
			return s, fmt.Errorf("A/%s: %w", v, err)
		}
		progress("A/%s: %d/%d in %v", v, r.Completed, s.Tasks, r.Elapsed.Round(time.Millisecond))
		s.Results = append(s.Results, r)
	}
	s.print(w)
	return s, nil
}

func drainOnce(ctx context.Context, e *env, s *scenarioA, variant string) (drainResult, error) {
	const key = "api"
	queue, prefix := e.names("a", variant)
	defer func() { _ = e.cleanup(context.Background(), queue, prefix) }()
	set := newTaskSet(s.Tasks)
	c := newCounters()
	spec := fleetSpec{
		variant: variant, servers: s.Servers, concurrency: s.Concurrency,
		queue: queue, prefix: prefix,
		limits:   map[string]quota{key: {Rate: s.Rate * headroom, Burst: math.Floor(s.Burst * headroom)}},
		handlers: map[string]func(limitedFunc) asynq.Handler{"api:call": providerHandler(e.prov, set, key)},
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return drainResult{}, err
	}
	err := enqueue(ctx, e, queue, s.Tasks, func(i int) *asynq.Task {
		return throttle.NewTask("api:call", payload(i), throttle.Key(key))
	})
	if err != nil {
		return drainResult{}, err
	}
	e.prov.reset(map[string]quota{key: {Rate: s.Rate, Burst: s.Burst}})
	cmds0, scripts0, err := redisCalls(ctx, e.ctl)
	if err != nil {
		return drainResult{}, err
	}
	start := time.Now()
	f, err := startFleet(e, spec, c)
	if err != nil {
		return drainResult{}, err
	}
	finished := waitFor(ctx, start.Add(s.Cap), set.finished)
	cmds1, scripts1, err := redisCalls(ctx, e.ctl)
	f.stop()
	if err != nil {
		return drainResult{}, err
	}
	ep := e.prov.endpoint(key)
	r := drainResult{
		Variant:       variant,
		Finished:      finished,
		Elapsed:       set.elapsed(start),
		Completed:     int(set.done.Load()),
		Duplicates:    set.duplicates(),
		ProviderCalls: ep.calls.Load(),
		Provider429:   ep.limited.Load(),
		First429:      ep.firstLimited(),
		Denials:       c.denials.Load(),
		Suspensions:   c.suspensions.Load(),
		Reserved:      c.reserved.Load(),
		Copied:        c.copied.Load(),
		Failed:        c.failed.Load(),
		ByReason:      c.byReason,
		RedisCmds:     cmds1 - cmds0,
		RedisScripts:  scripts1 - scripts0,
		Left:          inspectQueue(e, queue),
	}
	if !finished {
		r.Elapsed = s.Cap
	}
	if r.Completed > 0 {
		r.DenialsPerTask = float64(r.Denials) / float64(r.Completed)
		r.CmdsPerTask = float64(r.RedisCmds) / float64(r.Completed)
		r.ScriptsPerTask = float64(r.RedisScripts) / float64(r.Completed)
	}
	p := set.percentiles(0.5, 0.99)
	r.P50, r.P99 = p[0], p[1]
	return r, nil
}

func (s *scenarioA) print(w io.Writer) {
	t := newTable("metric")
	for _, r := range s.Results {
		t.col(r.Variant)
	}
	target := time.Duration(1.05*float64(s.Ideal)) + 2*time.Second
	t.row(fmt.Sprintf("completion time (target <= %v)", target), each(s.Results, func(r drainResult) string {
		if !r.Finished {
			return "DNF>" + secs(r.Elapsed)
		}
		return secs(r.Elapsed)
	}))
	t.row("completion / ideal", each(s.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2fx", r.Elapsed.Seconds()/s.Ideal.Seconds())
	}))
	t.row(fmt.Sprintf("completed (of %d), exactly once", s.Tasks), each(s.Results, func(r drainResult) string {
		return onceness(r.Completed, s.Tasks, r.Duplicates)
	}))
	t.row("provider calls", each(s.Results, func(r drainResult) string { return fmt.Sprint(r.ProviderCalls) }))
	t.row("provider 429s (target 0)", each(s.Results, func(r drainResult) string { return fmt.Sprint(r.Provider429) }))
	t.row("  first 429s at (s after start)", each(s.Results, func(r drainResult) string {
		if len(r.First429) == 0 {
			return "-"
		}
		var l []string
		for _, d := range r.First429 {
			l = append(l, fmt.Sprintf("%.3f", d.Seconds()))
		}
		return strings.Join(l, " ")
	}))
	t.row("denials per completed task (target <= 1.2)", each(s.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2f", r.DenialsPerTask)
	}))
	t.row("  denials total", each(s.Results, func(r drainResult) string { return fmt.Sprint(r.Denials) }))
	t.row("  of which with a reserved slot", each(s.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, fmt.Sprint(r.Reserved))
	}))
	t.row("  by reason", each(s.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, reasons(r.ByReason))
	}))
	t.row("  suspensions (429 -> fleet pause)", each(s.Results, func(r drainResult) string {
		return ifThrottle(r.Variant, fmt.Sprint(r.Suspensions))
	}))
	t.row("Redis commands per completed task", each(s.Results, func(r drainResult) string {
		return fmt.Sprintf("%.1f", r.CmdsPerTask)
	}))
	t.row("  of which script calls", each(s.Results, func(r drainResult) string {
		return fmt.Sprintf("%.2f", r.ScriptsPerTask)
	}))
	t.row("enqueue->run p50", each(s.Results, func(r drainResult) string { return secs(r.P50) }))
	t.row("enqueue->run p99", each(s.Results, func(r drainResult) string { return secs(r.P99) }))
	t.row("left: pending/active/sched/retry/archived", each(s.Results, func(r drainResult) string { return r.Left.String() }))
	t.print(w)

	ours := find(s.Results, func(r drainResult) bool { return r.Variant == vOurs })
	if ours == nil {
		return
	}
	for _, r := range s.Results {
		if r.Variant == vOurs {
			continue
		}
		fmt.Fprintf(w, "ratio ours/%-5s  completion %s  denials/task %s  Redis cmds/task %s  p99 %s  429s %d vs %d\n",
			r.Variant, ratio(ours.Elapsed.Seconds(), r.Elapsed.Seconds()),
			ratio(ours.DenialsPerTask, r.DenialsPerTask), ratio(ours.CmdsPerTask, r.CmdsPerTask),
			ratio(ours.P99.Seconds(), r.P99.Seconds()), ours.Provider429, r.Provider429)
	}
	fmt.Fprintln(w, "notes: completion = fleet start to the last task's success (tasks are enqueued first; the provider's bucket starts full at fleet start).")
	fmt.Fprintln(w, "       denials: sleep = refused redis_rate Allow (one sleep each); wiki = RateLimitError from the local limiter; naive/ours = Deferred+Suspended events.")
	fmt.Fprintln(w, "       wiki runs on asynq's defaults (forwarder every 5 s); naive and ours on worker.NewServer (1 s).")
	fmt.Fprintln(w, "       Redis commands = INFO commandstats delta during the drain, all clients (asynq's own traffic included, commands inside scripts counted).")
}

func ifThrottle(variant, s string) string {
	if variant == vOurs || variant == vNaive {
		return s
	}
	return "-"
}

func reasons(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range []string{"tier", "queued", "before slot", "suspended"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", strings.ReplaceAll(k, " ", "_"), m[k]))
		}
	}
	for k, v := range m {
		switch k {
		case "tier", "queued", "before slot", "suspended":
		default:
			parts = append(parts, fmt.Sprintf("%s:%d", k, v))
		}
	}
	return strings.Join(parts, " ")
}
