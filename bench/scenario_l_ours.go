package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario L's "ours" (issue 24): a real asynq fleet, lProcesses servers of
// r.Workers each (worker.NewServer and the Limiter's middleware, startFleet
// in fleet.go), draining the run's tasks through one key that has a
// request tier and a tokens tier:
//
//   - ours: the provider's stated limits, PerMinute(RPM) and
//     PerMinute(TPM).In("tokens"), each with the burst the provider's
//     bucket holds when it holds less than a minute's worth
//     (WithBurst(TPM/60) for 1 s buckets): what an operator who read the
//     provider's documentation ("60,000 requests/minute may be enforced as
//     1,000 requests/second") would set;
//   - ours-10x: limits 10 times the stated ones, no burst said
//     (PerMinute(10*RPM), PerMinute(10*TPM).In("tokens")), so that only
//     Observe, reading the provider's x-ratelimit-* headers, can bring them
//     to the provider's (rate and burst). The run polls the key's limits in
//     force (Limiter.Inspect, Status.InForce) every lPoll and reports after
//     how many responses each was within lLearnTolerance of the provider's.
//
// Each task is throttle.NewTask(..., throttle.Key(lKey), throttle.Uses(
// "tokens", estimate)); its handler calls the provider, hands every
// response to throttle.Observe (a 429 returns its RateLimited error: the key
// is suspended fleet-wide and the task deferred) and, in the mode where the
// provider settles each call to its usage (2xmedian), settles the task's
// tokens with throttle.Used(ctx, "tokens", usage). Under max the provider
// keeps the estimate charged, and so does ours.

// Scenario L's variants of ours.
const (
	lOurs    = "ours"     // the stated limits (and the bucket's burst)
	lOurs10x = "ours-10x" // 10x the stated limits, to be learned from the headers
)

const (
	lKey      = "openai:gpt-4o" // the key of every ours run (each run has its own prefix)
	lTaskType = "l:call"
	lUnit     = "tokens"
	// lPoll is how often an ours run reads the key (Inspect): suspensions
	// begun, the limits in force.
	lPoll = 100 * time.Millisecond
	// lLearnTolerance and lLearnResponses are issue 24's target for limits
	// configured 10x too high: within 5 % of the provider's limits after
	// at most 3 responses (and at most lLearnSuspensions suspension).
	lLearnTolerance   = 0.05
	lLearnResponses   = 3
	lLearnSuspensions = 1
)

// lNamesMu guards e.names: L's runs start at once.
var lNamesMu sync.Mutex

// oursLLMLimits are the limits ours sets on the key for the provider's lim,
// factor times the stated ones (1: with the bucket's burst; else with
// none said, a minute's worth of the configured rate).
func oursLLMLimits(lim llmLimits, factor int) []throttle.Limit {
	req := throttle.PerMinute(factor * lim.RPM)
	tok := throttle.PerMinute(factor * lim.TPM).In(lUnit)
	if factor == 1 && lim.Capacity != time.Minute {
		req = req.WithBurst(max(int(lim.requestCapacity()+llmEps), 1))
		tok = tok.WithBurst(max(int(lim.tokenCapacity()+llmEps), 1))
	}
	return []throttle.Limit{req, tok}
}

// lLearning is what an ours run saw of its key's limits in force, polled
// every lPoll: when each unit's rate and burst came within lLearnTolerance
// of the provider's, and the key's suspensions.
type lLearning struct {
	Configured []throttle.Limit
	Units      []lUnitLearning
	// Suspensions begun (a poll saw the key suspended, the one before
	// not), and tasks deferred for one (their handler returned the
	// RateLimited error of a 429).
	Suspensions, Suspended int
	// Polls is how many polls read the key; PollErrors how many failed.
	Polls, PollErrors int
}

// lUnitLearning is one unit's learning: the provider's rate (per second)
// and capacity, when a poll first saw the limit in force within
// lLearnTolerance of each (since the start; -1 never) and how many
// responses the handlers had had by then, and the limit in force at the
// end. RateSeen and BurstSeen (ours-10x) are a tighter bound: the fewest
// responses the handlers had had when one of them, reading the key right
// after its Observe, found the rate (the burst) learned; -1 never. With 48
// calls in flight, responses come in bursts, and a 100 ms poll counts all
// of a burst.
type lUnitLearning struct {
	Unit                         string
	ProviderRate, ProviderBurst  float64
	RateAt, BurstAt              time.Duration
	RateResponses, BurstResponse int
	RateSeen, BurstSeen          int
	End                          throttle.Limit
	Found                        bool // the key had a tier of the unit at the end
}

func newLUnitLearning(unit string, rate, burst float64) lUnitLearning {
	return lUnitLearning{Unit: unit, ProviderRate: rate, ProviderBurst: burst, RateAt: -1, BurstAt: -1, RateSeen: -1, BurstSeen: -1}
}

// fewest is the smaller of two response counts, -1 standing for never.
func fewest(a, b int) int {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}

// rateResponses and burstResponses are the fewest responses after which
// the rate (the burst) was seen learned, by either measure (-1 never).
func (u lUnitLearning) rateResponses() int {
	if u.RateAt < 0 {
		return u.RateSeen
	}
	return fewest(u.RateResponses, u.RateSeen)
}

func (u lUnitLearning) burstResponses() int {
	if u.BurstAt < 0 {
		return u.BurstSeen
	}
	return fewest(u.BurstResponse, u.BurstSeen)
}

// learned reports whether both the rate and the burst were learned.
func (u lUnitLearning) learned() bool { return u.rateResponses() >= 0 && u.burstResponses() >= 0 }

// responses is how many responses it took to learn both (-1 never).
func (u lUnitLearning) responses() int {
	if !u.learned() {
		return -1
	}
	return max(u.rateResponses(), u.burstResponses())
}

// near reports whether got is within lLearnTolerance of want.
func near(got, want float64) bool {
	return want > 0 && math.Abs(got/want-1) <= lLearnTolerance
}

// oursVariant is scenario L's ours, factor times the stated limits.
func oursVariant(factor int) lVariantFunc {
	return func(ctx context.Context, e *env, r *lRun) (lClientStats, error) {
		lNamesMu.Lock()
		queue, prefix := e.names("l", fmt.Sprintf("ours%dx", factor))
		lNamesMu.Unlock()
		o := &lOursRun{e: e, r: r, factor: factor, queue: queue, prefix: prefix, set: newTaskSet(len(r.Tasks)), c: newCounters(),
			start: time.Now(), admitted: map[string]time.Time{}}
		o.c.tap = o.sawEvent
		defer o.cleanup()
		return o.run(ctx)
	}
}

// lOursRun is one run of ours.
type lOursRun struct {
	e             *env
	r             *lRun
	factor        int
	queue, prefix string
	set           *taskSet
	c             *counters
	start         time.Time
	// calls: calls made to the provider; responses: those answered (200
	// or 429); usedErrs: Used calls that failed (the task still counts).
	calls, responses, usedErrs atomic.Int64
	// admitted is when the middleware was told each task ID was admitted
	// (its Ran event, plus the pacing wait); lag the longest time from
	// there to the provider's decision on the task's call, and late the
	// calls decided later than the middleware's headroom after it.
	mu       sync.Mutex
	admitted map[string]time.Time
	lag      time.Duration
	late     int
	// learn is what the poll and (ours-10x) the handlers saw of the key's
	// limits in force, under learnMu; inspector reads the key; learnedAll
	// stops the handlers' reads once every unit is learned.
	learnMu    sync.Mutex
	learn      *lLearning
	inspector  *throttle.Limiter
	learnedAll atomic.Bool
}

// checkLearned (ours-10x) reads the key right after a handler's Observe
// and notes, per unit, the fewest responses after which its rate and
// burst in force were within lLearnTolerance of the provider's.
func (o *lOursRun) checkLearned() {
	if o.factor == 1 || o.learnedAll.Load() {
		return
	}
	st, err := o.inspector.Inspect(context.Background(), lKey)
	n := int(o.responses.Load())
	if err != nil {
		return
	}
	o.learnMu.Lock()
	defer o.learnMu.Unlock()
	all := true
	for i := range o.learn.Units {
		u := &o.learn.Units[i]
		if in, ok := tierOf(st.InForce, u.Unit); ok {
			if near(float64(in.N)/in.Per.Seconds(), u.ProviderRate) {
				u.RateSeen = fewest(u.RateSeen, n)
			}
			if near(float64(in.Burst), u.ProviderBurst) {
				u.BurstSeen = fewest(u.BurstSeen, n)
			}
		}
		all = all && u.RateSeen >= 0 && u.BurstSeen >= 0
	}
	if all {
		o.learnedAll.Store(true)
	}
}

// lHeadroom is the middleware's default headroom (throttle.WithHeadroom):
// the dispatch jitter its decisions keep room for.
const lHeadroom = 20 * time.Millisecond

// sawEvent notes when a task was admitted.
func (o *lOursRun) sawEvent(ev throttle.Event) {
	if ev.Outcome != throttle.Ran || ev.TaskID == "" {
		return
	}
	o.mu.Lock()
	o.admitted[ev.TaskID] = time.Now().Add(ev.Wait)
	o.mu.Unlock()
}

// arrived notes the lag from the task's admission to the provider's
// decision on its call (resp).
func (o *lOursRun) arrived(ctx context.Context, resp *http.Response) {
	id, _ := asynq.GetTaskID(ctx)
	decided, ok := llmArrived(resp)
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok2 := o.admitted[id]
	if !ok || !ok2 {
		return
	}
	delete(o.admitted, id)
	lag := decided.Sub(at)
	o.lag = max(o.lag, lag)
	if lag > lHeadroom {
		o.late++
	}
}

// cleanup removes the run's queue and keys, never anything else: the other
// runs of L share the Redis (a FLUSHALL would drop their keys and tasks).
func (o *lOursRun) cleanup() {
	scoped := *o.e
	scoped.own = false
	_ = scoped.cleanup(context.Background(), o.queue, o.prefix)
}

// handler calls the provider for the task, hands the response to Observe
// and, when the provider settles calls to their usage, settles the task's
// tokens with Used.
func (o *lOursRun) handler(limitedFunc) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		idx, estimate, used, err := lParsePayload(t.Payload())
		if err != nil {
			return fmt.Errorf("%w: %v", asynq.SkipRetry, err)
		}
		began := time.Now()
		o.calls.Add(1)
		resp, usage, err := o.r.Provider.call(ctx, o.r.Endpoint, estimate, used)
		if err != nil {
			return err
		}
		o.responses.Add(1)
		o.arrived(ctx, resp)
		limited := throttle.Observe(ctx, resp)
		o.checkLearned()
		if limited != nil {
			return limited // a 429: the key is suspended fleet-wide, the task deferred
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("llm provider: %s", resp.Status)
		}
		if o.r.Mode.Settle {
			if err := throttle.Used(ctx, lUnit, usage); err != nil {
				o.usedErrs.Add(1) // the call was made: the task is done all the same
			}
		}
		o.set.complete(idx, o.start, began)
		return nil
	})
}

// lPayload is a task's index, estimate and the usage its call will report.
func lPayload(t llmTask) []byte {
	return []byte(fmt.Sprintf("%d %d %d", t.ID, t.Estimate, t.used()))
}

func lParsePayload(b []byte) (idx, estimate, used int, err error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, 0, 0, fmt.Errorf("bad payload %q", b)
	}
	var errs [3]error
	idx, errs[0] = strconv.Atoi(f[0])
	estimate, errs[1] = strconv.Atoi(f[1])
	used, errs[2] = strconv.Atoi(f[2])
	for _, e := range errs {
		if e != nil {
			return 0, 0, 0, fmt.Errorf("bad payload %q", b)
		}
	}
	return idx, estimate, used, nil
}

// run sets the key's limits, starts the fleet, enqueues the tasks (the
// fleet drains them as they arrive), and waits until every task has run or
// ctx ends, polling the key meanwhile.
func (o *lOursRun) run(ctx context.Context) (lClientStats, error) {
	r := o.r
	limits := oursLLMLimits(r.Limits, o.factor)
	spec := fleetSpec{
		variant: vOurs, servers: lProcesses, concurrency: r.Workers, queue: o.queue, prefix: o.prefix,
		throttleLimits: map[string][]throttle.Limit{lKey: limits},
		handlers:       map[string]func(limitedFunc) asynq.Handler{lTaskType: o.handler},
	}
	// Not setLimits (fleet.go): L's runs all start at once, on a machine
	// that may be busy, and the Limiter's default bound (1 s) is for
	// decisions, not for the setup of a run.
	admin := throttle.NewLimiter(o.e.ctl, throttle.WithPrefix(o.prefix), throttle.WithTimeout(10*time.Second))
	err := admin.SetLimits(ctx, lKey, limits...)
	admin.Close()
	if err != nil {
		return lClientStats{}, err
	}
	l := r.Limits
	learn := &lLearning{Configured: limits, Units: []lUnitLearning{
		newLUnitLearning("requests", l.requestRate(), l.requestCapacity()),
		newLUnitLearning(lUnit, l.tokenRate(), l.tokenCapacity()),
	}}
	o.learn = learn
	o.inspector = throttle.NewLimiter(o.e.ctl, throttle.WithPrefix(o.prefix))
	defer o.inspector.Close()
	f, err := startFleet(o.e, spec, o.c)
	if err != nil {
		return lClientStats{}, err
	}
	pollCtx, stopPoll := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		o.poll(pollCtx, learn)
	}()
	tasks := r.Tasks
	err = enqueue(ctx, o.e, o.queue, len(tasks), func(i int) *asynq.Task {
		return keyedTask(lTaskType, lPayload(tasks[i]), throttle.Key(lKey), throttle.Uses(lUnit, tasks[i].Estimate))
	})
	if err != nil && ctx.Err() == nil {
		stopPoll()
		<-polled
		f.stop()
		return lClientStats{}, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Hour)
	}
	waitFor(ctx, deadline, o.set.finished)
	end := time.Now()
	if o.set.finished() {
		end = time.Unix(0, o.set.last.Load())
	}
	stopPoll()
	<-polled
	f.stop()
	learn.Suspended = int(o.c.suspensions.Load())
	s := lClientStats{Succeeded: int(o.set.done.Load()), Calls: int(o.calls.Load()), Pauses: learn.Suspensions,
		End: end, Duplicates: o.set.duplicates(), UsedErrors: int(o.usedErrs.Load()), Learning: learn}
	o.mu.Lock()
	s.Lag, s.Late = o.lag, o.late
	o.mu.Unlock()
	s.Failed = inspectQueue(o.e, o.queue).Archived
	return s, nil
}

// poll reads the key every lPoll until ctx ends: suspensions begun, and
// when each unit's limit in force came within lLearnTolerance of the
// provider's.
func (o *lOursRun) poll(ctx context.Context, learn *lLearning) {
	suspended := false
	tick := time.NewTicker(lPoll)
	defer tick.Stop()
	for {
		st, err := o.inspector.Inspect(context.Background(), lKey)
		responses := int(o.responses.Load())
		since := time.Since(o.start)
		o.learnMu.Lock()
		learn.Polls++
		if err != nil {
			learn.PollErrors++
		} else {
			if st.SuspendedFor > 0 && !suspended {
				learn.Suspensions++
			}
			suspended = st.SuspendedFor > 0
			for i := range learn.Units {
				u := &learn.Units[i]
				in, ok := tierOf(st.InForce, u.Unit)
				u.End, u.Found = in, ok
				if !ok {
					continue
				}
				if u.RateAt < 0 && near(float64(in.N)/in.Per.Seconds(), u.ProviderRate) {
					u.RateAt, u.RateResponses = since, responses
				}
				if u.BurstAt < 0 && near(float64(in.Burst), u.ProviderBurst) {
					u.BurstAt, u.BurstResponse = since, responses
				}
			}
		}
		o.learnMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// tierOf is the bucket of unit among limits ("requests": the tiers without
// a unit).
func tierOf(limits []throttle.Limit, unit string) (throttle.Limit, bool) {
	if unit == "requests" {
		unit = ""
	}
	for _, l := range limits {
		if l.Kind == throttle.KindBucket && l.Unit == unit {
			return l, true
		}
	}
	return throttle.Limit{}, false
}

// lOursRatioRows are the rows comparing ours with each column: its share
// of the binding limit over the column's, and its drain time over the
// column's (a column that did not finish drained in more than it shows,
// so the ratio is at most that).
func lOursRatioRows(t *table, c lCase, rs []lResult) {
	ours := find(rs, func(r lResult) bool { return r.Variant == lOurs })
	if ours == nil {
		return
	}
	t.row(fmt.Sprintf("ours / this column: share of the binding limit (%s)", c.Binding), each(rs, func(r lResult) string {
		if !ours.Spent || !r.Spent {
			return "-"
		}
		return ratio(ours.share(c.Binding), r.share(c.Binding))
	}))
	t.row("ours / this column: drain time (DNF: at most)", each(rs, func(r lResult) string {
		switch {
		case !ours.Finished && !r.Finished:
			return "both DNF"
		case !ours.Finished:
			return "DNF"
		case !r.Finished:
			return "<" + ratio(ours.Drain.Seconds(), r.Drain.Seconds())
		}
		return ratio(ours.Drain.Seconds(), r.Drain.Seconds())
	}))
}

// printLLearning prints, for an ours-10x run, what its key learned: issue
// 24's target for limits configured 10x too high.
func printLLearning(w io.Writer, c lCase, r lResult) {
	l := r.Client.Learning
	if r.Variant != lOurs10x || l == nil {
		return
	}
	fmt.Fprintf(w, "learning %s %s (configured 10x too high: %s; only throttle.Observe, reading the provider's x-ratelimit-* headers, can bring them down: this reports what it does on this build):\n",
		c.Name, r.Variant, joinLimits(l.Configured))
	all, most := true, 0
	for _, u := range l.Units {
		end := "no tier of the unit"
		if u.Found {
			end = u.End.String()
		}
		fmt.Fprintf(w, "  %-8s provider %s/s holding %s; rate %s; burst %s; in force at the end: %s\n", u.Unit,
			fmtRate(u.ProviderRate), fmtRate(u.ProviderBurst), learnedAt(u.RateAt, u.RateResponses, u.RateSeen),
			learnedAt(u.BurstAt, u.BurstResponse, u.BurstSeen), end)
		if !u.learned() {
			all = false
		}
		most = max(most, u.responses())
	}
	learned := fmt.Sprintf("NOT LEARNED (MISSED): not every unit's rate and burst came within %.0f %% of the provider's", lLearnTolerance*100)
	if all {
		learned = fmt.Sprintf("learned after at most %d responses %s (<= %d)", most, verdict(most <= lLearnResponses), lLearnResponses)
	}
	fmt.Fprintf(w, "targets %s %s: %s; suspensions %d %s (<= %d); 429s %d; tasks deferred by a 429 %d; polls %d (%d failed)\n", c.Name, r.Variant,
		learned, l.Suspensions, verdict(l.Suspensions <= lLearnSuspensions), lLearnSuspensions, r.Limited, l.Suspended, l.Polls, l.PollErrors)
}

// learnedAt says when a poll first saw a limit within lLearnTolerance,
// and after how many responses a poll, and a handler's read after its
// Observe, saw it.
func learnedAt(at time.Duration, responses, seen int) string {
	switch {
	case at < 0 && seen < 0:
		return "not learned"
	case at < 0:
		return fmt.Sprintf("learned after <= %d responses (read after each), never seen by a poll", seen)
	case seen < 0:
		return fmt.Sprintf("learned by %.1fs, after <= %d responses (poll)", at.Seconds(), responses)
	}
	return fmt.Sprintf("learned by %.1fs, after <= %d responses (poll), <= %d (read after each)", at.Seconds(), responses, seen)
}

func joinLimits(ls []throttle.Limit) string {
	return strings.Join(each(ls, throttle.Limit.String), ", ")
}

// fmtRate formats a rate or a capacity: one decimal under 100.
func fmtRate(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
