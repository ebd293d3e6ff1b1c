package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// overheadRun is one run of scenario D.
type overheadRun struct {
	Runs        int
	cmds        int64
	cpu         float64 // Redis CPU seconds
	CPUPerTask  time.Duration
	Variant     string
	Concurrency int
	Finished    bool
	Done, Dup   int
	Elapsed     time.Duration
	PerSec      float64
	CmdsPerTask float64
}

// add sums r into o; rates are over the summed time.
func (o *overheadRun) add(r overheadRun) {
	o.Runs++
	o.Finished = o.Finished && r.Finished
	o.Done += r.Done
	o.Dup += r.Dup
	o.Elapsed += r.Elapsed
	o.cmds += r.cmds
	o.cpu += r.cpu
	if o.Elapsed > 0 {
		o.PerSec = float64(o.Done) / o.Elapsed.Seconds()
	}
	if o.Done > 0 {
		o.CmdsPerTask = float64(o.cmds) / float64(o.Done)
		o.CPUPerTask = time.Duration(o.cpu / float64(o.Done) * float64(time.Second))
	}
}

type scenarioD struct {
	Tasks   int
	Cap     time.Duration
	Results []overheadRun
}

func runD(ctx context.Context, e *env, w io.Writer) (*scenarioD, error) {
	// A run of 5000 tasks lasts about half a second, and on a shared 2-core
	// machine two such runs differ by more than the overhead measured; more
	// tasks and three runs each keep the noise below it.
	s := &scenarioD{Tasks: 20000, Cap: 120 * time.Second}
	if e.quick {
		s.Tasks = 2000
	}
	fmt.Fprintf(w, "\n== D. overhead: %d trivial tasks, one server, asynq alone vs worker.NewServer + ByProvider (limit %d/s, never binds)\n", s.Tasks, cRate)
	for _, conc := range []int{10, 100} {
		// asynq, ours, ours, asynq, asynq, ours: outside load drifts alike
		// on both.
		sum := map[string]*overheadRun{}
		for _, v := range []string{vAsynq, vOurs, vOurs, vAsynq, vAsynq, vOurs} {
			r, err := overheadOnce(ctx, e, s, v, conc)
			if err != nil {
				return s, fmt.Errorf("D/%s/%d: %w", v, conc, err)
			}
			if sum[v] == nil {
				sum[v] = &overheadRun{Variant: v, Concurrency: conc, Finished: true}
			}
			sum[v].add(r)
		}
		for _, v := range []string{vAsynq, vOurs} {
			progress("D/%s concurrency %d: %.0f tasks/s", v, conc, sum[v].PerSec)
			s.Results = append(s.Results, *sum[v])
		}
	}
	s.print(w)
	return s, nil
}

func overheadOnce(ctx context.Context, e *env, s *scenarioD, variant string, conc int) (overheadRun, error) {
	queue, prefix := e.names("d", variant)
	defer func() { _ = e.cleanup(context.Background(), queue, prefix) }()
	set := newTaskSet(s.Tasks)
	spec := fleetSpec{
		variant: variant, servers: 1, concurrency: conc, queue: queue, prefix: prefix,
		limits:   map[string]quota{"d": {Rate: cRate, Burst: cRate}},
		handlers: map[string]func(limitedFunc) asynq.Handler{"d:noop": noopHandler(set)},
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return overheadRun{}, err
	}
	err := enqueue(ctx, e, queue, s.Tasks, func(i int) *asynq.Task {
		return keyedTask("d:noop", payload(i), throttle.Key("d"))
	})
	if err != nil {
		return overheadRun{}, err
	}
	fr, err := runFleetUntil(ctx, e, spec, newCounters(), s.Cap, set.finished)
	if err != nil {
		return overheadRun{}, err
	}
	r := overheadRun{Variant: variant, Concurrency: conc, Finished: fr.finished,
		Done: int(set.done.Load()), Dup: set.duplicates(), Elapsed: set.elapsed(fr.start)}
	if !fr.finished {
		r.Elapsed = s.Cap
	}
	if r.Elapsed > 0 {
		r.PerSec = float64(r.Done) / r.Elapsed.Seconds()
	}
	r.cmds, r.cpu = fr.cmds, fr.cpu
	return r, nil
}

func (s *scenarioD) print(w io.Writer) {
	t := newTable("concurrency", "asynq tasks/s", "ours tasks/s", "ours/asynq (target >= 0.95)", "cmds/task asynq", "cmds/task ours", "Redis CPU/task asynq", "ours", "done asynq", "done ours")
	for _, c := range []int{10, 100} {
		a := find(s.Results, func(r overheadRun) bool { return r.Variant == vAsynq && r.Concurrency == c })
		o := find(s.Results, func(r overheadRun) bool { return r.Variant == vOurs && r.Concurrency == c })
		if a == nil || o == nil {
			continue
		}
		t.row(strconv.Itoa(c), []string{fmt.Sprintf("%.0f", a.PerSec), fmt.Sprintf("%.0f", o.PerSec),
			ratio(o.PerSec, a.PerSec), fmt.Sprintf("%.1f", a.CmdsPerTask), fmt.Sprintf("%.1f", o.CmdsPerTask),
			a.CPUPerTask.Round(100 * time.Nanosecond).String(), o.CPUPerTask.Round(100 * time.Nanosecond).String(),
			fmt.Sprintf("%dx %s", a.Runs, onceness(a.Done, a.Runs*s.Tasks, a.Dup)),
			fmt.Sprintf("%dx %s", o.Runs, onceness(o.Done, o.Runs*s.Tasks, o.Dup))})
	}
	t.print(w)
	fmt.Fprintln(w, "notes: tasks/s = tasks / (server start to the last task done), three runs each (asynq, ours, ours, asynq, asynq, ours);")
	fmt.Fprintln(w, "       tasks are enqueued before the server starts; cmds/task = INFO commandstats delta per task;")
	fmt.Fprintln(w, "       Redis CPU/task = redis-server used_cpu_user+sys (INFO cpu) delta per task.")
}
