package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario T, tenants (issue 23): fair shares among the tenants of one
// key. One key at PerSecond(40) (its default burst, 40), a fleet of 3
// servers x concurrency 8, tasks that call one provider endpoint, and
// three ways to share the key between tenants:
//
//   - fair: the tasks carry throttle.Tenant; while several tenants have
//     work booked each gets rate x w_i / sum(w) (start-time fair queuing).
//   - fifo: the same key, tasks without a Tenant (the default tenant:
//     first booked, first served, as before issue 23).
//   - caps: per-tenant caps as peers offer them: each tenant its own key
//     at rate x w_i / sum(w) (PerSecond, its default burst), no Tenant.
//
// Three cases: T1 a light tenant arriving behind a heavy tenant's backlog,
// T2 weights 3:1, T3 a 30:1 skew in backlogs at equal weights.

// Scenario T's variants, in the order they run.
const (
	tFair = "fair"
	tFIFO = "fifo"
	tCaps = "caps"
)

var tVariants = []string{tFair, tFIFO, tCaps}

// tCaseNames are scenario T's cases, as -t-cases names them.
var tCaseNames = []string{"t1", "t2", "t3"}

// Scenario T's fixed shape: one key at tRate/s (burst tRate), a fleet of
// tServers x tConcurrency, one provider endpoint counting the calls.
const (
	tRate        = 40
	tServers     = 3
	tConcurrency = 8
	tKey         = "crm"
	tEndpoint    = "t-crm"
	tListRuns    = 40 // the run times of a tenant of at most this many tasks are printed (fair)
)

// Scenario T's targets (issue 23).
const (
	targetLightDone    = 4500 * time.Millisecond // T1 fair: light's last run after its enqueue
	targetLightSpeedup = 3.0                     // T1: fifo's light time over fair's, at least
	targetDrainVsFIFO  = 1.05                    // T1 fair: total drain over fifo's, at most (work conserving)
	targetTDeferrals   = 1.3                     // T1 fair: deferrals per task, at most
	targetGoldShare    = 0.75                    // T2 fair: gold's share while both wait, within targetGoldTol
	targetGoldTol      = 0.05
	targetSkewShare    = 0.95 // T3 fair: B's share while both wait over its fair share, at least
)

// tTenant is one tenant of a case: its backlog, its weight, and when it
// enqueues (after the case's first enqueue).
type tTenant struct {
	Name   string
	Tasks  int
	Weight int
	After  time.Duration
}

// tCase is one case of scenario T.
type tCase struct {
	Name    string
	Title   string
	Tenants []tTenant
}

// tCases are T1-T3; -quick makes the backlogs smaller (and T1's light
// tenant comes after 2 s).
func tCases(quick bool) []tCase {
	heavy, light, lightAfter := 600, 40, 3*time.Second
	each, big, small := 300, 600, 20
	if quick {
		heavy, light, lightAfter = 200, 20, 2*time.Second
		each, big, small = 60, 120, 6
	}
	return []tCase{
		{Name: "T1", Title: fmt.Sprintf(`light behind heavy: tenant "heavy" enqueues %d tasks, %v later tenant "light" enqueues %d`, heavy, lightAfter, light),
			Tenants: []tTenant{{Name: "heavy", Tasks: heavy, Weight: 1}, {Name: "light", Tasks: light, Weight: 1, After: lightAfter}}},
		{Name: "T2", Title: fmt.Sprintf(`weights 3:1: SetWeights(gold: 3), tenants "gold" and "plain" enqueue %d tasks each at once (interleaved)`, each),
			Tenants: []tTenant{{Name: "gold", Tasks: each, Weight: 3}, {Name: "plain", Tasks: each, Weight: 1}}},
		{Name: "T3", Title: fmt.Sprintf(`skew %d:1: tenants "a" (%d tasks) and "b" (%d) enqueued together (b's spread evenly among a's), equal weights`, big/small, big, small),
			Tenants: []tTenant{{Name: "a", Tasks: big, Weight: 1}, {Name: "b", Tasks: small, Weight: 1}}},
	}
}

// weightSum is the sum of the tenants' weights.
func (c tCase) weightSum() int {
	n := 0
	for _, tn := range c.Tenants {
		n += tn.Weight
	}
	return n
}

// tasks is the number of tasks of every tenant.
func (c tCase) tasks() int {
	n := 0
	for _, tn := range c.Tenants {
		n += tn.Tasks
	}
	return n
}

// capRate is tenant tn's own key's rate under caps: its weighted part of
// the key's rate.
func (c tCase) capRate(tn tTenant) int { return tRate * tn.Weight / c.weightSum() }

// capKey is tenant tn's own key under caps.
func capKey(tn tTenant) string { return tKey + "-" + tn.Name }

// limits are the variant's keys and limits.
func (c tCase) limits(variant string) map[string][]throttle.Limit {
	if variant != tCaps {
		return map[string][]throttle.Limit{tKey: {throttle.PerSecond(tRate)}}
	}
	m := map[string][]throttle.Limit{}
	for _, tn := range c.Tenants {
		m[capKey(tn)] = []throttle.Limit{throttle.PerSecond(c.capRate(tn))}
	}
	return m
}

// ideal is the drain time the variant's limits allow: each key's burst at
// once, the rest at its rate, and no sooner than the last tenant comes.
func (c tCase) ideal(variant string) time.Duration {
	var ideal float64
	if variant == tCaps {
		for _, tn := range c.Tenants {
			r := float64(c.capRate(tn))
			ideal = max(ideal, tn.After.Seconds()+float64(max(tn.Tasks-int(r), 0))/r)
		}
	} else {
		ideal = float64(c.tasks()-tRate) / tRate
		for _, tn := range c.Tenants {
			ideal = max(ideal, tn.After.Seconds())
		}
	}
	return time.Duration(ideal * float64(time.Second))
}

// task is tenant tn's task idx under the variant: its type names the
// tenant (the handler and the deferral count read it), its key is the
// shared one or the tenant's own, and fair adds its Tenant.
func (c tCase) task(variant string, tn tTenant, idx int) *asynq.Task {
	opts := []asynq.Option{throttle.Key(tKey)}
	switch variant {
	case tFair:
		opts = append(opts, throttle.Tenant(tn.Name))
	case tCaps:
		opts = []asynq.Option{throttle.Key(capKey(tn))}
	}
	return keyedTask(tTaskType(tn.Name), []byte(strconv.Itoa(idx)), opts...)
}

func tTaskType(tenant string) string { return tKey + ":" + tenant }

// tenantResult is what one tenant got in one run.
type tenantResult struct {
	Name      string
	Tasks     int
	Weight    int
	Completed int
	// Enqueued is when its enqueue began, since the case's first enqueue;
	// Took is from there to its last task's run.
	Enqueued, Took time.Duration
	// Decided is when its last task was first decided (the limiter had
	// seen them all), since its enqueue; -1 if some never were.
	Decided   time.Duration
	Deferrals int64
	// RunsAt are its runs since its enqueue, for a tenant of at most
	// tListRuns tasks.
	RunsAt []time.Duration
	// Share is its part of the runs while every tenant waits (the run's
	// Window), and SteadyShare the same without the first burst (the
	// key's first tRate runs); FairShare its weight over the sum of
	// weights.
	Share, SteadyShare, FairShare float64
}

// tenantsRun is one variant on one case of scenario T.
type tenantsRun struct {
	Variant  string
	Case     string
	Finished bool
	// Drain is from the first enqueue to the last run; Ideal what the
	// variant's limits allow.
	Drain, Ideal time.Duration
	Tenants      []tenantResult
	// Window is while every tenant waits: from the last tenant's enqueue to
	// the first tenant's last run (since the first enqueue); WindowRuns the
	// runs in it.
	WindowFrom, WindowTo time.Duration
	WindowRuns           int
	// SteadyFrom is when the first burst was spent (the key's run number
	// tRate + 1), or WindowFrom if later; SteadyRuns the runs from there to
	// WindowTo.
	SteadyFrom   time.Duration
	SteadyRuns   int
	Deferrals    int64
	DeferralsPer float64
	// PacedWorkers is how many workers, on average from the first enqueue
	// to the last run, held an admitted task waiting for its instant.
	PacedWorkers float64
	Calls        int64
	Duplicates   int
	Failed       int64
	// Most1s is the most calls in any 1 s; Worst the window of calls
	// furthest above (or least below) burst + rate x span, on the
	// harness's clock at the handler.
	Most1s int
	Worst  windowResult
	Left   queueLeft
	// Inspect is fair's Limiter.Inspect of the key, 1 s after the last
	// tenant's enqueue.
	Inspect string
}

type scenarioT struct {
	Rate, Burst          int
	Servers, Concurrency int
	Cases                []tCase
	Results              []tenantsRun
}

func runT(ctx context.Context, e *env, w io.Writer) (*scenarioT, error) {
	s := &scenarioT{Rate: tRate, Burst: tRate, Servers: tServers, Concurrency: tConcurrency}
	for _, c := range tCases(e.quick) {
		if slices.Contains(e.tCases, strings.ToLower(c.Name)) {
			s.Cases = append(s.Cases, c)
		}
	}
	fmt.Fprintf(w, "\n== T. tenants (issue 23): one key at PerSecond(%d) (burst %d), %d servers x concurrency %d, every task one call to the provider\n",
		tRate, tRate, tServers, tConcurrency)
	fmt.Fprintln(w, "   fair: tasks carry throttle.Tenant (weighted fair shares); fifo: the same key, tasks without a Tenant (first booked, first served);")
	fmt.Fprintln(w, "   caps: each tenant its own key at rate x weight / sum of weights (PerSecond, its default burst), no Tenant")
	for _, c := range s.Cases {
		for _, v := range e.tVariants {
			r, err := tenantsOnce(ctx, e, c, v)
			if err != nil {
				return s, fmt.Errorf("T/%s/%s: %w", c.Name, v, err)
			}
			progress("T/%s/%s: %d/%d in %v, %.2f deferrals per task", c.Name, v, r.completed(), c.tasks(), r.Drain.Round(time.Millisecond), r.DeferralsPer)
			s.Results = append(s.Results, r)
			if ctx.Err() != nil {
				return s, ctx.Err()
			}
		}
	}
	s.print(w)
	return s, nil
}

// tLedger records one run's provider calls and each task's first success,
// on the harness's clock since the case's first enqueue.
type tLedger struct {
	mu    sync.Mutex
	start time.Time
	calls []float64 // every call, seconds
	runs  []tRunAt  // first successes, in the order recorded
	seen  map[string]int
	// decided is each task's first decision (any outcome), by task ID;
	// deferred the Deferred events by tenant.
	decided  map[string]tRunAt
	deferred map[string]int64
	// paced is the time admitted tasks waited in their workers for their
	// instant (Event.Wait), summed.
	paced time.Duration
}

// tRunAt is one task's first success.
type tRunAt struct {
	tenant string
	at     time.Duration
}

func newTLedger() *tLedger {
	return &tLedger{seen: map[string]int{}, decided: map[string]tRunAt{}, deferred: map[string]int64{}}
}

// event records a middleware event: the task's first decision, and the
// deferrals of its tenant (its task type names it).
func (l *tLedger) event(ev throttle.Event) {
	tenant := strings.TrimPrefix(ev.TaskType, tKey+":")
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ev.Outcome {
	case throttle.Deferred:
		l.deferred[tenant]++
	case throttle.Ran:
		l.paced += ev.Wait
	}
	if _, ok := l.decided[ev.TaskID]; !ok {
		l.decided[ev.TaskID] = tRunAt{tenant: tenant, at: time.Since(l.start)}
	}
}

// handler is tenant's task: one call to the provider, recorded.
func (l *tLedger) handler(p *provider, tenant string) func(limitedFunc) asynq.Handler {
	return func(onLimited limitedFunc) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			idx, err := strconv.Atoi(string(t.Payload()))
			if err != nil {
				return fmt.Errorf("%w: bad payload %q", asynq.SkipRetry, t.Payload())
			}
			at := time.Now()
			resp, err := p.call(ctx, tEndpoint)
			if err != nil {
				return err
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				return onLimited(resp)
			}
			l.record(tenant, idx, at)
			return nil
		})
	}
}

func (l *tLedger) record(tenant string, idx int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := at.Sub(l.start)
	l.calls = append(l.calls, since.Seconds())
	id := tenant + "/" + strconv.Itoa(idx)
	l.seen[id]++
	if l.seen[id] == 1 {
		l.runs = append(l.runs, tRunAt{tenant: tenant, at: since})
	}
}

func (l *tLedger) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

func tenantsOnce(ctx context.Context, e *env, c tCase, variant string) (tenantsRun, error) {
	queue, prefix := e.names("t", c.Name+"-"+variant)
	defer func() { _ = e.cleanup(context.Background(), queue, prefix) }()
	e.prov.reset(nil)
	led := newTLedger()
	cnt := newCounters()
	cnt.tap = led.event
	spec := fleetSpec{
		variant: vOurs, servers: tServers, concurrency: tConcurrency, queue: queue, prefix: prefix,
		throttleLimits: c.limits(variant),
		handlers:       map[string]func(limitedFunc) asynq.Handler{},
	}
	for _, tn := range c.Tenants {
		spec.handlers[tTaskType(tn.Name)] = led.handler(e.prov, tn.Name)
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return tenantsRun{}, err
	}
	lim := throttle.NewLimiter(e.ctl, throttle.WithPrefix(prefix))
	defer lim.Close()
	if variant == tFair {
		weights := map[string]int{}
		for _, tn := range c.Tenants {
			if tn.Weight != 1 {
				weights[tn.Name] = tn.Weight
			}
		}
		if len(weights) > 0 {
			if err := lim.SetWeights(ctx, tKey, weights); err != nil {
				return tenantsRun{}, err
			}
		}
	}
	f, err := startFleet(e, spec, cnt)
	if err != nil {
		return tenantsRun{}, err
	}
	r := tenantsRun{Variant: variant, Case: c.Name, Ideal: c.ideal(variant)}
	enqueued, err := c.enqueueAll(ctx, e, variant, queue, led)
	if err != nil {
		f.stop()
		return r, err
	}
	if variant == tFair {
		r.Inspect = inspectTenants(ctx, lim, led.start.Add(enqueued[len(enqueued)-1]+time.Second))
	}
	capAt := led.start.Add(2*r.Ideal + 15*time.Second)
	r.Finished = waitFor(ctx, capAt, func() bool { return led.done() >= c.tasks() })
	f.stop()
	r.Failed, r.Deferrals = cnt.failed.Load(), cnt.denials.Load()
	r.Calls = e.prov.endpoint(tEndpoint).calls.Load()
	r.Left = inspectQueue(e, queue)
	r.fromLedger(c, led, enqueued)
	return r, nil
}

// enqueueAll enqueues each tenant's tasks at its time (tenants of the same
// time interleaved, each spread evenly over the sequence), from 16
// producers, and returns when each tenant's enqueue began since the first.
// The ledger's clock starts at the first enqueue.
func (c tCase) enqueueAll(ctx context.Context, e *env, variant, queue string, led *tLedger) ([]time.Duration, error) {
	client := asynq.NewClientFromRedisClient(e.ctl)
	enqueued := make([]time.Duration, len(c.Tenants))
	led.mu.Lock()
	led.start = time.Now()
	led.mu.Unlock()
	var afters []time.Duration
	for _, tn := range c.Tenants {
		if !slices.Contains(afters, tn.After) {
			afters = append(afters, tn.After)
		}
	}
	slices.Sort(afters)
	for _, after := range afters {
		if d := time.Until(led.start.Add(after)); d > 0 {
			if err := sleepCtx(ctx, d); err != nil {
				return nil, err
			}
		}
		var group []int
		for i, tn := range c.Tenants {
			if tn.After == after {
				group = append(group, i)
			}
		}
		seq := spreadTenants(c.Tenants, group)
		began := time.Since(led.start)
		for _, i := range group {
			enqueued[i] = began
		}
		err := enqueueWith(ctx, len(seq), func(ctx context.Context, k int) error {
			tn := c.Tenants[seq[k].tenant]
			_, err := client.EnqueueContext(ctx, c.task(variant, tn, seq[k].idx), asynq.Queue(queue))
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return enqueued, nil
}

// tSlot is one task of an enqueue sequence: tenant (an index) and its task.
type tSlot struct{ tenant, idx int }

// spreadTenants orders the tasks of the tenants in group so that each
// tenant's are spread evenly over the sequence: task k of a tenant of n
// sits at (k + 1/2) / n, ties in the group's order.
func spreadTenants(tenants []tTenant, group []int) []tSlot {
	type placed struct {
		pos float64
		s   tSlot
	}
	var all []placed
	for _, i := range group {
		n := tenants[i].Tasks
		for k := range n {
			all = append(all, placed{(float64(k) + 0.5) / float64(n), tSlot{i, k}})
		}
	}
	slices.SortStableFunc(all, func(a, b placed) int {
		switch {
		case a.pos < b.pos:
			return -1
		case a.pos > b.pos:
			return 1
		}
		return 0
	})
	out := make([]tSlot, len(all))
	for k, p := range all {
		out[k] = p.s
	}
	return out
}

// inspectTenants reads the key's tenants at when: name, weight, share,
// backlog and work admitted.
func inspectTenants(ctx context.Context, lim *throttle.Limiter, when time.Time) string {
	if err := sleepCtx(ctx, time.Until(when)); err != nil {
		return "-"
	}
	st, err := lim.Inspect(ctx, tKey)
	if err != nil {
		return "inspect: " + err.Error()
	}
	if len(st.Tenants) == 0 {
		return "no tenant with work booked"
	}
	parts := make([]string, len(st.Tenants))
	for i, tn := range st.Tenants {
		parts[i] = fmt.Sprintf("%s weight %d share %.2f backlog %.0f admitted %d", tn.Name, tn.Weight, tn.Share, tn.Backlog, tn.Admitted)
	}
	return strings.Join(parts, "; ")
}

// fromLedger fills in what the ledger says: each tenant's completion,
// share while every tenant waits and deferrals, the drain, and the key's
// bound over the calls.
func (r *tenantsRun) fromLedger(c tCase, led *tLedger, enqueued []time.Duration) {
	led.mu.Lock()
	defer led.mu.Unlock()
	runs := slices.Clone(led.runs)
	slices.SortStableFunc(runs, func(a, b tRunAt) int { return cmp.Compare(a.at, b.at) })
	for _, n := range led.seen {
		if n > 1 {
			r.Duplicates++
		}
	}
	for i, tn := range c.Tenants {
		tr := tenantResult{Name: tn.Name, Tasks: tn.Tasks, Weight: tn.Weight, Enqueued: enqueued[i],
			Deferrals: led.deferred[tn.Name], FairShare: float64(tn.Weight) / float64(c.weightSum())}
		var last time.Duration
		for _, run := range runs {
			if run.tenant == tn.Name {
				tr.Completed++
				last = run.at
				if tn.Tasks <= tListRuns {
					tr.RunsAt = append(tr.RunsAt, run.at-tr.Enqueued)
				}
			}
		}
		seen := 0
		for _, d := range led.decided {
			if d.tenant == tn.Name {
				seen++
				tr.Decided = max(tr.Decided, d.at-tr.Enqueued)
			}
		}
		if seen < tn.Tasks {
			tr.Decided = -1
		}
		tr.Took = last - tr.Enqueued
		if tr.Completed == 0 {
			tr.Took = 0
		}
		r.Tenants = append(r.Tenants, tr)
	}
	if len(runs) > 0 {
		r.Drain = runs[len(runs)-1].at
		r.PacedWorkers = led.paced.Seconds() / r.Drain.Seconds()
	}
	r.WindowFrom, r.WindowTo = bothWait(r.Tenants)
	shares, n := sharesIn(runs, r.WindowFrom, r.WindowTo)
	r.WindowRuns = n
	r.SteadyFrom = r.WindowFrom
	if len(runs) > tRate {
		r.SteadyFrom = max(r.SteadyFrom, runs[tRate].at)
	}
	steady, m := sharesIn(runs, r.SteadyFrom, r.WindowTo)
	r.SteadyRuns = m
	for i := range r.Tenants {
		r.Tenants[i].Share = shares[r.Tenants[i].Name]
		r.Tenants[i].SteadyShare = steady[r.Tenants[i].Name]
	}
	if done := r.completed(); done > 0 {
		r.DeferralsPer = float64(r.Deferrals) / float64(done)
	}
	adm := make([]admission, len(led.calls))
	for i, t := range led.calls {
		adm[i] = admission{t: t}
	}
	r.Most1s = mostWithin(led.calls, 1)
	r.Worst = worstWindow(adm, tierSchedule{name: "key", steps: []tierStep{{rate: tRate, burst: tRate}}})
}

// bothWait is the window while every tenant waits: from the last
// tenant's enqueue to the first tenant's last run (a tenant that did not
// finish ends it nowhere).
func bothWait(ts []tenantResult) (from, to time.Duration) {
	to = -1
	for _, t := range ts {
		from = max(from, t.Enqueued)
		if t.Completed == t.Tasks && t.Completed > 0 {
			if end := t.Enqueued + t.Took; to < 0 || end < to {
				to = end
			}
		}
	}
	return from, to
}

// sharesIn is each tenant's part of the runs in [from, to], and how many
// runs that is.
func sharesIn(runs []tRunAt, from, to time.Duration) (map[string]float64, int) {
	by := map[string]int{}
	n := 0
	for _, run := range runs {
		if run.at >= from && run.at <= to {
			by[run.tenant]++
			n++
		}
	}
	shares := map[string]float64{}
	for t, k := range by {
		shares[t] = float64(k) / float64(n)
	}
	return shares, n
}

// mostWithin is the most instants of ts (seconds, any order) in any
// window shorter than span.
func mostWithin(ts []float64, span float64) int {
	s := slices.Clone(ts)
	slices.Sort(s)
	best, j := 0, 0
	for i := range s {
		for j < len(s) && s[j]-s[i] < span {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

func (r tenantsRun) completed() int {
	n := 0
	for _, t := range r.Tenants {
		n += t.Completed
	}
	return n
}

func (r tenantsRun) tenant(name string) *tenantResult {
	return find(r.Tenants, func(t tenantResult) bool { return t.Name == name })
}

func (s *scenarioT) print(w io.Writer) {
	for _, c := range s.Cases {
		var rs []tenantsRun
		for _, r := range s.Results {
			if r.Case == c.Name {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		fifo := find(rs, func(r tenantsRun) bool { return r.Variant == tFIFO })
		fmt.Fprintf(w, "-- %s. %s; %d tasks\n", c.Name, c.Title, c.tasks())
		t := newTable("metric")
		for _, r := range rs {
			t.col(r.Variant)
		}
		for _, tn := range c.Tenants {
			printTenantRows(t, c, tn, rs, fifo)
		}
		t.row("total drain (first enqueue to the last run)", each(rs, func(r tenantsRun) string {
			if !r.Finished {
				return "DNF>" + secs(r.Drain)
			}
			return secs(r.Drain)
		}))
		if fifo != nil {
			t.row("  / fifo", each(rs, func(r tenantsRun) string { return ratio(r.Drain.Seconds(), fifo.Drain.Seconds()) }))
		}
		t.row("  / ideal (each key's burst at once, then its rate)", each(rs, func(r tenantsRun) string {
			return fmt.Sprintf("%s of %s", ratio(r.Drain.Seconds(), r.Ideal.Seconds()), secs(r.Ideal))
		}))
		t.row("runs while every tenant waits (the window of the shares)", each(rs, func(r tenantsRun) string {
			if r.WindowTo < 0 {
				return "-"
			}
			return fmt.Sprintf("%d in %.2f-%.2fs", r.WindowRuns, r.WindowFrom.Seconds(), r.WindowTo.Seconds())
		}))
		t.row("  after the first burst", each(rs, func(r tenantsRun) string {
			if r.WindowTo < 0 || r.SteadyRuns == 0 {
				return "-"
			}
			return fmt.Sprintf("%d in %.2f-%.2fs", r.SteadyRuns, r.SteadyFrom.Seconds(), r.WindowTo.Seconds())
		}))
		label := "deferrals per task"
		if c.Name == "T1" {
			label = fmt.Sprintf("deferrals per task (target <= %.1f, fair)", targetTDeferrals)
		}
		t.row(label, each(rs, func(r tenantsRun) string { return fmt.Sprintf("%.2f (%d)", r.DeferralsPer, r.Deferrals) }))
		t.row(fmt.Sprintf("workers holding a task paced to its instant, mean (of %d)", tServers*tConcurrency), each(rs, func(r tenantsRun) string {
			return fmt.Sprintf("%.1f", r.PacedWorkers)
		}))
		t.row(fmt.Sprintf("most calls in any 1 s (at most burst + rate x 1 s = %d)", 2*tRate), each(rs, func(r tenantsRun) string { return fmt.Sprint(r.Most1s) }))
		t.row("worst window: calls - (burst + rate x span) (<= 0 holds)", each(rs, func(r tenantsRun) string {
			return fmt.Sprintf("%+.2f (%d in %.2fs)", r.Worst.Excess, r.Worst.Count, r.Worst.Span)
		}))
		t.row(fmt.Sprintf("completed (of %d), exactly once", c.tasks()), each(rs, func(r tenantsRun) string {
			return onceness(r.completed(), c.tasks(), r.Duplicates)
		}))
		t.row("  provider calls", each(rs, func(r tenantsRun) string { return fmt.Sprint(r.Calls) }))
		t.row("  decisions Redis could not make", each(rs, func(r tenantsRun) string { return fmt.Sprint(r.Failed) }))
		t.row("left: pending/active/sched/retry/archived", each(rs, func(r tenantsRun) string { return r.Left.String() }))
		t.print(w)
		if fair := find(rs, func(r tenantsRun) bool { return r.Variant == tFair }); fair != nil && fair.Inspect != "" {
			fmt.Fprintf(w, "fair: Inspect(%q) 1 s after the last tenant's enqueue: %s\n", tKey, fair.Inspect)
		}
		printTTargets(w, c, rs)
		if fair := find(rs, func(r tenantsRun) bool { return r.Variant == tFair }); fair != nil {
			for _, tr := range fair.Tenants {
				if len(tr.RunsAt) > 0 {
					fmt.Fprintf(w, "fair: %s's runs, s after its enqueue: %s\n", tr.Name, strings.Join(each(tr.RunsAt, func(d time.Duration) string {
						return fmt.Sprintf("%.2f", d.Seconds())
					}), " "))
				}
			}
		}
	}
	printTNotes(w)
}

// printTenantRows adds tenant tn's rows: its completion, its share while
// every tenant waits, its deferrals.
func printTenantRows(t *table, c tCase, tn tTenant, rs []tenantsRun, fifo *tenantsRun) {
	at := ""
	if tn.After > 0 {
		at = fmt.Sprintf(", at +%v", tn.After)
	}
	t.row(fmt.Sprintf("%s (%d tasks, weight %d%s): last run after its enqueue", tn.Name, tn.Tasks, tn.Weight, at), each(rs, func(r tenantsRun) string {
		tr := r.tenant(tn.Name)
		if tr.Completed < tr.Tasks {
			return fmt.Sprintf("DNF, %d of %d", tr.Completed, tr.Tasks)
		}
		return secs(tr.Took)
	}))
	if fifo != nil {
		t.row("  / fifo", each(rs, func(r tenantsRun) string {
			return ratio(r.tenant(tn.Name).Took.Seconds(), fifo.tenant(tn.Name).Took.Seconds())
		}))
	}
	t.row("  every task first decided by (after its enqueue)", each(rs, func(r tenantsRun) string {
		if d := r.tenant(tn.Name).Decided; d >= 0 {
			return secs(d)
		}
		return "-"
	}))
	fair := float64(tn.Weight) / float64(c.weightSum())
	t.row(fmt.Sprintf("  share while every tenant waits (fair share %.2f)", fair), each(rs, func(r tenantsRun) string {
		if r.WindowTo < 0 {
			return "-"
		}
		s := r.tenant(tn.Name).Share
		return fmt.Sprintf("%.3f (%.2fx)", s, s/fair)
	}))
	t.row(fmt.Sprintf("    after the first burst (runs %d on)", tRate+1), each(rs, func(r tenantsRun) string {
		if r.WindowTo < 0 || r.SteadyRuns == 0 {
			return "-"
		}
		s := r.tenant(tn.Name).SteadyShare
		return fmt.Sprintf("%.3f (%.2fx)", s, s/fair)
	}))
	t.row("  deferrals per task", each(rs, func(r tenantsRun) string {
		tr := r.tenant(tn.Name)
		return fmt.Sprintf("%.2f", float64(tr.Deferrals)/float64(max(tr.Completed, 1)))
	}))
}

// printTTargets marks issue 23's targets of case c met or missed.
func printTTargets(w io.Writer, c tCase, rs []tenantsRun) {
	fair := find(rs, func(r tenantsRun) bool { return r.Variant == tFair })
	fifo := find(rs, func(r tenantsRun) bool { return r.Variant == tFIFO })
	if fair == nil {
		return
	}
	bound := fmt.Sprintf("key bound: worst window %+.2f %s", fair.Worst.Excess, verdict(fair.Worst.Excess <= 0))
	switch c.Name {
	case "T1":
		light := fair.tenant("light")
		lightOK := light.Completed == light.Tasks
		fmt.Fprintf(w, "targets T1 fair: light done %s after its enqueue %s (<= %v)", secs(light.Took), verdict(lightOK && light.Took <= targetLightDone), targetLightDone)
		if fifo != nil {
			speed := fifo.tenant("light").Took.Seconds() / light.Took.Seconds()
			drain := fair.Drain.Seconds() / fifo.Drain.Seconds()
			fmt.Fprintf(w, "; %.2fx faster than fifo %s (>= %.0fx); drain %.2fx fifo's %s (<= %.2fx)",
				speed, verdict(lightOK && speed >= targetLightSpeedup), targetLightSpeedup, drain, verdict(fair.Finished && drain <= targetDrainVsFIFO), targetDrainVsFIFO)
		}
		fmt.Fprintf(w, "; deferrals per task %.2f %s (<= %.1f); %s\n", fair.DeferralsPer, verdict(fair.DeferralsPer <= targetTDeferrals), targetTDeferrals, bound)
	case "T2":
		gold := fair.tenant("gold")
		fmt.Fprintf(w, "targets T2 fair: gold's share while both wait %.3f %s (%.2f +- %.2f; %.3f after the first burst); %s\n", gold.Share,
			verdict(fair.WindowTo >= 0 && gold.Share >= targetGoldShare-targetGoldTol && gold.Share <= targetGoldShare+targetGoldTol),
			targetGoldShare, targetGoldTol, gold.SteadyShare, bound)
	case "T3":
		b := fair.tenant("b")
		fmt.Fprintf(w, "targets T3 fair: b's share while both wait / its fair share %.2fx %s (>= %.2fx; %.2fx after the first burst); %s\n", b.Share/b.FairShare,
			verdict(fair.WindowTo >= 0 && b.Share/b.FairShare >= targetSkewShare), targetSkewShare, b.SteadyShare/b.FairShare, bound)
	}
}

func printTNotes(w io.Writer) {
	fmt.Fprintln(w, "notes: times since the case's first enqueue (the fleet runs before it); a run is a task's first successful call, timed at its handler.")
	fmt.Fprintln(w, "       while every tenant waits = from the last tenant's enqueue to the first tenant's last run; a tenant's share = its runs in that window")
	fmt.Fprintln(w, "       over all runs in it (the first burst included: its tasks are dequeued in enqueue order). Deferrals: Deferred events, by task type.")
	fmt.Fprintln(w, "       key bound: every window [t_i, t_j] between two calls holds at most burst + rate x (t_j - t_i) calls (caps: the sum of its keys');")
	fmt.Fprintln(w, "       the calls are timed at the handler, after the decision, so dispatch jitter can show as a call of excess. The provider only counts.")
	fmt.Fprintln(w, "       paced: the Wait of Ran events summed, over the drain: a worker holding an admitted task until its instant dequeues nothing else")
	fmt.Fprintln(w, "       meanwhile (a tenant's newly enqueued tasks wait in pending). fair's run times list a small tenant's runs (asynq brings deferred")
	fmt.Fprintln(w, "       tasks back on whole seconds of its forwarder).")
}
