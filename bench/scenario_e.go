package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// defaultERounds is how many rounds scenario E runs unless -e-rounds says
// otherwise: one run of every variant per round.
const defaultERounds = 5

// Kinds of provider in scenario E.
const (
	kindBucket  = "bucket"  // token bucket
	kindFixed   = "fixed"   // fixed window on the clock with a reset header (X-RateLimit-*)
	kindSliding = "sliding" // sliding log
	kindIETF    = "ietf"    // fixed window publishing IETF headers, halved mid-run
)

// providerSpec is one strict provider of scenario E and the quota its docs
// state: Quota calls per Window (a bucket: Quota per Window, Burst at once).
type providerSpec struct {
	Name   string // its key, endpoint and row label
	Kind   string
	Doc    string // the quota as the provider's docs state it
	Quota  int
	Window time.Duration
	Burst  int
	// HalveAfter (kindIETF): the quota halves at the first window boundary
	// at least this long after the fleet starts.
	HalveAfter time.Duration
	// Target is the least throughput, as a share of the quota, a limiter
	// configured with the documented quota should reach.
	Target float64
}

// eRunFloor is the least share of the quota any single run may have (the
// share before the halving for the IETF provider). A run that loses one
// whole window (a third to a half of the measured span) or one second of
// the bucket's six falls below it: a mean can hide such a run, so every
// run is judged.
const eRunFloor = 0.85

// judged is the share of a run that eRunFloor applies to.
func (p providerSpec) judged(r eRun) float64 {
	if p.Kind == kindIETF {
		return r.ShareBefore
	}
	return r.Share
}

// lockedReasons formats c's deferrals by reason under its lock.
func lockedReasons(c *counters) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return reasons(c.byReason)
}

// perSecond counts the calls admitted in each second from start to end.
func perSecond(calls []callRecord, start, end time.Time) []int {
	out := make([]int, int(end.Sub(start)/time.Second)+1)
	for _, c := range calls {
		if i := int(c.at.Sub(start) / time.Second); c.ok && i >= 0 && i < len(out) && !c.at.After(end) {
			out[i]++
		}
	}
	return out
}

// The configuration of "ours" (and of naive, which is ours without
// reservations) is these three functions, one call per provider: switch them
// to the new API when it lands.

// oursLimits are the limits ours is given for p: the number from the docs,
// in the provider's own terms: a token bucket for the bucket, a fixed
// window (throttle.FixedWindow) for the providers whose windows are fixed on
// the clock (fixed, IETF), a sliding window (throttle.Window) for the
// sliding one.
func oursLimits(p providerSpec) []throttle.Limit {
	switch p.Kind {
	case kindBucket:
		return []throttle.Limit{{N: p.Quota, Per: p.Window, Burst: p.Burst}}
	case kindFixed, kindIETF:
		return []throttle.Limit{throttle.FixedWindow(p.Quota, p.Window)}
	}
	return []throttle.Limit{throttle.Window(p.Quota, p.Window)}
}

// oursOptions are the middleware options ours runs p with: none, the
// defaults (headroom for dispatch jitter is on by default).
func oursOptions(p providerSpec) []throttle.Option {
	return nil
}

// oursObserve is what ours's handler does with every response of p:
// throttle.Observe, which learns from the headers (a published quota
// below the configured one, a remaining count, remaining 0 with a reset)
// and returns RateLimited for a 429 (the key is suspended fleet-wide).
func oursObserve(p providerSpec) func(ctx context.Context, resp *http.Response) error {
	return throttle.Observe
}

// sleepLimit is sleep's redis_rate limit for p: the number from the docs,
// Quota per Window with a burst of Quota (or the bucket's burst).
func sleepLimit(p providerSpec) redis_rate.Limit {
	burst := p.Quota
	if p.Kind == kindBucket {
		burst = p.Burst
	}
	return redis_rate.Limit{Rate: p.Quota, Period: p.Window, Burst: burst}
}

// perSecond is p's quota as a rate.
func (p providerSpec) perSecond() float64 { return float64(p.Quota) / p.Window.Seconds() }

// model builds p's provider for a fleet starting at start; for kindIETF it
// also returns the instant the quota halves.
func (p providerSpec) model(start time.Time) (quotaModel, time.Time) {
	switch p.Kind {
	case kindBucket:
		return newBucketModel(p.Quota, p.Burst, start), time.Time{}
	case kindFixed:
		return &windowModel{n: p.Quota, w: p.Window}, time.Time{}
	case kindSliding:
		return &slidingModel{n: p.Quota, w: p.Window}, time.Time{}
	}
	w := int64(p.Window)
	halve := time.Unix(0, (start.Add(p.HalveAfter).UnixNano()+w-1)/w*w)
	return &windowModel{n: p.Quota, w: p.Window, ietf: true, halveAt: halve}, halve
}

// eRun is one provider's figures in one run of one variant.
type eRun struct {
	Calls, Admitted, Limited int
	// Share is the calls admitted in the measured span over what the quota
	// allows in it.
	Share       float64
	Suspensions int64 // ours/naive: handlers that returned a 429
	Failed      int64 // ours/naive: decisions Redis could not make
	// Harness health during the run: the longest gap of a 10 ms ticker in
	// the harness process, and the slowest PING to Redis (one every 50 ms).
	TickGap, SlowestPing time.Duration
	// The halving provider's.
	HalvedAt                    time.Duration // since the fleet started
	LimitedBefore, LimitedAfter int
	ShareBefore, ShareAfter     float64
	Obeyed                      bool
	ObeyAfter                   time.Duration // from the halving to its last 429
	// PerSecond is the calls the provider admitted in each second since
	// the fleet started.
	PerSecond []int
}

// eResult is one provider and variant over every round.
type eResult struct {
	Provider string
	Variant  string
	Runs     []eRun
}

type scenarioE struct {
	Providers            []providerSpec
	Servers, Concurrency int
	Rounds               int
	Variants             []string
	RunFor               time.Duration
	Warmup               time.Duration
	Results              []eResult
}

func runE(ctx context.Context, e *env, w io.Writer) (*scenarioE, error) {
	s := &scenarioE{
		Providers: []providerSpec{
			{Name: "bucket", Kind: kindBucket, Doc: "token bucket, 50/s burst 50 (Stripe-like)", Quota: 50, Window: time.Second, Burst: 50, Target: 0.97},
			{Name: "fixed", Kind: kindFixed, Doc: "fixed window on the clock, 100 per 2 s, X-RateLimit-* with a Unix reset", Quota: 100, Window: 2 * time.Second, Target: 0.9},
			{Name: "sliding", Kind: kindSliding, Doc: "sliding log, at most 60 in any 2 s, Retry-After only (Slack-like)", Quota: 60, Window: 2 * time.Second, Target: 0.9},
			{Name: "ietf", Kind: kindIETF, Doc: "fixed window on the clock, 60 per 1 s, IETF RateLimit-Policy/RateLimit, halved to 30 mid-run", Quota: 60, Window: time.Second, HalveAfter: 4 * time.Second, Target: 0.9},
		},
		Servers: 4, Concurrency: 10, Rounds: e.eRounds, RunFor: 8 * time.Second, Warmup: 2 * time.Second,
	}
	if e.quick {
		s.RunFor = 6 * time.Second
		s.Providers[3].HalveAfter = 3 * time.Second
	}
	variants := e.eVariants
	s.Variants = variants
	fmt.Fprintf(w, "\n== E. quota fidelity: 4 strict providers at once, each with its own fleet (%d servers x concurrency %d) and backlog, every limiter set to the documented quota; %s of %v runs per variant\n",
		s.Servers, s.Concurrency, plural(s.Rounds, "round"), s.RunFor)
	for _, p := range s.Providers {
		fmt.Fprintf(w, "   %-8s %s\n", p.Name, p.Doc)
	}
	for _, p := range s.Providers {
		for _, v := range variants {
			s.Results = append(s.Results, eResult{Provider: p.Name, Variant: v})
		}
	}
	sp := newStrictProvider()
	defer sp.Close()
	for round := range s.Rounds {
		// Rotate the order of the variants, against drift in outside load.
		for i := range variants {
			v := variants[(i+round)%len(variants)]
			runs, err := eOnce(ctx, e, s, sp, v, round)
			if err != nil {
				return s, fmt.Errorf("E/%s: %w", v, err)
			}
			var l []string
			for _, p := range s.Providers {
				r := find(s.Results, func(r eResult) bool { return r.Provider == p.Name && r.Variant == v })
				r.Runs = append(r.Runs, runs[p.Name])
				flag := ""
				if p.judged(runs[p.Name]) < eRunFloor {
					flag = fmt.Sprintf(" BELOW %.2f (admitted per second: %s)", eRunFloor, ints(runs[p.Name].PerSecond))
				}
				l = append(l, fmt.Sprintf("%s %d 429s %.2f%s", p.Name, runs[p.Name].Limited, runs[p.Name].Share, flag))
			}
			progress("E/%s round %d: %s", v, round+1, strings.Join(l, ", "))
		}
	}
	s.print(w)
	return s, nil
}

// eFleet is one provider's fleet in one run.
type eFleet struct {
	p             providerSpec
	queue, prefix string
	c             *counters
	f             *fleet
	trace         *runTrace // -e-trace only
}

// eOnce runs the four providers at once, each with its own fleet of
// variant, for s.RunFor, and returns each provider's figures.
func eOnce(ctx context.Context, e *env, s *scenarioE, sp *strictProvider, variant string, round int) (map[string]eRun, error) {
	var fleets []*eFleet
	defer func() {
		stopAll(fleets)
		for _, ef := range fleets {
			_ = e.cleanup(context.Background(), ef.queue, ef.prefix)
		}
	}()
	specs := make([]fleetSpec, len(s.Providers))
	for i, p := range s.Providers {
		ef, spec, err := newEFleet(ctx, e, s, sp, variant, p)
		fleets = append(fleets, ef)
		if err != nil {
			return nil, err
		}
		specs[i] = spec
	}
	if e.ePhase >= 0 {
		waitForPhase(e.ePhase)
	}
	span := eSpan{start: time.Now()}
	models := map[string]quotaModel{}
	halvedAt := map[string]time.Time{}
	for _, p := range s.Providers {
		models[p.Name], halvedAt[p.Name] = p.model(span.start)
	}
	var stopSampling []func()
	if e.eTrace != "" {
		stopSampling = startTraces(e, fleets, variant, span.start)
	}
	defer func() { stopEach(stopSampling) }() // nil once stopped below
	sp.reset(models)
	health := watchHealth(e)
	for i, ef := range fleets {
		f, err := startFleet(e, specs[i], ef.c)
		if err != nil {
			return nil, err
		}
		ef.f = f
	}
	t := time.NewTimer(time.Until(span.start.Add(s.RunFor)))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return nil, ctx.Err()
	}
	span.end = time.Now()
	span.tickGap, span.slowestPing = health()
	stopEach(stopSampling)
	stopSampling = nil
	out := map[string]eRun{}
	for _, ef := range fleets {
		out[ef.p.Name] = ef.result(e, s, sp, variant, round, span, halvedAt[ef.p.Name])
	}
	return out, nil
}

// newEFleet makes provider p's fleet of variant for one run (not started
// yet): its limits set and a backlog it cannot finish, 1.5 x what the
// quota allows, in its queue. The fleet is returned even with an error, to
// be cleaned up.
func newEFleet(ctx context.Context, e *env, s *scenarioE, sp *strictProvider, variant string, p providerSpec) (*eFleet, fleetSpec, error) {
	queue, prefix := e.names("e", variant+"-"+p.Name)
	ef := &eFleet{p: p, queue: queue, prefix: prefix, c: newCounters()}
	spec := fleetSpec{
		variant: variant, servers: s.Servers, concurrency: s.Concurrency, queue: queue, prefix: prefix,
		handlers:        map[string]func(limitedFunc) asynq.Handler{"e:call": eHandler(sp, p, variant, &ef.trace)},
		throttleLimits:  map[string][]throttle.Limit{p.Name: oursLimits(p)},
		throttleOptions: oursOptions(p),
		sleepLimits:     map[string]redis_rate.Limit{p.Name: sleepLimit(p)},
	}
	if err := setLimits(ctx, e, spec); err != nil {
		return ef, spec, err
	}
	n := int(1.5*(p.perSecond()*s.RunFor.Seconds())) + p.Quota + p.Burst
	err := enqueue(ctx, e, queue, n, func(i int) *asynq.Task {
		return keyedTask("e:call", []byte(strconv.Itoa(i)), throttle.Key(p.Name))
	})
	return ef, spec, err
}

// waitForPhase waits for the next instant at this fraction of a second:
// where asynq's one-second forwarder ticks fall (the servers start
// together) and where the first calls fall in the providers' windows.
func waitForPhase(phase float64) {
	now := time.Now()
	at := now.Truncate(time.Second).Add(time.Duration(phase * float64(time.Second)))
	if at.Before(now) {
		at = at.Add(time.Second)
	}
	time.Sleep(time.Until(at))
}

// startTraces gives every fleet a trace of the run from start and, for the
// variants with our Limiter, samples its key's state; it returns the
// functions that stop the sampling.
func startTraces(e *env, fleets []*eFleet, variant string, start time.Time) []func() {
	var stops []func()
	for _, ef := range fleets {
		ef.trace = newRunTrace(start)
		ef.c.trace = ef.trace
		if variant == vOurs || variant == vNaive {
			l := throttle.NewLimiter(e.ctl, throttle.WithPrefix(ef.prefix))
			base := ef.prefix + ":{" + ef.p.Name + "}:"
			stops = append(stops, ef.trace.sample(l, e.ctl, ef.p.Name, base+"b", base+"r"))
		}
	}
	return stops
}

func stopEach(stops []func()) {
	for _, stop := range stops {
		stop()
	}
}

// eSpan is one run of scenario E as the harness saw it: when it ran, and
// how late the harness's own timers and Redis were meanwhile.
type eSpan struct {
	start, end           time.Time
	tickGap, slowestPing time.Duration
}

// result is the provider's figures for the run; with -e-trace it writes the
// run's trace, with -v it logs the run.
func (ef *eFleet) result(e *env, s *scenarioE, sp *strictProvider, variant string, round int, span eSpan, halvedAt time.Time) eRun {
	calls := sp.snapshot(ef.p.Name)
	r := analyzeE(ef.p, calls, span.start, span.end, s.Warmup, halvedAt)
	r.Suspensions, r.Failed = ef.c.suspensions.Load(), ef.c.failed.Load()
	r.TickGap, r.SlowestPing = span.tickGap, span.slowestPing
	r.PerSecond = perSecond(calls, span.start, span.end)
	if ef.trace != nil {
		name := fmt.Sprintf("E-r%02d-%s-%s.log", round+1, variant, ef.p.Name)
		header := []string{
			fmt.Sprintf("scenario E round %d, variant %s, provider %s (%s); started %s", round+1, variant, ef.p.Name, ef.p.Doc, span.start.Format(time.RFC3339Nano)),
			fmt.Sprintf("share %.2f (measured from +%v); 429s %d; suspensions %d; failed decisions %d; harness: longest tick gap %v, slowest PING %v",
				r.Share, s.Warmup, r.Limited, r.Suspensions, r.Failed, span.tickGap.Round(time.Millisecond), span.slowestPing.Round(time.Millisecond)),
			"provider admitted/refused per second since the start: " + timeline(calls, span.start, span.end),
			"deferrals by reason: " + lockedReasons(ef.c),
		}
		if err := ef.trace.write(e.eTrace, name, header); err != nil {
			progress("E: -e-trace: %v", err)
		}
	}
	if e.verbose {
		progress("E/%s %s: admitted/refused per second since the start: %s; deferrals %s, failed decisions %d; queue pending/active/sched/retry/archived %s; harness: longest tick gap %v, slowest PING %v",
			variant, ef.p.Name, timeline(calls, span.start, span.end), reasons(ef.c.byReason), ef.c.failed.Load(), inspectQueue(e, ef.queue),
			span.tickGap.Round(time.Millisecond), span.slowestPing.Round(time.Millisecond))
		for msg, n := range ef.c.failedErrs {
			progress("E/%s %s: %d decisions failed with: %s", variant, ef.p.Name, n, msg)
		}
	}
	return r
}

// timeline is "50/0 48/2 ...": calls admitted/refused in each second of the
// run, for -v.
func timeline(calls []callRecord, start, end time.Time) string {
	n := int(end.Sub(start)/time.Second) + 1
	ok, refused := make([]int, n), make([]int, n)
	for _, c := range calls {
		if i := int(c.at.Sub(start) / time.Second); i >= 0 && i < n {
			if c.ok {
				ok[i]++
			} else {
				refused[i]++
			}
		}
	}
	var l []string
	for i := range n {
		l = append(l, fmt.Sprintf("%d/%d", ok[i], refused[i]))
	}
	return strings.Join(l, " ")
}

// watchHealth starts watching the harness until the returned function is
// called, which returns the longest gap of a 10 ms ticker in this process
// (the Go scheduler's delay under load) and the slowest PING to Redis, one
// every 50 ms on a connection of its own (Redis's delay).
func watchHealth(e *env) func() (tickGap, slowestPing time.Duration) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var gap, ping time.Duration
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				gap, last = max(gap, now.Sub(last)), now
			}
		}
	})
	wg.Go(func() {
		c := e.newClient(1)
		defer c.Close()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				began := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_ = c.Ping(ctx).Err()
				cancel()
				ping = max(ping, time.Since(began))
			}
		}
	})
	return func() (time.Duration, time.Duration) {
		close(done)
		wg.Wait()
		return gap, ping
	}
}

// stopAll stops the fleets that started, in parallel.
func stopAll(fleets []*eFleet) {
	var wg sync.WaitGroup
	for _, ef := range fleets {
		if ef.f != nil {
			wg.Go(ef.f.stop)
		}
	}
	wg.Wait()
}

// eHandler calls p's endpoint once per task. Ours and naive hand every
// response to oursObserve; sleep turns a 429 into its own error, as in A.
func eHandler(sp *strictProvider, p providerSpec, variant string, trace **runTrace) func(limitedFunc) asynq.Handler {
	return func(onLimited limitedFunc) asynq.Handler {
		observe := func(_ context.Context, resp *http.Response) error {
			if resp.StatusCode == http.StatusTooManyRequests {
				return onLimited(resp)
			}
			return nil
		}
		if variant == vOurs || variant == vNaive {
			observe = oursObserve(p)
		}
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			resp, err := sp.call(ctx, p.Name)
			if tr := *trace; tr != nil {
				id, _ := asynq.GetTaskID(ctx)
				switch {
				case err != nil:
					tr.add("call task=%s error %v", id, err)
				default:
					tr.add("call task=%s %d", id, resp.StatusCode)
				}
			}
			if err != nil {
				return err
			}
			return observe(ctx, resp)
		})
	}
}

// analyzeE computes one provider's figures from the calls it saw between
// start and end. The share of the quota is measured from start+warmup (past
// the fleet's start-up: deferred tasks come back on asynq's one-second
// ticks) over whole windows: aligned to the provider's clock for fixed
// windows, any whole number of windows for the sliding log. For the bucket
// it is the rate over the rest of the run, less any tokens saved before
// start+warmup and spent in it (see bucketShare). The halving provider is
// measured before the halving, and after it from one window after the
// halving, against the halved quota.
func analyzeE(p providerSpec, calls []callRecord, start, end time.Time, warmup time.Duration, halved time.Time) eRun {
	var r eRun
	for _, c := range calls {
		if c.at.After(end) {
			continue
		}
		r.Calls++
		if c.ok {
			r.Admitted++
		} else {
			r.Limited++
		}
	}
	from := start.Add(warmup)
	switch p.Kind {
	case kindBucket:
		r.Share = bucketShare(p, calls, start, from, end)
	case kindSliding:
		n := end.Sub(from) / p.Window
		r.Share = share(calls, from, from.Add(n*p.Window), p.perSecond())
	case kindFixed:
		a, b := alignedWindows(from, end, p.Window)
		r.Share = share(calls, a, b, p.perSecond())
	case kindIETF:
		r.HalvedAt = halved.Sub(start)
		a, b := alignedWindows(from, halved, p.Window)
		r.ShareBefore = share(calls, a, b, p.perSecond())
		a, b = alignedWindows(halved.Add(p.Window), end, p.Window)
		r.ShareAfter = share(calls, a, b, p.perSecond()/2)
		r.Share = r.ShareBefore
		var last time.Time
		for _, c := range calls {
			switch {
			case c.ok || c.at.After(end):
			case c.at.Before(halved):
				r.LimitedBefore++
			default:
				r.LimitedAfter++
				last = c.at
			}
		}
		// Obeyed: no 429 in the last two windows of the run.
		r.Obeyed = last.IsZero() || last.Before(end.Add(-2*p.Window))
		if !last.IsZero() {
			r.ObeyAfter = last.Sub(halved)
		}
	}
	return r
}

// alignedWindows is the span of the whole windows [k*w, (k+1)*w) of Unix
// time that lie within [from, to].
func alignedWindows(from, to time.Time, w time.Duration) (time.Time, time.Time) {
	a := (from.UnixNano() + int64(w) - 1) / int64(w) * int64(w)
	b := to.UnixNano() / int64(w) * int64(w)
	if b < a {
		b = a
	}
	return time.Unix(0, a), time.Unix(0, b)
}

// share is the calls admitted in [from, to) over rate x (to - from); 0 for
// an empty span.
func share(calls []callRecord, from, to time.Time, rate float64) float64 {
	span := to.Sub(from).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(admitted(calls, from, to)) / (rate * span)
}

// admitted counts the calls admitted in [from, to).
func admitted(calls []callRecord, from, to time.Time) int {
	n := 0
	for _, c := range calls {
		if c.ok && !c.at.Before(from) && c.at.Before(to) {
			n++
		}
	}
	return n
}

// bucketShare is the share of bucket p's rate the fleet used in [from,
// end): the calls admitted in it, less the tokens it spent from what the
// bucket held at from (saved in a slow start: burst, not throughput), over
// rate x (end - from). The bucket is the provider's own, full at start,
// replayed through the admitted calls. A fleet that keeps the bucket
// empty scores 1; one that stalls for a second of six scores about 0.83,
// whenever in the span the stall falls.
//
// (It used to be measured from the first instant the fleet emptied the
// bucket after from. A fleet that saved tokens during the warm-up and then
// ran just under the rate emptied it only near the end, or never, and was
// judged on the last moments of the run: 0.49 and 0.00 for runs at 0.97.)
func bucketShare(p providerSpec, calls []callRecord, start, from, end time.Time) float64 {
	span := end.Sub(from).Seconds()
	if span <= 0 {
		return 0
	}
	b := bucket{q: quota{Rate: p.perSecond(), Burst: float64(p.Burst)}, tokens: float64(p.Burst), last: start}
	tokensAt := func(at time.Time) float64 {
		c := b
		c.refill(at)
		return c.tokens
	}
	atFrom := -1.0
	n := 0
	for _, c := range calls {
		if !c.ok || !c.at.Before(end) {
			continue
		}
		if atFrom < 0 && !c.at.Before(from) {
			atFrom = tokensAt(from)
		}
		b.take(c.at)
		if !c.at.Before(from) {
			n++
		}
	}
	if atFrom < 0 {
		atFrom = tokensAt(from)
	}
	spent := max(atFrom-tokensAt(end), 0)
	return (float64(n) - spent) / (p.perSecond() * span)
}

func (s *scenarioE) print(w io.Writer) {
	r := eRows{s: s, t: newTable("provider / metric", s.Variants...)}
	blank := each(s.Variants, func(string) string { return "" })
	for _, p := range s.Providers {
		r.t.row(p.Name+": "+p.Doc, blank)
		if p.Kind != kindIETF {
			r.quotaRows(p)
		} else {
			r.halvingRows(p)
		}
		r.outcomeRows(p)
	}
	r.t.row("harness, per run (all four providers at once)", blank)
	r.harnessRows()
	r.t.print(w)
	s.printVerdicts(w)
	s.printRatios(w)
	fmt.Fprintf(w, "notes: every limiter is set to the quota the provider documents (ours and naive: oursLimits, a bucket for the bucket, throttle.FixedWindow for the windows fixed on the clock, throttle.Window for the sliding log; sleep: redis_rate, a bucket of the same numbers).\n")
	fmt.Fprintf(w, "       throughput / quota = calls the provider admitted in the measured span / what its quota allows in it; measured from %v after the start, over whole windows (aligned to the provider's clock for fixed windows).\n", s.Warmup)
	fmt.Fprintln(w, "       429s count every call the provider refused during the run; obeying = from the halving to the provider's last 429 (none in the run's last 2 windows).")
	fmt.Fprintf(w, "       every run is judged, not only the mean: a run below %.2f of the quota (the IETF provider's before its halving) lost a whole window or more; -e-trace DIR keeps each run's calls, decisions and key state.\n", eRunFloor)
	fmt.Fprintln(w, "       a run whose harness paused for 0.5 s or more (a busy machine) can fail decisions (1 s WithTimeout); ours and naive then fail closed, deferring tasks 5 s: a throughput dip that is the machine's.")
}

// result is variant v's result for provider p.
func (s *scenarioE) result(p, v string) eResult {
	return *find(s.Results, func(r eResult) bool { return r.Provider == p && r.Variant == v })
}

// eRows writes the rows of scenario E's table: a row shows what f says of
// each variant's result for a provider.
type eRows struct {
	s *scenarioE
	t *table
}

func (r eRows) row(name string, p providerSpec, f func(eResult) string) {
	r.t.row(name, each(r.s.Variants, func(v string) string { return f(r.s.result(p.Name, v)) }))
}

// quotaRows are a fixed quota's 429s and share.
func (r eRows) quotaRows(p providerSpec) {
	r.row("  provider 429s, per run (target 0 for ours)", p, func(r eResult) string {
		return perRun(r.Runs, func(x eRun) int { return x.Limited })
	})
	r.row(fmt.Sprintf("  throughput / quota, mean (min) (target >= %.2f)", p.Target), p, func(r eResult) string {
		return meanMin(r.Runs, func(x eRun) float64 { return x.Share })
	})
	r.row("  throughput / quota, per run", p, func(r eResult) string {
		return shares(r.Runs, func(x eRun) float64 { return x.Share })
	})
}

// halvingRows are the IETF provider's 429s and share before its quota is
// halved, and how the fleet followed it after.
func (r eRows) halvingRows(p providerSpec) {
	r.row("  provider 429s before the halving, per run (target 0)", p, func(r eResult) string {
		return perRun(r.Runs, func(x eRun) int { return x.LimitedBefore })
	})
	r.row(fmt.Sprintf("  throughput / quota before the halving (target >= %.2f)", p.Target), p, func(r eResult) string {
		return meanMin(r.Runs, func(x eRun) float64 { return x.ShareBefore })
	})
	r.row("  throughput / quota before the halving, per run", p, func(r eResult) string {
		return shares(r.Runs, func(x eRun) float64 { return x.ShareBefore })
	})
	r.row("  halved at (s after start), per run", p, func(r eResult) string {
		return strings.Join(each(r.Runs, func(x eRun) string { return fmt.Sprintf("%.1f", x.HalvedAt.Seconds()) }), " ")
	})
	r.row("  s from the halving to obeying it, per run (-: not by the end)", p, func(r eResult) string {
		return strings.Join(each(r.Runs, func(x eRun) string {
			if !x.Obeyed {
				return "-"
			}
			return fmt.Sprintf("%.1f", x.ObeyAfter.Seconds())
		}), " ")
	})
	r.row("  429s from the halving on, per run (its cost)", p, func(r eResult) string {
		return perRun(r.Runs, func(x eRun) int { return x.LimitedAfter })
	})
	r.row("  throughput / halved quota, from 1 window after it", p, func(r eResult) string {
		return meanMin(r.Runs, func(x eRun) float64 { return x.ShareAfter })
	})
}

// outcomeRows are the runs judged below the floor, and the suspensions and
// failed decisions of every run.
func (r eRows) outcomeRows(p providerSpec) {
	r.row(fmt.Sprintf("  runs below %.2f of the quota (a lost window; target none)", eRunFloor), p, func(r eResult) string {
		return below(r.Runs, p.judged)
	})
	r.row("  suspensions (429 -> fleet pause), all runs", p, func(r eResult) string {
		if r.Variant == vSleep {
			return "-"
		}
		return fmt.Sprint(total64(r.Runs, func(x eRun) int64 { return x.Suspensions }))
	})
	r.row("  decisions Redis could not make (fail closed: 5 s deferral)", p, func(r eResult) string {
		if r.Variant == vSleep {
			return "-"
		}
		return fmt.Sprint(total64(r.Runs, func(x eRun) int64 { return x.Failed }))
	})
}

// harnessRows show how late the harness's own timers and Redis were.
func (r eRows) harnessRows() {
	first := r.s.Providers[0]
	r.row("  longest pause of the harness process, 10 ms ticker (s)", first, func(r eResult) string {
		return strings.Join(each(r.Runs, func(x eRun) string { return fmt.Sprintf("%.2f", x.TickGap.Seconds()) }), " ")
	})
	r.row("  slowest Redis PING, one every 50 ms (s)", first, func(r eResult) string {
		return strings.Join(each(r.Runs, func(x eRun) string { return fmt.Sprintf("%.2f", x.SlowestPing.Seconds()) }), " ")
	})
}

// printVerdicts judges every run of every provider, variant by variant.
func (s *scenarioE) printVerdicts(w io.Writer) {
	for _, v := range s.Variants {
		var bad []string
		for _, p := range s.Providers {
			r := s.result(p.Name, v)
			if n := countBelow(r.Runs, p.judged); n > 0 {
				bad = append(bad, fmt.Sprintf("%s %d of %d (%s)", p.Name, n, len(r.Runs), below(r.Runs, p.judged)))
			}
		}
		verdict := fmt.Sprintf("every run of every provider at >= %.2f of its quota", eRunFloor)
		if len(bad) > 0 {
			verdict = fmt.Sprintf("RUNS BELOW %.2f of the quota: %s", eRunFloor, strings.Join(bad, "; "))
		}
		fmt.Fprintf(w, "per run, %-5s  %s\n", v+":", verdict)
	}
}

// printRatios compares ours with sleep and naive, provider by provider.
func (s *scenarioE) printRatios(w io.Writer) {
	for _, other := range []string{vSleep, vNaive} {
		if !slices.Contains(s.Variants, other) || !slices.Contains(s.Variants, vOurs) {
			continue
		}
		var parts []string
		for _, p := range s.Providers {
			o, b := s.result(p.Name, vOurs), s.result(p.Name, other)
			if p.Kind == kindIETF {
				parts = append(parts, fmt.Sprintf("%s: share %s after %s, 429s %d vs %d before, %d vs %d after", p.Name,
					ratio(mean(o.Runs, func(x eRun) float64 { return x.ShareBefore }), mean(b.Runs, func(x eRun) float64 { return x.ShareBefore })),
					ratio(mean(o.Runs, func(x eRun) float64 { return x.ShareAfter }), mean(b.Runs, func(x eRun) float64 { return x.ShareAfter })),
					total(o.Runs, func(x eRun) int { return x.LimitedBefore }), total(b.Runs, func(x eRun) int { return x.LimitedBefore }),
					total(o.Runs, func(x eRun) int { return x.LimitedAfter }), total(b.Runs, func(x eRun) int { return x.LimitedAfter })))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s: share %s, 429s %d vs %d", p.Name,
				ratio(mean(o.Runs, func(x eRun) float64 { return x.Share }), mean(b.Runs, func(x eRun) float64 { return x.Share })),
				total(o.Runs, func(x eRun) int { return x.Limited }), total(b.Runs, func(x eRun) int { return x.Limited })))
		}
		fmt.Fprintf(w, "ratio ours/%-5s  %s\n", other, strings.Join(parts, "; "))
	}
}

// plural is "1 round", "5 rounds".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// perRun lists f of each run, with the total first: "3 (0 1 0 2 0)".
func perRun(runs []eRun, f func(eRun) int) string {
	l := each(runs, func(x eRun) string { return strconv.Itoa(f(x)) })
	return fmt.Sprintf("%d (%s)", total(runs, f), strings.Join(l, " "))
}

func total(runs []eRun, f func(eRun) int) int {
	n := 0
	for _, x := range runs {
		n += f(x)
	}
	return n
}

func total64(runs []eRun, f func(eRun) int64) int64 {
	n := int64(0)
	for _, x := range runs {
		n += f(x)
	}
	return n
}

func mean(runs []eRun, f func(eRun) float64) float64 {
	if len(runs) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range runs {
		sum += f(x)
	}
	return sum / float64(len(runs))
}

// shares lists f of each run: "0.98 0.97 1.00".
func shares(runs []eRun, f func(eRun) float64) string {
	return strings.Join(each(runs, func(x eRun) string { return fmt.Sprintf("%.2f", f(x)) }), " ")
}

// countBelow counts the runs whose f is below eRunFloor.
func countBelow(runs []eRun, f func(eRun) float64) int {
	n := 0
	for _, x := range runs {
		if f(x) < eRunFloor {
			n++
		}
	}
	return n
}

// below lists the runs whose f is below eRunFloor: "none", or
// "r3 0.50, r5 0.00".
func below(runs []eRun, f func(eRun) float64) string {
	var l []string
	for i, x := range runs {
		if f(x) < eRunFloor {
			l = append(l, fmt.Sprintf("r%d %.2f", i+1, f(x)))
		}
	}
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// ints formats counts: "50 49 0 0".
func ints(l []int) string {
	return strings.Join(each(l, func(n int) string { return strconv.Itoa(n) }), " ")
}

// meanMin formats the mean of f over the runs and its least value.
func meanMin(runs []eRun, f func(eRun) float64) string {
	if len(runs) == 0 {
		return "-"
	}
	low := f(runs[0])
	for _, x := range runs[1:] {
		low = min(low, f(x))
	}
	return fmt.Sprintf("%.2f (%.2f)", mean(runs, f), low)
}

// eVariants are scenario E's variants, in the order the first round runs
// them.
var eVariants = []string{vSleep, vNaive, vOurs}
