package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// defaultBRounds is how many rounds of one solo and one mixed run each
// variant makes unless -b-rounds says otherwise. Runs last about a second,
// so fewer rounds leave the ratio to noise.
const defaultBRounds = 4

// holRun is one fleet run of scenario B, or the sum of several.
type holRun struct {
	Runs       int
	Finished   bool
	Elapsed    time.Duration // fleet start to the last fast task
	FastDone   int
	FastDup    int
	Throughput float64 // fast tasks per second
	SlowDone   int
	SlowDup    int
	Slow429    int64
	Denials    int64
	Cmds       int64   // Redis commands during the run(s)
	CPU        float64 // redis-server used_cpu_user+sys during the run(s), seconds
}

// add sums run into h; throughput is over the summed wall time.
func (h *holRun) add(run holRun) {
	h.Finished = run.Finished && (h.Runs == 0 || h.Finished)
	h.Runs++
	h.Elapsed += run.Elapsed
	h.FastDone += run.FastDone
	h.FastDup += run.FastDup
	h.SlowDone += run.SlowDone
	h.SlowDup += run.SlowDup
	h.Slow429 += run.Slow429
	h.Denials += run.Denials
	h.Cmds += run.Cmds
	h.CPU += run.CPU
	if h.Elapsed > 0 {
		h.Throughput = float64(h.FastDone) / h.Elapsed.Seconds()
	}
}

type holResult struct {
	Variant string
	Solo    holRun
	Mixed   holRun
	// Rounds is fast tasks/s beside the throttled provider over fast
	// tasks/s alone, in each round (its solo and its mixed run).
	Rounds []float64
}

// minRound is the lowest of r's per-round ratios (0 without any).
func (r holResult) minRound() float64 {
	if len(r.Rounds) == 0 {
		return 0
	}
	return slices.Min(r.Rounds)
}

// targetHOL is issue 16's target for B: beside / alone in every round.
const targetHOL = 0.95

type scenarioB struct {
	FastTasks, SlowTasks int
	SlowRate             float64
	Servers, Concurrency int
	Rounds               int
	Cap                  time.Duration
	Results              []holResult
}

func runB(ctx context.Context, e *env, w io.Writer) (*scenarioB, error) {
	s := &scenarioB{FastTasks: 5000, SlowTasks: 300, SlowRate: 2, Servers: 4, Concurrency: 10, Cap: 15 * time.Second, Rounds: e.bRounds}
	if e.quick {
		s.FastTasks, s.SlowTasks, s.Cap = 1000, 60, 10*time.Second
	}
	fmt.Fprintf(w, "\n== B. head of line: %d tasks of a provider throttled to %.0f/s beside %d tasks of an unthrottled provider (HTTP call each), %d servers x concurrency %d, one queue, interleaved (cap %v per run)\n",
		s.SlowTasks, s.SlowRate, s.FastTasks, s.Servers, s.Concurrency, s.Cap)
	// asynq alone runs the fast tasks only: the reference of their Redis
	// cost (it cannot throttle the other provider).
	for _, v := range []string{vAsynq, vSleep, vWiki, vNaive, vOurs} {
		r := holResult{Variant: v}
		// Rounds of solo and mixed in alternating order, against drift in outside load;
		// a mixed run that hit the cap is not repeated.
		for round := range s.Rounds {
			var solo, mixed float64
			for _, withSlow := range []bool{round%2 == 1, round%2 == 0} {
				if withSlow && (v == vAsynq || r.Mixed.Runs > 0 && !r.Mixed.Finished) {
					continue
				}
				run, err := holOnce(ctx, e, s, v, withSlow)
				if err != nil {
					return s, fmt.Errorf("B/%s (with throttled tasks: %v): %w", v, withSlow, err)
				}
				if withSlow {
					r.Mixed.add(run)
					mixed = run.Throughput
				} else {
					r.Solo.add(run)
					solo = run.Throughput
				}
			}
			if solo > 0 && mixed > 0 {
				r.Rounds = append(r.Rounds, mixed/solo)
			}
		}
		if r.Mixed.Runs > 0 {
			progress("B/%s: fast alone %.0f/s, beside the throttled provider %.0f/s", v, r.Solo.Throughput, r.Mixed.Throughput)
		} else {
			progress("B/%s: fast alone %.0f/s", v, r.Solo.Throughput)
		}
		s.Results = append(s.Results, r)
	}
	s.print(w)
	return s, nil
}

func holOnce(ctx context.Context, e *env, s *scenarioB, variant string, withSlow bool) (holRun, error) {
	queue, prefix := e.names("b", variant)
	defer func() { _ = e.cleanup(context.Background(), queue, prefix) }()
	nSlow := 0
	if withSlow {
		nSlow = s.SlowTasks
	}
	total := s.FastTasks + nSlow
	slow, idx := interleave(total, nSlow)
	fast, slowSet := newTaskSet(s.FastTasks), newTaskSet(max(nSlow, 1))
	c := newCounters()
	spec := fleetSpec{
		variant: variant, servers: s.Servers, concurrency: s.Concurrency,
		queue: queue, prefix: prefix,
		limits: map[string]quota{"slow": {Rate: s.SlowRate, Burst: s.SlowRate}},
		handlers: map[string]func(limitedFunc) asynq.Handler{
			"slow:call": providerHandler(e.prov, slowSet, "slow"),
			"fast:call": providerHandler(e.prov, fast, "fast"),
		},
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return holRun{}, err
	}
	err := enqueue(ctx, e, queue, total, func(i int) *asynq.Task {
		if slow[i] {
			return keyedTask("slow:call", payload(idx[i]), throttle.Key("slow"))
		}
		// The unthrottled provider's tasks carry no key, as a user would
		// enqueue them; ours derives "fast" from the type, which has no limits.
		return asynq.NewTask("fast:call", payload(idx[i]))
	})
	if err != nil {
		return holRun{}, err
	}
	e.prov.reset(map[string]quota{"slow": {Rate: s.SlowRate, Burst: s.SlowRate}})
	fr, err := runFleetUntil(ctx, e, spec, c, s.Cap, fast.finished)
	if err != nil {
		return holRun{}, err
	}
	r := holRun{Finished: fr.finished, Elapsed: fast.elapsed(fr.start), Cmds: fr.cmds, CPU: fr.cpu}
	r.FastDone, r.FastDup = int(fast.done.Load()), fast.duplicates()
	r.Denials = c.denials.Load()
	r.Slow429 = e.prov.endpoint("slow").limited.Load()
	if withSlow {
		r.SlowDone, r.SlowDup = int(slowSet.done.Load()), slowSet.duplicates()
	}
	if !r.Finished {
		r.Elapsed = s.Cap
	}
	if r.Elapsed > 0 {
		r.Throughput = float64(r.FastDone) / r.Elapsed.Seconds()
	}
	return r, nil
}

// interleave spreads nSlow slow tasks evenly through a queue of total
// tasks, and numbers the slow and the fast ones each from 0.
func interleave(total, nSlow int) (slow []bool, idx []int) {
	slow, idx = make([]bool, total), make([]int, total)
	var ns, nf int
	for i := range total {
		if nSlow > 0 && (i*nSlow)/total != ((i+1)*nSlow)/total {
			slow[i], idx[i] = true, ns
			ns++
		} else {
			idx[i] = nf
			nf++
		}
	}
	return slow, idx
}

// fleetRun is what runFleetUntil measured: whether the run got done, when
// the fleet started, and the Redis commands and CPU (seconds) it cost.
type fleetRun struct {
	finished bool
	start    time.Time
	cmds     int64
	cpu      float64
}

// runFleetUntil starts spec's fleet, waits for done (at most limit after
// its start), and stops it.
func runFleetUntil(ctx context.Context, e *env, spec fleetSpec, c *counters, limit time.Duration, done func() bool) (fleetRun, error) {
	cmds0, _, err := redisCalls(ctx, e.ctl)
	if err != nil {
		return fleetRun{}, err
	}
	cpu0, err := redisCPU(ctx, e.ctl)
	if err != nil {
		return fleetRun{}, err
	}
	start := time.Now()
	f, err := startFleet(e, spec, c)
	if err != nil {
		return fleetRun{}, err
	}
	finished := waitFor(ctx, start.Add(limit), done)
	cmds1, _, err := redisCalls(ctx, e.ctl)
	cpu1, err2 := redisCPU(ctx, e.ctl)
	f.stop()
	if err := errors.Join(err, err2); err != nil {
		return fleetRun{}, err
	}
	return fleetRun{finished: finished, start: start, cmds: cmds1 - cmds0, cpu: cpu1 - cpu0}, nil
}

func (s *scenarioB) print(w io.Writer) {
	t := newTable("metric")
	for _, r := range s.Results {
		t.col(r.Variant)
	}
	s.soloRows(t)
	s.mixedRows(t)
	s.extraRows(t)
	t.print(w)
	s.printRounds(w)
	ours := find(s.Results, func(r holResult) bool { return r.Variant == vOurs })
	if ours == nil {
		return
	}
	s.printRatios(w, ours)
	fmt.Fprintf(w, "notes: tasks/s = fast tasks done / (fleet start to the last fast task), summed over %d rounds of one solo and one mixed run, alternating which runs first;\n", s.Rounds)
	fmt.Fprintln(w, "       each variant's own solo runs are its reference, round by round; a mixed run that hit the cap is not repeated; asynq alone runs the fast tasks only.")
	fmt.Fprintln(w, "       Redis commands and CPU (used_cpu_user+sys) are deltas over each run, per task run (fast and throttled).")
}

// perTask is a run's Redis commands and CPU per task it ran (fast and
// throttled).
func perTask(h holRun) (cmds float64, cpu time.Duration) {
	n := float64(max(h.FastDone+h.SlowDone, 1))
	return float64(h.Cmds) / n, time.Duration(h.CPU / n * float64(time.Second))
}

// mixedOr is f(r), or "-" when r has no run beside the throttled provider.
func mixedOr(r holResult, f func(holResult) string) string {
	if r.Mixed.Runs == 0 {
		return "-"
	}
	return f(r)
}

// extra is what the throttled provider's tasks add to a run, per throttled
// task in the queue (each was decided, and most deferred, meanwhile), of
// what f counts; false when the runs cannot tell.
func (s *scenarioB) extra(r holResult, f func(h holRun) float64) (float64, bool) {
	if !r.Mixed.Finished || r.Mixed.Runs == 0 || r.Solo.Runs == 0 {
		return 0, false
	}
	return (f(r.Mixed)/float64(r.Mixed.Runs) - f(r.Solo)/float64(r.Solo.Runs)) / float64(s.SlowTasks), true
}

// soloRows are the fast provider's figures alone.
func (s *scenarioB) soloRows(t *table) {
	t.row("fast alone: tasks/s", each(s.Results, func(r holResult) string { return fmt.Sprintf("%.0f", r.Solo.Throughput) }))
	t.row(fmt.Sprintf("fast alone: runs x done (of %d)", s.FastTasks), each(s.Results, func(r holResult) string {
		return fmt.Sprintf("%dx %s", r.Solo.Runs, onceness(r.Solo.FastDone, r.Solo.Runs*s.FastTasks, r.Solo.FastDup))
	}))
	t.row("fast alone: Redis commands per task", each(s.Results, func(r holResult) string {
		c, _ := perTask(r.Solo)
		return fmt.Sprintf("%.1f", c)
	}))
	t.row("fast alone: Redis CPU per task", each(s.Results, func(r holResult) string {
		_, c := perTask(r.Solo)
		return micros(c)
	}))
}

// mixedRows are the fast provider's figures beside the throttled one.
func (s *scenarioB) mixedRows(t *table) {
	t.row("fast beside throttled: tasks/s", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string {
			if !r.Mixed.Finished {
				return fmt.Sprintf("DNF %.0f", r.Mixed.Throughput)
			}
			return fmt.Sprintf("%.0f", r.Mixed.Throughput)
		})
	}))
	t.row(fmt.Sprintf("fast beside throttled: runs x done (of %d)", s.FastTasks), each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string {
			return fmt.Sprintf("%dx %s", r.Mixed.Runs, onceness(r.Mixed.FastDone, r.Mixed.Runs*s.FastTasks, r.Mixed.FastDup))
		})
	}))
	t.row("beside / alone, all rounds", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string { return ratio(r.Mixed.Throughput, r.Solo.Throughput) })
	}))
	t.row(fmt.Sprintf("beside / alone, lowest round (target >= %.2f)", targetHOL), each(s.Results, func(r holResult) string {
		if len(r.Rounds) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", r.minRound())
	}))
	t.row("fast wall time beside throttled, per run", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string { return secs(r.Mixed.Elapsed / time.Duration(max(r.Mixed.Runs, 1))) })
	}))
	t.row("throttled tasks run meanwhile, all runs (dup)", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string { return fmt.Sprintf("%d (%d)", r.Mixed.SlowDone, r.Mixed.SlowDup) })
	}))
	t.row("beside throttled: Redis commands per task run", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string {
			c, _ := perTask(r.Mixed)
			return fmt.Sprintf("%.1f", c)
		})
	}))
	t.row("beside throttled: Redis CPU per task run", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string {
			_, c := perTask(r.Mixed)
			return micros(c)
		})
	}))
}

// extraRows are what the throttled provider's tasks cost.
func (s *scenarioB) extraRows(t *table) {
	t.row("  Redis commands per throttled task (mixed - solo)", each(s.Results, func(r holResult) string {
		v, ok := s.extra(r, func(h holRun) float64 { return float64(h.Cmds) })
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}))
	t.row("  Redis CPU per throttled task (mixed - solo)", each(s.Results, func(r holResult) string {
		v, ok := s.extra(r, func(h holRun) float64 { return h.CPU })
		if !ok {
			return "-"
		}
		return micros(time.Duration(v * float64(time.Second)))
	}))
	t.row("  throttled provider 429s", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string { return fmt.Sprint(r.Mixed.Slow429) })
	}))
	t.row("  denials", each(s.Results, func(r holResult) string {
		return mixedOr(r, func(r holResult) string { return fmt.Sprint(r.Mixed.Denials) })
	}))
}

// printRounds shows beside / alone round by round.
func (s *scenarioB) printRounds(w io.Writer) {
	for _, r := range s.Results {
		if len(r.Rounds) == 0 {
			continue
		}
		l := make([]string, len(r.Rounds))
		for i, x := range r.Rounds {
			l[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(w, "beside / alone per round, %-5s %s  min %.2fx", r.Variant, strings.Join(l, " "), r.minRound())
		if r.Variant == vOurs {
			fmt.Fprintf(w, " %s (target >= %.2fx in every round)", verdict(r.minRound() >= targetHOL), targetHOL)
		}
		fmt.Fprintln(w)
	}
}

// printRatios compares ours with the other variants.
func (s *scenarioB) printRatios(w io.Writer, ours *holResult) {
	for _, r := range s.Results {
		if r.Variant != vOurs && r.Mixed.Runs > 0 {
			fmt.Fprintf(w, "ratio ours/%-5s  fast tasks/s beside throttled %s  (alone %s)\n", r.Variant,
				ratio(ours.Mixed.Throughput, r.Mixed.Throughput), ratio(ours.Solo.Throughput, r.Solo.Throughput))
		}
	}
	if a := find(s.Results, func(r holResult) bool { return r.Variant == vAsynq }); a != nil {
		oc, ocpu := perTask(ours.Mixed)
		ac, acpu := perTask(a.Solo)
		fmt.Fprintf(w, "ratio ours beside throttled / asynq alone, per task run: Redis commands %s, Redis CPU %s\n",
			ratio(oc, ac), ratio(float64(ocpu), float64(acpu)))
	}
}
