package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// smallCase is one drain of scenario A3: a small backlog on a limit a
// newcomer writes (PerSecond(n), its default burst of n), through one
// path.
type smallCase struct {
	Rate  int // PerSecond(Rate)
	Tasks int
	// Path: "middleware" (a backlog enqueued with a plain asynq Enqueue,
	// ByProvider defers it) or "Limiter.Enqueue" (each task enqueued for its
	// slot while the fleet runs).
	Path string

	Finished  bool
	Elapsed   time.Duration // start to the last task's call
	Deferrals int64
	Limited   int64           // provider 429s
	Order     []int           // task indexes in the order their call succeeded
	At        []time.Duration // when each of Order's calls succeeded, since the start
	Left      queueLeft
}

// Paths of scenario A3.
const (
	pathMiddleware = "middleware"
	pathEnqueue    = "Limiter.Enqueue"
)

// ideal is the drain time the limit allows: the burst at once, the rest at
// the rate.
func (c *smallCase) ideal() time.Duration {
	return time.Duration(float64(c.Tasks-c.Rate) / float64(c.Rate) * float64(time.Second))
}

// achieved is the rate after the burst: (tasks - burst) / drain time.
func (c *smallCase) achieved() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(len(c.Order)-c.Rate) / c.Elapsed.Seconds()
}

// outOfOrder counts the tasks that ran a second or more after a task
// enqueued later than them. Within a second order is not promised: asynq
// brings deferred tasks back on whole seconds, and the tasks of one second
// take their slots first come, first served.
func (c *smallCase) outOfOrder() int {
	n := 0
	for i, idx := range c.Order {
		for j := range i {
			if c.Order[j] > idx && c.At[i]-c.At[j] >= time.Second {
				n++
				break
			}
		}
	}
	return n
}

// runA3 drains small backlogs at small rates with the default burst (issue
// 20, D0 and D1: PerSecond(n) drained at n-1 per second, PerSecond(1) at
// 60 % and out of order, which A1 and A2's burst of 98 over 2,000 tasks
// never showed). The four drains run at once, each with its own fleet,
// queue, key and provider endpoint, to keep the scenario short.
func runA3(ctx context.Context, e *env) ([]*smallCase, error) {
	cases := smallCases(e.quick)
	drains := make([]*smallDrain, len(cases))
	quotas := map[string]quota{}
	for i, c := range cases {
		queue, prefix := e.names("a3", fmt.Sprintf("%d-%s", c.Rate, strings.ToLower(strings.ReplaceAll(c.Path, ".", "-"))))
		d := &smallDrain{c: c, queue: queue, prefix: prefix, endpoint: "a3-" + strconv.Itoa(i), cnt: newCounters(), done: map[int]bool{}}
		drains[i] = d
		quotas[d.endpoint] = quota{Rate: float64(c.Rate), Burst: float64(c.Rate)}
	}
	defer stopSmallDrains(e, drains)
	e.prov.reset(quotas)
	for _, d := range drains {
		if err := d.startFleet(ctx, e); err != nil {
			return cases, err
		}
	}
	// Limiter.Enqueue: one producer each, in order, while the fleet runs;
	// the drain counts from the first Enqueue.
	for _, d := range drains {
		if d.c.Path != pathEnqueue {
			continue
		}
		if err := d.enqueueWhileRunning(ctx, e); err != nil {
			return cases, err
		}
	}
	capAt := time.Now().Add(4*cases[len(cases)-1].ideal() + 10*time.Second)
	waitFor(ctx, capAt, func() bool {
		for _, d := range drains {
			if d.doneCount() < d.c.Tasks {
				return false
			}
		}
		return true
	})
	for _, d := range drains {
		d.finish(e)
		progress("A3/%d/s %s: %d/%d in %v", d.c.Rate, d.c.Path, len(d.c.Order), d.c.Tasks, d.c.Elapsed.Round(time.Millisecond))
	}
	return cases, nil
}

// smallCases are A3's drains: two small rates, each through both paths.
func smallCases(quick bool) []*smallCase {
	var cases []*smallCase
	for _, rc := range []struct{ rate, tasks int }{{5, 30}, {1, 10}} {
		if quick {
			rc.tasks = rc.tasks / 2
		}
		for _, path := range []string{pathMiddleware, pathEnqueue} {
			cases = append(cases, &smallCase{Rate: rc.rate, Tasks: rc.tasks, Path: path})
		}
	}
	return cases
}

// smallDrain is one of A3's drains under way: its own fleet, queue, key and
// provider endpoint, and the tasks whose call succeeded.
type smallDrain struct {
	c             *smallCase
	queue, prefix string
	endpoint      string
	cnt           *counters
	f             *fleet
	mu            sync.Mutex
	done          map[int]bool
	last          time.Time
	start         time.Time
}

// a3Key is the key every A3 drain throttles (each under its own prefix).
const a3Key = "api"

// stopSmallDrains stops the drains' fleets together, then removes their
// queues and keys.
func stopSmallDrains(e *env, drains []*smallDrain) {
	var wg sync.WaitGroup
	for _, d := range drains {
		if d.f != nil {
			wg.Go(d.f.stop)
		}
	}
	wg.Wait()
	for _, d := range drains {
		_ = e.cleanup(context.Background(), d.queue, d.prefix)
	}
}

// handler calls the drain's provider endpoint and records the first
// success of each task.
func (d *smallDrain) handler(e *env) func(onLimited limitedFunc) asynq.Handler {
	return func(onLimited limitedFunc) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			idx, _, err := parsePayload(t.Payload())
			if err != nil {
				return fmt.Errorf("%w: %v", asynq.SkipRetry, err)
			}
			resp, err := e.prov.call(ctx, d.endpoint)
			if err != nil {
				return err
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				return onLimited(resp)
			}
			d.mu.Lock()
			if !d.done[idx] {
				d.done[idx] = true
				d.last = time.Now()
				d.c.Order = append(d.c.Order, idx)
				d.c.At = append(d.c.At, d.last.Sub(d.start))
			}
			d.mu.Unlock()
			return nil
		})
	}
}

// startFleet sets the drain's limit and starts its fleet; on the
// middleware path, the backlog is enqueued first, in order, from one
// producer.
func (d *smallDrain) startFleet(ctx context.Context, e *env) error {
	const servers, concurrency = 2, 10
	spec := fleetSpec{
		variant: vOurs, servers: servers, concurrency: concurrency, queue: d.queue, prefix: d.prefix,
		throttleLimits: map[string][]throttle.Limit{a3Key: {throttle.PerSecond(d.c.Rate)}},
		handlers:       map[string]func(limitedFunc) asynq.Handler{"api:call": d.handler(e)},
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return err
	}
	if d.c.Path == pathMiddleware {
		client := asynq.NewClientFromRedisClient(e.ctl)
		for i := range d.c.Tasks {
			if _, err := client.EnqueueContext(ctx, smallTask(i), asynq.Queue(d.queue)); err != nil {
				return fmt.Errorf("enqueue task %d: %w", i, err)
			}
		}
	}
	f, err := startFleet(e, spec, d.cnt)
	if err != nil {
		return err
	}
	d.f, d.start = f, time.Now()
	return nil
}

func smallTask(i int) *asynq.Task { return keyedTask("api:call", payload(i), throttle.Key(a3Key)) }

// enqueueWhileRunning enqueues the drain's tasks in order through
// Limiter.Enqueue, its fleet running; the drain counts from the first.
func (d *smallDrain) enqueueWhileRunning(ctx context.Context, e *env) error {
	lim := throttle.NewLimiter(e.ctl, throttle.WithPrefix(d.prefix))
	defer lim.Close()
	client := asynq.NewClientFromRedisClient(e.ctl)
	d.start = time.Now()
	for i := range d.c.Tasks {
		if _, err := lim.Enqueue(ctx, client, smallTask(i), asynq.Queue(d.queue)); err != nil {
			return fmt.Errorf("Limiter.Enqueue task %d: %w", i, err)
		}
	}
	return nil
}

func (d *smallDrain) doneCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.done)
}

// finish records the drain's outcome in its case.
func (d *smallDrain) finish(e *env) {
	d.mu.Lock()
	d.c.Finished = len(d.done) == d.c.Tasks
	if !d.c.Finished {
		d.c.Elapsed = time.Since(d.start)
	} else {
		d.c.Elapsed = d.last.Sub(d.start)
	}
	d.mu.Unlock()
	d.c.Deferrals = d.cnt.denials.Load()
	d.c.Limited = e.prov.endpoint(d.endpoint).limited.Load()
	d.c.Left = inspectQueue(e, d.queue)
}

// printA3 prints scenario A3's table.
func printA3(w io.Writer, cases []*smallCase) {
	if len(cases) == 0 {
		return
	}
	var what []string
	for _, c := range cases {
		if c.Path == pathMiddleware {
			what = append(what, fmt.Sprintf("PerSecond(%d) x %d tasks", c.Rate, c.Tasks))
		}
	}
	fmt.Fprintf(w, "\n== A3. small rates, default burst: %s; 2 servers x concurrency 10 each; a backlog through the middleware, and Limiter.Enqueue while the fleet runs; all four at once\n",
		strings.Join(what, ", "))
	t := newTable("metric")
	for _, c := range cases {
		t.col(fmt.Sprintf("%d/s %s", c.Rate, c.Path))
	}
	t.row("drain time (ideal = (tasks - burst) / rate)", each(cases, func(c *smallCase) string {
		s := fmt.Sprintf("%s (ideal %s)", secs(c.Elapsed), secs(c.ideal()))
		if !c.Finished {
			s = fmt.Sprintf("DNF>%s, %d of %d", secs(c.Elapsed), len(c.Order), c.Tasks)
		}
		return s
	}))
	t.row("achieved rate after the burst / stated (target 1.00x)", each(cases, func(c *smallCase) string {
		return fmt.Sprintf("%.2f/s of %d/s (%.2fx)", c.achieved(), c.Rate, c.achieved()/float64(c.Rate))
	}))
	t.row("deferrals per task", each(cases, func(c *smallCase) string {
		return fmt.Sprintf("%.2f (%d)", float64(c.Deferrals)/float64(c.Tasks), c.Deferrals)
	}))
	t.row("run order (target: in order)", each(cases, func(c *smallCase) string {
		if n := c.outOfOrder(); n > 0 {
			return fmt.Sprintf("%d of %d late >= 1s", n, len(c.Order))
		}
		return "in order"
	}))
	t.row("provider 429s (target 0)", each(cases, func(c *smallCase) string { return fmt.Sprint(c.Limited) }))
	t.row("left: pending/active/sched/retry/archived", each(cases, func(c *smallCase) string { return c.Left.String() }))
	t.print(w)
	for _, c := range cases {
		if c.outOfOrder() > 0 {
			l := make([]string, len(c.Order))
			for i, idx := range c.Order {
				l[i] = fmt.Sprintf("T%02d@%.1f", idx, c.At[i].Seconds())
			}
			fmt.Fprintf(w, "run order, %d/s %s: %s\n", c.Rate, c.Path, strings.Join(l, " "))
		}
	}
	fmt.Fprintln(w, "notes: the limit is exactly PerSecond(n) as documented (burst n), the provider a strict bucket of the same numbers; the drain counts from the")
	fmt.Fprintln(w, "       fleet's start (middleware: the backlog is enqueued first) or the first Limiter.Enqueue to the last task's call. Late: a task that")
	fmt.Fprintln(w, "       ran a second or more after one enqueued later (within a second, asynq's granule, order is not promised). Issue 20's D0 and D1:")
	fmt.Fprintln(w, "       a backlog must drain at the stated rate, in order, for every burst >= 1, on both paths.")
}
