package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
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
//     how many responses each was within lLearnTolerance of the provider's;
//     beside the fleet, a serial probe (runLProbe: one call at a time, an
//     endpoint and a key of its own) gives the exact count the verdict
//     uses;
//   - ours-10x-s: ours-10x told the same rates as per-second tiers
//     (PerSecond(10*RPM/60), PerSecond(10*TPM/60).In("tokens"), no burst
//     said), against headers that state per-minute quotas: a learned limit
//     must bind whatever the tiers' periods (issue 29, item 10). Learned,
//     probed and reported as ours-10x, rates compared per second and
//     bursts in units whatever the tier's period (lRateBurst).
//
// Each task is throttle.NewTask(..., throttle.Key(lKey), throttle.Uses(
// "tokens", estimate)); its handler calls the provider, hands every
// response to throttle.Observe (a 429 returns its RateLimited error: the key
// is suspended fleet-wide and the task deferred) and, in the mode where the
// provider settles each call to its usage (2xmedian, refunds), settles the task's
// tokens with throttle.Used(ctx, "tokens", usage). Under max the provider
// keeps the estimate charged, and so does ours.

// Scenario L's variants of ours.
const (
	lOurs        = "ours"         // the stated limits (and the bucket's burst)
	lOurs10x     = "ours-10x"     // 10x the stated limits, to be learned from the headers
	lOurs10xS    = "ours-10x-s"   // the same as per-second tiers, to learn per-minute quotas into them
	lOursEnqueue = "ours-enqueue" // ours, its producers calling Limiter.Enqueue
)

// lLearners are the variants of ours told limits too high, whose learning
// from the headers is checked, probed and reported (printLLearning).
var lLearners = []string{lOurs10x, lOurs10xS}

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
// factor times the stated ones, as tiers of per (time.Minute, or
// time.Second: the per-minute figures over 60, rounded down, at least 1);
// factor 1 with the bucket's burst when it holds other than per's worth,
// else with none said (per's worth of the configured rate).
func oursLLMLimits(lim llmLimits, factor int, per time.Duration) []throttle.Limit {
	tier := throttle.PerMinute
	if per == time.Second {
		tier = throttle.PerSecond
	} else if per != time.Minute {
		panic(fmt.Sprintf("oursLLMLimits: tiers per %v: only per second or per minute", per))
	}
	n := func(perMinute int) int { return max(factor*perMinute*int(per/time.Second)/60, 1) }
	req := tier(n(lim.RPM))
	tok := tier(n(lim.TPM)).In(lUnit)
	if factor == 1 && lim.Capacity != per {
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
	// Probe (lLearners) is the serial learning probe run beside the fleet:
	// the exact count the fleet's bursts of responses cannot give.
	Probe *lProbe `json:",omitempty"`
}

// lUnitLearning is one unit's learning: the provider's rate (per second)
// and capacity, when a poll first saw the limit in force within
// lLearnTolerance of each (since the start; -1 never) and how many
// responses the handlers had had by then, and the limit in force at the
// end. RateSeen and BurstSeen (lLearners) are a tighter bound: the fewest
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

// lRateBurst is a bucket's rate per second and burst (Burst, or N when
// Burst is 0), in its unit: what the learning checks compare with the
// provider's rate per second and what its bucket holds, whatever the
// tier's period.
func lRateBurst(l throttle.Limit) (rate, burst float64) {
	b := l.Burst
	if b == 0 {
		b = l.N
	}
	return float64(l.N) / l.Per.Seconds(), float64(b)
}

// learnedIn reads unit's bucket among limits in force: whether its rate
// and its burst are within lLearnTolerance of the provider's, the bucket,
// and whether there is one.
func (u lUnitLearning) learnedIn(limits []throttle.Limit) (rate, burst bool, in throttle.Limit, found bool) {
	in, found = tierOf(limits, u.Unit)
	if !found {
		return false, false, in, false
	}
	r, b := lRateBurst(in)
	return near(r, u.ProviderRate), near(b, u.ProviderBurst), in, true
}

// oursVariant is scenario L's ours, factor times the stated limits as
// tiers of per (oursLLMLimits); with byEnqueue, its producers enqueue
// through Limiter.Enqueue.
func oursVariant(factor int, per time.Duration, byEnqueue bool) lVariantFunc {
	return func(ctx context.Context, e *env, r *lRun) (lClientStats, error) {
		lNamesMu.Lock()
		name := fmt.Sprintf("ours%dx", factor)
		if per == time.Second {
			name += "-s"
		}
		queue, prefix := e.names("l", name)
		lNamesMu.Unlock()
		o := &lOursRun{e: e, r: r, factor: factor, limits: oursLLMLimits(r.Limits, factor, per), byEnqueue: byEnqueue, queue: queue, prefix: prefix,
			set: newTaskSet(len(r.Tasks)), c: newCounters(),
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
	limits        []throttle.Limit // what the key is told (oursLLMLimits)
	byEnqueue     bool             // the producers call Limiter.Enqueue
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
	// learn is what the poll and (lLearners) the handlers saw of the key's
	// limits in force, under learnMu; inspector reads the key; learnedAll
	// stops the handlers' reads once every unit is learned.
	learnMu    sync.Mutex
	learn      *lLearning
	inspector  *throttle.Limiter
	learnedAll atomic.Bool
}

// checkLearned (lLearners) reads the key right after a handler's Observe
// and notes, per unit, the fewest responses after which its rate and
// burst in force were within lLearnTolerance of the provider's (per
// second and in units, whatever the tier's period).
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
		rate, burst, _, _ := u.learnedIn(st.InForce)
		if rate {
			u.RateSeen = fewest(u.RateSeen, n)
		}
		if burst {
			u.BurstSeen = fewest(u.BurstSeen, n)
		}
		all = all && u.RateSeen >= 0 && u.BurstSeen >= 0
	}
	if all {
		o.learnedAll.Store(true)
	}
}

// The serial learning probe of lLearners: the fleet's first lProcesses x
// r.Workers calls go out at once and their responses come back together,
// so its reads tell only "after at most N responses". The probe makes calls
// one at a time, beside the fleet, on an endpoint of its own at the
// provider (the run's limits, r.Endpoint+lProbeSuffix) through a key of its
// own (lKey+lProbeSuffix, under the run's prefix, told the fleet's
// limits), and reads the key after each response: after how many
// responses each unit's rate and burst in force were within
// lLearnTolerance of the provider's, exactly.
const (
	lProbeSuffix = "-probe"
	lProbeCalls  = 20 // the most calls the probe makes
)

// lProbe is what the serial probe saw: per unit, after how many responses
// the key's rate and burst in force were first within lLearnTolerance of
// the provider's (-1: not within lProbeCalls calls); each call declares
// the run's first task's estimate (Estimate) and reports its usage (Used).
type lProbe struct {
	Endpoint, Key    string
	Estimate, Used   int
	Calls, Responses int // calls made, and answered (200 or 429)
	Limited          int // 429s
	Units            []lProbeUnit
	// Err is what stopped the probe before its units were learned or its
	// calls made (a call that failed, a read of the key that failed).
	Err string `json:",omitempty"`
}

// lProbeUnit is one unit of the probe: the provider's figures, the
// responses after which the rate (the burst) in force was first within
// lLearnTolerance of them (-1 never), the limit in force at the end, and
// the responses whose x-ratelimit-reset of the unit was 0s: a full bucket,
// which Observe reads as holding what is left (quota.bucketCapacity), as
// one call at a time finds it whenever the call's latency refills what it
// took.
type lProbeUnit struct {
	Unit                        string
	ProviderRate, ProviderBurst float64
	Rate, Burst                 int
	End                         throttle.Limit
	Found                       bool
	Full                        int
}

// responses is how many responses it took to learn both the rate and the
// burst (-1: not both).
func (u lProbeUnit) responses() int {
	if u.Rate < 0 || u.Burst < 0 {
		return -1
	}
	return max(u.Rate, u.Burst)
}

// learned reports whether every unit's rate and burst were learned, and
// after how many responses the last of them was.
func (p *lProbe) learned() (int, bool) {
	most := 0
	for _, u := range p.Units {
		n := u.responses()
		if n < 0 {
			return -1, false
		}
		most = max(most, n)
	}
	return most, len(p.Units) > 0
}

// onlyFullBursts says, when every figure the probe missed is a burst whose
// bucket every response showed full, that the rates were learned and why
// the bursts were not ("" otherwise).
func (p *lProbe) onlyFullBursts() string {
	rates := 0
	for _, u := range p.Units {
		if u.Rate < 0 || (u.Burst < 0 && u.Full < p.Responses) {
			return ""
		}
		rates = max(rates, u.Rate)
	}
	return fmt.Sprintf(": the rates after %d, the bursts missed with every response showing the buckets full", rates)
}

// runLProbe runs the serial probe of a learner's run r, its key under
// prefix and told limits: each call a task run through a Limiter's middleware whose
// handler calls the provider, hands the response to Observe and, when the
// provider settles calls, settles the task's tokens with Used, as the
// fleet's handler does; after each, Inspect. It stops once every unit is
// learned, after lProbeCalls calls, or on an error (p.Err).
func runLProbe(ctx context.Context, e *env, prefix string, r *lRun, limits []throttle.Limit) *lProbe {
	l := r.Limits
	p := &lProbe{Endpoint: r.Endpoint + lProbeSuffix, Key: lKey + lProbeSuffix, Units: []lProbeUnit{
		{Unit: "requests", ProviderRate: l.requestRate(), ProviderBurst: l.requestCapacity(), Rate: -1, Burst: -1},
		{Unit: lUnit, ProviderRate: l.tokenRate(), ProviderBurst: l.tokenCapacity(), Rate: -1, Burst: -1},
	}}
	if len(r.Tasks) == 0 {
		p.Err = "no task to take the estimate from"
		return p
	}
	t := r.Tasks[0]
	p.Estimate, p.Used = t.Estimate, t.used()
	r.Provider.add(p.Endpoint, l)
	// The run's own bound for its setup (see run), and no log lines.
	lim := throttle.NewLimiter(e.ctl, throttle.WithPrefix(prefix), throttle.WithTimeout(10*time.Second),
		throttle.WithLogger(slog.New(slog.DiscardHandler)))
	defer lim.Close()
	if err := lim.SetLimits(ctx, p.Key, limits...); err != nil {
		p.Err = fmt.Sprintf("setting the key's limits: %v", err)
		return p
	}
	h := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		p.Calls++
		resp, usage, err := r.Provider.call(ctx, p.Endpoint, p.Estimate, p.Used)
		if err != nil {
			return err
		}
		p.Responses++
		for i := range p.Units {
			if resp.Header.Get("x-ratelimit-reset-"+p.Units[i].Unit) == "0s" {
				p.Units[i].Full++
			}
		}
		if limited := throttle.Observe(ctx, resp); limited != nil {
			p.Limited++
			return limited
		}
		if r.Mode.Settle {
			return throttle.Used(ctx, lUnit, usage)
		}
		return nil
	}))
	// One call at a time, and no faster than the provider's rates (its
	// buckets, and the key's once learned, refill what each call takes):
	// the key never defers a call (outside an asynq server, the middleware
	// would re-enqueue a copy of the task).
	every := time.Duration(max(1/l.requestRate(), float64(p.Estimate)/l.tokenRate()) * float64(time.Second))
	var deferred atomic.Int64
	lim.OnEvent(func(ev throttle.Event) {
		if !ev.HandlerRan && ev.Outcome != throttle.Ran {
			deferred.Add(1)
		}
	})
	next := time.Now()
	for p.Calls < lProbeCalls {
		if sleepCtx(ctx, time.Until(next)) != nil {
			p.Err = fmt.Sprintf("call %d: %v", p.Calls+1, ctx.Err())
			return p
		}
		next = time.Now().Add(every)
		answered := p.Responses
		err := h.ProcessTask(ctx, keyedTask(lTaskType, lPayload(t), throttle.Key(p.Key), throttle.Uses(lUnit, p.Estimate)))
		var rl *throttle.RateLimitedError
		switch {
		case p.Responses == answered:
			if err == nil {
				err = errors.New("the handler made no call")
			}
			if deferred.Load() > 0 {
				err = fmt.Errorf("the key deferred the call: %w", err)
			}
			p.Err = fmt.Sprintf("call %d: %v", p.Calls+1, err)
			return p
		case err != nil && !errors.As(err, &rl):
			p.Err = fmt.Sprintf("call %d: %v", p.Calls, err)
			return p
		}
		st, err := lim.Inspect(ctx, p.Key)
		if err != nil {
			p.Err = fmt.Sprintf("reading the key after response %d: %v", p.Responses, err)
			return p
		}
		for i := range p.Units {
			u := &p.Units[i]
			rate, burst, in, ok := newLUnitLearning(u.Unit, u.ProviderRate, u.ProviderBurst).learnedIn(st.InForce)
			u.End, u.Found = in, ok
			if u.Rate < 0 && rate {
				u.Rate = p.Responses
			}
			if u.Burst < 0 && burst {
				u.Burst = p.Responses
			}
		}
		if _, ok := p.learned(); ok {
			return p
		}
	}
	return p
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
	limits := o.limits
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
	// lLearners: the serial probe, beside the fleet (its own endpoint and
	// key: the fleet's buckets never see it), done long before the fleet.
	probed := make(chan *lProbe, 1)
	if o.factor != 1 {
		go func() { probed <- runLProbe(ctx, o.e, o.prefix, r, limits) }()
	} else {
		probed <- nil
	}
	f, err := startFleet(o.e, spec, o.c)
	if err != nil {
		<-probed
		return lClientStats{}, err
	}
	pollCtx, stopPoll := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		o.poll(pollCtx, learn)
	}()
	tasks := r.Tasks
	mk := func(i int) *asynq.Task {
		return keyedTask(lTaskType, lPayload(tasks[i]), throttle.Key(lKey), throttle.Uses(lUnit, tasks[i].Estimate))
	}
	if o.byEnqueue {
		// The producers' Limiter has the fleet's options (Enqueue's doc).
		lim := throttle.NewLimiter(o.e.ctl, spec.throttleOpts()...)
		client := asynq.NewClientFromRedisClient(o.e.ctl)
		err = enqueueWith(ctx, len(tasks), func(ctx context.Context, i int) error {
			_, err := lim.Enqueue(ctx, client, mk(i), asynq.Queue(o.queue))
			return err
		})
		lim.Close()
	} else {
		err = enqueue(ctx, o.e, o.queue, len(tasks), mk)
	}
	if err != nil && ctx.Err() == nil {
		stopPoll()
		<-polled
		f.stop()
		<-probed
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
	learn.Probe = <-probed
	learn.Suspended = int(o.c.suspensions.Load())
	s := lClientStats{Succeeded: int(o.set.done.Load()), Calls: int(o.calls.Load()), Pauses: learn.Suspensions, Deferrals: int(o.c.denials.Load()),
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
				rate, burst, in, ok := u.learnedIn(st.InForce)
				u.End, u.Found = in, ok
				if u.RateAt < 0 && rate {
					u.RateAt, u.RateResponses = since, responses
				}
				if u.BurstAt < 0 && burst {
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

// printLLearning prints, for a run of one of lLearners, what its key
// learned: issue 24's target for limits configured 10x too high (and issue
// 29 item 10's, ours-10x-s: whatever the tiers' periods). The verdict takes the
// serial probe's exact count when the probe ran; else the fleet's upper
// bound.
func printLLearning(w io.Writer, c lCase, r lResult) {
	l := r.Client.Learning
	if !slices.Contains(lLearners, r.Variant) || l == nil {
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
	fleet := fmt.Sprintf("NOT LEARNED (MISSED): not every unit's rate and burst came within %.0f %% of the provider's", lLearnTolerance*100)
	if all {
		fleet = fmt.Sprintf("learned after at most %d responses %s (<= %d)", most, verdict(most <= lLearnResponses), lLearnResponses)
	}
	learned := fleet
	if p := l.Probe; p != nil {
		printLProbe(w, p)
		n, ok := p.learned()
		bound := fmt.Sprintf("the fleet's bound: after <= %d", most)
		if !all {
			bound = "the fleet: not learned"
		}
		switch {
		case p.Err != "" && !ok:
			learned = fmt.Sprintf("serial probe FAILED (%s), so by the fleet's upper bound: %s", p.Err, fleet)
		case !ok:
			learned = fmt.Sprintf("NOT LEARNED (MISSED) by the serial probe: not every unit's rate and burst within %.0f %% of the provider's after %d calls%s (%s)",
				lLearnTolerance*100, p.Calls, p.onlyFullBursts(), bound)
		default:
			learned = fmt.Sprintf("learned after %d responses (the serial probe's exact count; %s) %s (<= %d)", n, bound, verdict(n <= lLearnResponses), lLearnResponses)
		}
	}
	fmt.Fprintf(w, "targets %s %s: %s; suspensions %d %s (<= %d); 429s %d; tasks deferred by a 429 %d; polls %d (%d failed)\n", c.Name, r.Variant,
		learned, l.Suspensions, verdict(l.Suspensions <= lLearnSuspensions), lLearnSuspensions, r.Limited, l.Suspended, l.Polls, l.PollErrors)
}

// printLProbe prints the serial probe's line of a learning block.
func printLProbe(w io.Writer, p *lProbe) {
	units := make([]string, len(p.Units))
	for i, u := range p.Units {
		// "requests rate and burst within 5 % after 1 response(s), tokens
		// after 1": the first unit says what is counted.
		name, within := u.Unit, ""
		if i == 0 {
			name, within = u.Unit+" rate and burst", fmt.Sprintf(" within %.0f %%", lLearnTolerance*100)
		}
		switch n := u.responses(); {
		case n >= 0 && u.Rate == u.Burst:
			units[i] = fmt.Sprintf("%s%s after %d response(s)", name, within, n)
		case n >= 0:
			units[i] = fmt.Sprintf("%s%s after %d response(s) (rate after %d, burst after %d)", name, within, n, u.Rate, u.Burst)
		default:
			end := "no tier of the unit"
			if u.Found {
				end = u.End.String()
			}
			units[i] = fmt.Sprintf("%s NOT LEARNED (MISSED) within %d calls (rate %s, burst %s; in force: %s; the provider's %s/s holding %s)",
				name, p.Calls, probeAfter(u.Rate), probeAfter(u.Burst), end, fmtRate(u.ProviderRate), fmtRate(u.ProviderBurst))
		}
	}
	var verdictOf string
	if n, ok := p.learned(); ok {
		verdictOf = fmt.Sprintf("; target <= %d %s", lLearnResponses, verdict(n <= lLearnResponses))
	} else {
		verdictOf = fmt.Sprintf("; target <= %d MISSED", lLearnResponses)
	}
	stopped := ""
	if p.Err != "" {
		stopped = "; STOPPED: " + p.Err
	}
	full := make([]string, len(p.Units))
	for i, u := range p.Units {
		full[i] = fmt.Sprintf("%s %d", u.Unit, u.Full)
	}
	fmt.Fprintf(w, "  serial probe (one call at a time, own endpoint %s and key %s, each declaring %d tokens, using %d): %s; %d call(s), %d 429(s); of its %d response(s), showing the bucket full (reset 0s: a full bucket, which Observe reads as holding what is left): %s%s%s\n",
		p.Endpoint, p.Key, p.Estimate, p.Used, strings.Join(units, ", "), p.Calls, p.Limited, p.Responses, strings.Join(full, ", "), stopped, verdictOf)
}

// probeAfter says after how many of the probe's responses a figure was
// learned.
func probeAfter(n int) string {
	if n < 0 {
		return "never"
	}
	return fmt.Sprintf("after %d", n)
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
