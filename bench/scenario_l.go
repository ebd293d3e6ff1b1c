package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Scenario L, LLM quotas (issue 24): tasks that each cost 1 request and N
// tokens, against a strict fake provider that meters both as token buckets
// (llm_provider.go), drained by the OpenAI cookbook's parallel processor
// (cookbook.go) in one process and in 3 processes each given the full
// stated limits, and by ours (scenario_l_ours.go: a fleet with
// throttle.Uses, throttle.Used and throttle.Observe), given the stated
// limits or 10x them. A case is a mode (how estimates are made and
// counted) against buckets of one capacity; every (case, variant) run has
// an endpoint of its own, and all of them run at once.

// Scenario L's workload: a task's usage is lognormal with median
// lMedianTokens and 99th percentile lP99Tokens, capped at lMaxUsage; an
// eighth of it is the completion (at most lMaxTokens at the cap), the rest
// the prompt. Every task declares max_tokens = lMaxTokens.
const (
	lMedianTokens    = 1000
	lP99Tokens       = 20000
	lMaxUsage        = 32768
	lMaxTokens       = 4096
	lCompletionShare = 8
	lZ99             = 2.3263478740408408 // the standard normal's 99th percentile
)

// Scenario L's shape.
const (
	lProcesses   = 3                             // cookbook-x3's processes, and ours' servers
	lWorkers     = 16                            // concurrent calls per process
	lWarmup      = time.Second                   // the measured span starts this long after the start at the earliest
	lSpentAt     = time.Second                   // ... and once the binding bucket holds at most this much of its rate
	lDrainTarget = 12 * time.Second              // -l-tasks 0: tasks for about this ideal drain past the burst (-quick: half)
	lMaxTasks    = 5000                          // -l-tasks 0: at most this many
	defaultLRPM  = 1000                          // the provider's stated limits
	defaultLTPM  = 2000000                       //
	lCapSlack    = cookbookPause + 5*time.Second // a run's cut-off: 1.5 x its ideal drain + this
)

// llmTask is one task of scenario L: the tokens its call will use, and the
// estimate its client declares (set by the mode).
type llmTask struct {
	ID                 int
	Prompt, Completion int
	Estimate           int
}

func (t llmTask) used() int { return t.Prompt + t.Completion }

// llmWorkload is n tasks drawn from seed: the same seed, the same tasks.
func llmWorkload(n int, seed uint64) []llmTask {
	rng := rand.New(rand.NewPCG(seed, 24))
	sigma := math.Log(float64(lP99Tokens)/lMedianTokens) / lZ99
	tasks := make([]llmTask, n)
	for i := range tasks {
		total := int(math.Round(lMedianTokens * math.Exp(sigma*rng.NormFloat64())))
		total = min(max(total, 16), lMaxUsage)
		c := max(total/lCompletionShare, 1)
		tasks[i] = llmTask{ID: i, Prompt: total - c, Completion: c}
	}
	return tasks
}

// lMode is how the tasks' estimates are made, and how the provider counts
// them (issue 24's two targets).
type lMode struct {
	Name, Title string
	// Settle: the provider settles each call to its usage (else it
	// charges the estimate, as OpenAI does).
	Settle bool
	// Target is the least share of the binding unit's limit to reach;
	// MaxDeferrals, when set, the most deferrals per task (ours).
	Target, MaxDeferrals float64
	estimate             func(t llmTask) int
	// workload draws the mode's tasks (nil: llmWorkload); fixed, when set,
	// makes the mode a case of its own (see lFixed).
	workload func(n int, seed uint64) []llmTask
	fixed    *lFixed
}

// lFixed is a case whose limits and tasks an issue fixed, whatever
// -l-capacity, -l-rpm and -l-tpm say: one case of its own name.
type lFixed struct {
	Name     string // "L5"
	RPM, TPM int
	Capacity time.Duration
	Tasks    int // unless -l-tasks says
	// Variants run on it when -l-variants is not given.
	Variants []string
}

// Issue 29, item 9 ("refunds must reach the backlog"): a key of 40
// requests/s and 2,000 tokens/s, each a bucket holding one second; 300
// tasks each booking 200 tokens, an upper bound of what they use, 20 to
// 180 (mean 100), which the provider charges when the call ends, as
// Anthropic does for output tokens.
const (
	lRefundEstimate           = 200
	lRefundUseMin, lRefundUse = 20, 180
)

// lRefundWorkload is n tasks using lRefundUseMin to lRefundUse tokens
// each, uniformly, drawn from seed.
func lRefundWorkload(n int, seed uint64) []llmTask {
	rng := rand.New(rand.NewPCG(seed, 29))
	tasks := make([]llmTask, n)
	for i := range tasks {
		total := lRefundUseMin + rng.IntN(lRefundUse-lRefundUseMin+1)
		c := max(total/lCompletionShare, 1)
		tasks[i] = llmTask{ID: i, Prompt: total - c, Completion: c}
	}
	return tasks
}

var lModes = []lMode{
	{Name: "max", Title: fmt.Sprintf("estimate = prompt + max_tokens (%d), charged by the provider as OpenAI does", lMaxTokens),
		Target: 0.90, estimate: func(t llmTask) int { return t.Prompt + lMaxTokens }},
	{Name: "2xmedian", Title: fmt.Sprintf("estimate = 2x the median usage (%d), the provider settling each call to its usage", 2*lMedianTokens),
		Settle: true, Target: 0.95, estimate: func(llmTask) int { return 2 * lMedianTokens }},
	{Name: "refunds", Title: fmt.Sprintf("issue 29 item 9: estimate %d tokens, an upper bound of the usage (%d..%d, mean %d), the provider settling each call to its usage",
		lRefundEstimate, lRefundUseMin, lRefundUse, (lRefundUseMin+lRefundUse)/2),
		Settle: true, Target: 0.90, MaxDeferrals: 1.5, estimate: func(llmTask) int { return lRefundEstimate }, workload: lRefundWorkload,
		fixed: &lFixed{Name: "L5", RPM: 2400, TPM: 120000, Capacity: time.Second, Tasks: 300, Variants: []string{lOurs, lOursEnqueue}}},
}

var lModeNames = each(lModes, func(m lMode) string { return m.Name })

// charge is what the provider ends up charging for t in mode m.
func (m lMode) charge(t llmTask) int {
	if m.Settle {
		return t.used()
	}
	return t.Estimate
}

// draw is n tasks of m's workload.
func (m lMode) draw(n int, seed uint64) []llmTask {
	if m.workload != nil {
		return m.withEstimates(m.workload(n, seed))
	}
	return m.withEstimates(llmWorkload(n, seed))
}

// withEstimates is tasks with m's estimates.
func (m lMode) withEstimates(tasks []llmTask) []llmTask {
	out := make([]llmTask, len(tasks))
	for i, t := range tasks {
		t.Estimate = m.estimate(t)
		out[i] = t
	}
	return out
}

// lOptions are scenario L's flags (-l-...).
type lOptions struct {
	variants, modes []string // variants nil: each case's defaults
	tasks           int      // 0: sized per case (lDrainTarget)
	rpm, tpm        int
	capacities      []time.Duration
	latency         time.Duration
	seed            uint64
}

// lConf is what -l-... said (the env is shared by every scenario; L keeps
// its options here, set once by parseFlags).
var lConf = lOptions{modes: lModeNames, rpm: defaultLRPM, tpm: defaultLTPM,
	capacities: []time.Duration{time.Second, time.Minute}, latency: 200 * time.Millisecond, seed: 1}

// declareLFlags declares scenario L's flags; the function it returns checks
// them once flag.Parse has run, and sets lConf.
func declareLFlags() func() error {
	vars := flag.String("l-variants", "", "scenario L: variants to run on every case, comma-separated (default: "+strings.Join(lVariants, ",")+"; on L5 "+lOurs+","+lOursEnqueue+") (cookbook-x1: the OpenAI cookbook's parallel processor in one process; cookbook-x3: in 3 processes, each given the full limits; ours: a fleet of 3 asynq servers x 16 given the stated limits; ours-10x: given 10x them, to learn them from the headers; ours-10x-s: given 10x them as per-second tiers, PerSecond(10*RPM/60) and PerSecond(10*TPM/60).In(\"tokens\"), to learn the per-minute quotas the headers state into them (issue 29 item 10; only when named here, e.g. -l-modes refunds -l-variants ours,ours-10x,ours-10x-s); ours-enqueue: ours, its producers calling Limiter.Enqueue)")
	modes := flag.String("l-modes", strings.Join(lModeNames, ","), "scenario L: estimate modes, comma-separated (max: prompt + max_tokens, charged as OpenAI does; 2xmedian: twice the median usage, the provider settling each call to its usage; refunds: issue 29's case L5, its own limits and tasks)")
	tasks := flag.Int("l-tasks", 0, "scenario L: tasks per run (0: enough for an ideal drain of about 12 s past the time one process needs to spend a bucket's burst; -quick 6 s)")
	rpm := flag.Int("l-rpm", defaultLRPM, "scenario L: the provider's requests per minute")
	tpm := flag.Int("l-tpm", defaultLTPM, "scenario L: the provider's tokens per minute")
	capacity := flag.String("l-capacity", "1s,1m", "scenario L: what each of the provider's buckets holds, as a time at its rate, comma-separated: a case each (1s: a minute's limit enforced per second; 1m: the stated limit as a burst)")
	latency := flag.Duration("l-latency", lConf.latency, "scenario L: how long the provider takes over an admitted call")
	seed := flag.Uint64("l-seed", lConf.seed, "scenario L: the workload's seed")
	return func() error {
		o := lOptions{tasks: *tasks, rpm: *rpm, tpm: *tpm, latency: *latency, seed: *seed}
		var err error
		if o.capacities, err = durationList("-l-capacity", *capacity, time.Millisecond, time.Hour); err != nil {
			return err
		}
		if *vars != "" {
			if o.variants, err = variantList("-l-variants", *vars, lAllVariants); err != nil {
				return err
			}
		}
		if o.modes, err = variantList("-l-modes", *modes, lModeNames); err != nil {
			return err
		}
		switch {
		case o.tasks < 0 || o.rpm < 1 || o.tpm < 1:
			return fmt.Errorf("-l-tasks must be at least 0, -l-rpm and -l-tpm at least 1; got %d, %d, %d", o.tasks, o.rpm, o.tpm)
		case o.latency < 0 || o.latency > 10*time.Second:
			return fmt.Errorf("-l-latency must be from 0 to 10s, got %v", o.latency)
		}
		lConf = o
		return nil
	}
}

// durationList reads a comma-separated list of durations, each from lo to
// hi.
func durationList(flagName, list string, lo, hi time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	for _, s := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < lo || d > hi {
			return nil, fmt.Errorf("%s: %q is not a duration from %v to %v", flagName, s, lo, hi)
		}
		out = append(out, d)
	}
	return out, nil
}

// limits are the provider's limits in mode m, its buckets holding
// capacity of their rates.
func (o lOptions) limits(capacity time.Duration, m lMode) llmLimits {
	return llmLimits{RPM: o.rpm, TPM: o.tpm, Capacity: capacity, Settle: m.Settle}
}

// lIdeal is the drain time lim allows tasks in mode m: each bucket's
// capacity at once, then its rate, whichever unit takes longer (binding).
func lIdeal(tasks []llmTask, m lMode, lim llmLimits) (time.Duration, string) {
	tokens := 0.0
	for _, t := range tasks {
		tokens += float64(m.charge(t))
	}
	byRequests := (float64(len(tasks)) - lim.requestCapacity()) / lim.requestRate()
	byTokens := (tokens - lim.tokenCapacity()) / lim.tokenRate()
	binding := "tokens"
	if byRequests > byTokens {
		binding = "requests"
	}
	return time.Duration(max(byRequests, byTokens, 0) * float64(time.Second)), binding
}

// lTasks is the workload of mode m against lim: -l-tasks tasks, or the
// fewest whose ideal drain reaches target past the time one process needs
// to spend the buckets' saved burst (lBurstTime), at most lMaxTasks.
func lTasks(o lOptions, m lMode, lim llmLimits, target time.Duration) []llmTask {
	switch {
	case o.tasks > 0:
		return m.draw(o.tasks, o.seed)
	case m.fixed != nil:
		return m.draw(m.fixed.Tasks, o.seed)
	}
	all := m.draw(lMaxTasks, o.seed)
	target += lBurstTime(all, m, lim, o.latency)
	n := sort.Search(len(all), func(i int) bool {
		d, _ := lIdeal(all[:i+1], m, lim)
		return d >= target
	})
	return all[:min(n+1, len(all))]
}

// lBurstTime is about how long one process of lWorkers, each call taking
// latency, needs to draw the buckets down from full to lSpentAt of their
// rates, drawing at its most while they refill; a minute at most.
func lBurstTime(tasks []llmTask, m lMode, lim llmLimits, latency time.Duration) time.Duration {
	if latency <= 0 || len(tasks) == 0 {
		return 0
	}
	charge := 0.0
	for _, t := range tasks {
		charge += float64(m.charge(t))
	}
	calls := float64(lWorkers) / latency.Seconds() // the process's calls per second
	longest := 0.0
	for _, u := range []struct{ draw, rate, capacity float64 }{
		{calls, lim.requestRate(), lim.requestCapacity()},
		{calls * charge / float64(len(tasks)), lim.tokenRate(), lim.tokenCapacity()},
	} {
		saved := u.capacity - u.rate*lSpentAt.Seconds()
		switch {
		case saved <= 0:
		case u.draw <= u.rate:
			longest = math.Inf(1)
		default:
			longest = max(longest, saved/(u.draw-u.rate))
		}
	}
	return time.Duration(min(longest, time.Minute.Seconds()) * float64(time.Second))
}

// Scenario L's variants, in the order they are printed.
const (
	lCookbook1 = "cookbook-x1" // the cookbook's script, one process
	lCookbook3 = "cookbook-x3" // the same in lProcesses processes, each given the full limits
)

// lVariants run on every case but L5 by default; lAllVariants are those
// -l-variants knows (ours-10x-s, issue 29 item 10's, only when it says:
// another fleet in every case would load the machine the default run
// shares with its other fleets, and ours-10x already covers learning).
var (
	lVariants    = []string{lCookbook1, lCookbook3, lOurs, lOurs10x}
	lAllVariants = []string{lCookbook1, lCookbook3, lOurs, lOurs10x, lOurs10xS, lOursEnqueue}
)

// lRun is one run of scenario L as a variant sees it.
type lRun struct {
	Mode     lMode
	Endpoint string       // the provider endpoint of this run
	Provider *llmProvider // call it with Provider.call(ctx, Endpoint, t.Estimate, t.used())
	Limits   llmLimits    // the stated limits (RPM, TPM), what a variant is told
	Tasks    []llmTask    // the workload, estimates set
	Workers  int          // concurrent calls per process (an asynq server's concurrency)
}

// lClientStats is what a variant reports of its run.
type lClientStats struct {
	Succeeded, Failed int // tasks done, and tasks given up (ours: archived)
	Calls             int // calls made, retries included
	Pauses            int // cool-downs begun (the cookbook's 15 s pauses; ours: the key's suspensions)
	// End is when the variant stopped draining, when it knows: its last
	// task done, or the cut-off (ours: its fleet stops after). Zero: when
	// it returned.
	End time.Time
	// Ours: the middleware's deferrals (Deferred and Suspended events).
	Deferrals int
	// Ours: tasks whose call succeeded twice, Used calls that failed, and
	// what its key's limits in force were (lLearning).
	Duplicates, UsedErrors int
	Learning               *lLearning `json:",omitempty"`
	// Ours: the longest time from a task's admission (as the middleware
	// was told it) to the provider's decision on its call, and the calls
	// decided later than the middleware's headroom after theirs.
	Lag  time.Duration
	Late int
}

// lVariantFunc is scenario L's extension point: one way to drain a run's
// tasks through its provider endpoint. It returns once every task is done
// or given up, or when ctx ends (the run's cut-off: the run is then
// unfinished, not failed); an error fails the scenario.
//
// Ours is two of them (scenario_l_ours.go): a fleet of lProcesses servers
// x r.Workers told the stated limits (with the burst the provider's
// buckets hold), and ones told 10x them (as per-minute tiers, or as
// per-second ones), left to learn them from the provider's headers.
type lVariantFunc func(ctx context.Context, e *env, r *lRun) (lClientStats, error)

var lVariantFuncs = map[string]lVariantFunc{
	lCookbook1:   cookbookVariant(1),
	lCookbook3:   cookbookVariant(lProcesses),
	lOurs:        oursVariant(1, time.Minute, false),
	lOurs10x:     oursVariant(10, time.Minute, false),
	lOurs10xS:    oursVariant(10, time.Second, false),
	lOursEnqueue: oursVariant(1, time.Minute, true),
}

// cookbookVariant runs the cookbook's script in processes processes at
// once, each told the full stated limits, all reading one "file" (the
// tasks, in order).
func cookbookVariant(processes int) lVariantFunc {
	return func(ctx context.Context, _ *env, r *lRun) (lClientStats, error) {
		file := make(chan llmTask, len(r.Tasks))
		for _, t := range r.Tasks {
			file <- t
		}
		close(file)
		next := func() (llmTask, bool) {
			t, ok := <-file
			return t, ok
		}
		call := func(ctx context.Context, t llmTask) (int, error) {
			resp, _, err := r.Provider.call(ctx, r.Endpoint, t.Estimate, t.used())
			if err != nil {
				return 0, err
			}
			return resp.StatusCode, nil
		}
		procs := make([]*cookbookInstance, processes)
		var wg sync.WaitGroup
		for i := range procs {
			procs[i] = newCookbookInstance(r.Limits.RPM, r.Limits.TPM, r.Workers, next, call)
			wg.Go(func() { procs[i].run(ctx) })
		}
		wg.Wait()
		var s lClientStats
		for _, p := range procs {
			st := p.snapshot()
			s.Succeeded += st.succeeded
			s.Failed += st.failed
			s.Calls += st.calls
			s.Pauses += st.pauses
		}
		return s, nil
	}
}

// lResult is one variant's run in one case.
type lResult struct {
	Case, Variant string
	Tasks         int
	Finished      bool
	// Drain is from the start to the variant's return; Ideal what the
	// limits allow the workload (lIdeal), Binding the unit that binds.
	Drain, Ideal time.Duration
	Binding      string
	Client       lClientStats
	// The provider's counts: calls, admitted, 429s (and the units short).
	Calls, Admitted, Limited, ShortRequests, ShortTokens int
	// The measured span, since the start: from lWarmup, or from when the
	// binding bucket held at most lSpentAt of its rate if later (the burst
	// saved in it spent: from then on the rate binds), to the last
	// admission (to the cut-off if unfinished); each unit's share of its
	// limit in it, and the rates in it.
	From, To                                 time.Duration
	Spent                                    bool // the binding bucket was drawn down to lSpentAt of its rate
	ShareRequests, ShareTokens               float64
	RequestsPerSec, TokensPerSec, UsedPerSec float64
}

// share is the share of unit's limit.
func (r lResult) share(unit string) float64 {
	if unit == "requests" {
		return r.ShareRequests
	}
	return r.ShareTokens
}

// lCase is one case of scenario L: a mode against buckets of one
// capacity, and its workload.
type lCase struct {
	Name           string // "L1": the capacity's place in -l-capacity, then the mode's in lModes
	Mode, Title    string
	Capacity       time.Duration
	Target         float64
	Tasks          int
	Charged        int // tokens the provider charges the workload in all
	Ideal          time.Duration
	Binding, Other string

	mode  lMode
	lim   llmLimits
	tasks []llmTask
}

// id names the case in endpoints and results: "1s/max".
func (c lCase) id() string { return c.Capacity.String() + "/" + c.Mode }

type scenarioL struct {
	RPM, TPM           int
	Latency            time.Duration
	Processes, Workers int
	Seed               uint64
	Cases              []lCase
	Results            []lResult
}

func runL(ctx context.Context, e *env, w io.Writer) (*scenarioL, error) {
	o := lConf
	s := &scenarioL{RPM: o.rpm, TPM: o.tpm, Latency: o.latency, Processes: lProcesses, Workers: lWorkers, Seed: o.seed}
	target := lDrainTarget
	if e.quick {
		target /= 2
	}
	for _, capacity := range o.capacities {
		for _, m := range lModes {
			if !slices.Contains(o.modes, m.Name) || m.fixed != nil {
				continue
			}
			c, err := newLCase(len(s.Cases)+1, m, o.limits(capacity, m), o, target)
			if err != nil {
				return s, err
			}
			s.Cases = append(s.Cases, c)
		}
	}
	for _, m := range lModes {
		if f := m.fixed; f != nil && slices.Contains(o.modes, m.Name) {
			c, err := newLCase(0, m, llmLimits{RPM: f.RPM, TPM: f.TPM, Capacity: f.Capacity, Settle: m.Settle}, o, target)
			if err != nil {
				return s, err
			}
			s.Cases = append(s.Cases, c)
		}
	}
	s.printHeader(w)
	p := newLLMProvider(o.latency)
	defer p.Close()
	type job struct {
		c       lCase
		variant string
	}
	var jobs []job
	for _, c := range s.Cases {
		for _, v := range o.caseVariants(c) {
			jobs = append(jobs, job{c, v})
		}
	}
	s.Results = make([]lResult, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { s.Results[i], errs[i] = lOnce(ctx, e, p, j.c, j.variant) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return s, err
	}
	for _, r := range s.Results {
		progress("L/%s/%s: %d+%d of %d in %v, %d 429s, %.2f of the %s limit", r.Case, r.Variant, r.Client.Succeeded, r.Client.Failed, r.Tasks,
			r.Drain.Round(time.Millisecond), r.Limited, r.share(r.Binding), r.Binding)
	}
	s.print(w)
	return s, nil
}

// caseVariants are the variants to run on c: -l-variants, or the case's
// defaults.
func (o lOptions) caseVariants(c lCase) []string {
	switch {
	case o.variants != nil:
		return o.variants
	case c.mode.fixed != nil:
		return c.mode.fixed.Variants
	}
	return lVariants
}

// newLCase is case number n (a fixed mode's: its own name): mode m against
// lim, its workload sized by o; an error if a task's estimate can never
// fit the token bucket.
func newLCase(n int, m lMode, lim llmLimits, o lOptions, target time.Duration) (lCase, error) {
	name := fmt.Sprintf("L%d", n)
	if m.fixed != nil {
		name = m.fixed.Name
	}
	c := lCase{Name: name, Mode: m.Name, Title: m.Title, Capacity: lim.Capacity, Target: m.Target, mode: m, lim: lim}
	c.tasks = lTasks(o, m, lim, target)
	c.Tasks = len(c.tasks)
	for _, t := range c.tasks {
		c.Charged += m.charge(t)
		if float64(t.Estimate) > lim.tokenCapacity() {
			return c, fmt.Errorf("L/%s: task %d's estimate (%d tokens) is more than the provider's token bucket holds (%.0f): raise -l-tpm or -l-capacity",
				c.id(), t.ID, t.Estimate, lim.tokenCapacity())
		}
	}
	c.Ideal, c.Binding = lIdeal(c.tasks, m, lim)
	c.Other = "requests"
	if c.Binding == "requests" {
		c.Other = "tokens"
	}
	return c, nil
}

// lOnce runs variant on case c, on an endpoint of its own, until the tasks
// are done or the run's cut-off (1.5 x its ideal drain + lCapSlack).
func lOnce(ctx context.Context, e *env, p *llmProvider, c lCase, variant string) (lResult, error) {
	name := "l-" + strings.ReplaceAll(c.id(), "/", "-") + "-" + variant
	r := lResult{Case: c.id(), Variant: variant, Tasks: c.Tasks, Ideal: c.Ideal, Binding: c.Binding}
	p.add(name, c.lim)
	start := time.Now()
	rctx, cancel := context.WithDeadline(ctx, start.Add(c.Ideal*3/2+lCapSlack))
	defer cancel()
	run := &lRun{Mode: c.mode, Endpoint: name, Provider: p, Limits: c.lim, Tasks: c.tasks, Workers: lWorkers}
	stats, err := lVariantFuncs[variant](rctx, e, run)
	end := time.Now()
	if !stats.End.IsZero() && stats.End.Before(end) {
		end = stats.End
	}
	if err != nil {
		return r, fmt.Errorf("L/%s/%s: %w", c.id(), variant, err)
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.Client, r.Drain = stats, end.Sub(start)
	r.Finished = stats.Succeeded+stats.Failed == c.Tasks
	r.measure(p.snapshot(name), c.lim, end)
	return r, nil
}

// measure takes the provider's counts, and the shares and rates of the
// measured span, from what the endpoint saw.
func (r *lResult) measure(ep *llmEndpoint, lim llmLimits, end time.Time) {
	r.Calls, r.Admitted, r.Limited, r.ShortRequests, r.ShortTokens = ep.calls, ep.admitted, ep.limited, ep.shortRequests, ep.shortTokens
	from, to := ep.start.Add(lWarmup), end
	if r.Finished {
		to = ep.start
		for _, ev := range ep.events {
			if ev.requests > 0 {
				to = ev.at
			}
		}
	}
	unit, rate, capacity := func(ev llmEvent) int { return ev.tokens }, lim.tokenRate(), lim.tokenCapacity()
	if r.Binding == "requests" {
		unit, rate, capacity = func(ev llmEvent) int { return ev.requests }, lim.requestRate(), lim.requestCapacity()
	}
	from, r.Spent = lBurstSpent(ep.events, unit, rate, capacity, ep.start, from, to)
	r.From, r.To = from.Sub(ep.start), to.Sub(ep.start)
	span := to.Sub(from).Seconds()
	if !r.Spent || span <= 0 {
		return
	}
	r.ShareRequests = lShare(ep.events, func(ev llmEvent) int { return ev.requests }, lim.requestRate(), lim.requestCapacity(), ep.start, from, to)
	r.ShareTokens = lShare(ep.events, func(ev llmEvent) int { return ev.tokens }, lim.tokenRate(), lim.tokenCapacity(), ep.start, from, to)
	var req, tok, used int
	for _, ev := range ep.events {
		if !ev.at.Before(from) && !ev.at.After(to) {
			req, tok, used = req+ev.requests, tok+ev.tokens, used+ev.used
		}
	}
	r.RequestsPerSec, r.TokensPerSec, r.UsedPerSec = float64(req)/span, float64(tok)/span, float64(used)/span
}

// lBurstSpent is when the measured span starts: from, if the bucket
// (replayed as in lShare) holds at most lSpentAt of its rate then, else the
// first change after from that leaves it so (the burst it saved is spent,
// and the rate binds from there). False if that never happens by to: the
// run never used the limit's burst, and has no span.
func lBurstSpent(events []llmEvent, unit func(llmEvent) int, rate, capacity float64, start, from, to time.Time) (time.Time, bool) {
	b := llmBucket{rate: rate, capacity: capacity, level: capacity, last: start}
	low := rate*lSpentAt.Seconds() + llmEps
	atFrom := func() bool {
		c := b
		c.refill(from)
		return c.level <= low
	}
	checked := false
	for _, ev := range events {
		if ev.at.After(to) {
			break
		}
		if !checked && !ev.at.Before(from) {
			if atFrom() {
				return from, true
			}
			checked = true
		}
		b.refill(ev.at)
		b.charge(float64(unit(ev)))
		if checked && b.level <= low {
			return ev.at, true
		}
	}
	if !checked && !from.After(to) && atFrom() {
		return from, true
	}
	return from, false
}

// lShare is the share of one unit's limit used in [from, to]: what the
// provider charged of it then, over what the limit allowed then, the level
// its bucket had at from plus rate x (to - from). The bucket is replayed
// through the charges (refunds included) from start, full then, as the
// provider's own. A run that keeps the bucket empty scores 1; one that
// stalls scores the part of the span it did not, whether the bucket holds
// a second or a minute. (Scenario E's bucketShare subtracts the level
// drawn down instead: for a bucket that holds a minute, never full in a
// short span, that scores 1 whatever the run does.) A bucket in debt at
// from (a usage settled above its estimate) allows that much less.
func lShare(events []llmEvent, unit func(llmEvent) int, rate, capacity float64, start, from, to time.Time) float64 {
	b := llmBucket{rate: rate, capacity: capacity, level: capacity, last: start}
	atFrom, seen := 0.0, false
	charged := 0.0
	for _, ev := range events {
		if ev.at.After(to) {
			break
		}
		if !seen && !ev.at.Before(from) {
			b.refill(from)
			atFrom, seen = b.level, true
		}
		b.refill(ev.at)
		b.charge(float64(unit(ev)))
		if !ev.at.Before(from) {
			charged += float64(unit(ev))
		}
	}
	if !seen {
		b.refill(from)
		atFrom = b.level
	}
	allowed := atFrom + rate*to.Sub(from).Seconds()
	if allowed <= 0 || !to.After(from) {
		return 0
	}
	return charged / allowed
}

func (s *scenarioL) printHeader(w io.Writer) {
	fmt.Fprintf(w, "\n== L. LLM quotas (issue 24): a strict provider metering requests and tokens as two token buckets per endpoint, %d RPM and %d TPM (%.1f requests/s, %.0f tokens/s); an admitted call takes %v\n",
		s.RPM, s.TPM, float64(s.RPM)/60, float64(s.TPM)/60, s.Latency)
	fmt.Fprintf(w, "   workload (seed %d): usage lognormal, median %d and p99 %d tokens, capped at %d; an eighth of it the completion, the rest the prompt; max_tokens %d\n",
		s.Seed, lMedianTokens, lP99Tokens, lMaxUsage, lMaxTokens)
	fmt.Fprintf(w, "   cookbook-x1: the OpenAI cookbook's parallel processor (capacity tracked in process at the stated per-minute rates, a minute's worth at most; 15 s pause after a 429), one process of %d workers;\n", s.Workers)
	fmt.Fprintf(w, "   cookbook-x3: %d such processes, each told the full limits, reading one queue\n", s.Processes)
	fmt.Fprintf(w, "   ours: an asynq fleet of %d servers x %d workers (worker.NewServer, the Limiter's middleware), one key: PerMinute(RPM) and PerMinute(TPM).In(\"tokens\"),\n", s.Processes, s.Workers)
	fmt.Fprintln(w, "     WithBurst of what the provider's bucket holds when it holds less than a minute's worth; tasks Uses(\"tokens\", estimate); handler: Observe(ctx, resp) on every response")
	fmt.Fprintln(w, "     (a 429 suspends the key), Used(ctx, \"tokens\", usage) when the provider settles calls to their usage (2xmedian, refunds)")
	fmt.Fprintln(w, "   ours-10x: the same fleet told 10x the stated limits (PerMinute(10*RPM), PerMinute(10*TPM).In(\"tokens\"), no burst said), left to learn the provider's from its headers")
	fmt.Fprintln(w, "   ours-10x-s: the same told 10x them as per-second tiers (PerSecond(10*RPM/60), PerSecond(10*TPM/60).In(\"tokens\"), no burst said), the headers stating per-minute quotas")
	fmt.Fprintln(w, "   ours-enqueue: ours, its 16 producers calling Limiter.Enqueue once the fleet runs (each task reserves its run time when it is enqueued)")
	fmt.Fprintln(w, "   Every case and variant runs at once, on an endpoint of its own")
}

func (s *scenarioL) print(w io.Writer) {
	for _, c := range s.Cases {
		var rs []lResult
		for _, r := range s.Results {
			if r.Case == c.id() {
				rs = append(rs, r)
			}
		}
		fmt.Fprintf(w, "-- %s. buckets holding %v of their rates (%.1f requests, %.0f tokens); %s; %d tasks, %d tokens charged in all; binding: %s (ideal drain %s)\n",
			c.Name, c.Capacity, c.lim.requestCapacity(), c.lim.tokenCapacity(), c.Title, c.Tasks, c.Charged, c.Binding, secs(c.Ideal))
		t := newTable("metric")
		for _, r := range rs {
			t.col(r.Variant)
		}
		lRows(t, c, rs)
		lOursRatioRows(t, c, rs)
		t.print(w)
		for _, r := range rs {
			printLVerdict(w, c, r)
		}
		for _, r := range rs {
			printLLearning(w, c, r)
		}
	}
	printLNotes(w)
}

// lRows are case c's rows, a column per variant.
func lRows(t *table, c lCase, rs []lResult) {
	t.row("provider 429s (target 0): short of requests / tokens", each(rs, func(r lResult) string {
		return fmt.Sprintf("%d: %d / %d", r.Limited, r.ShortRequests, r.ShortTokens)
	}))
	shareOf := func(unit string) func(lResult) string {
		return func(r lResult) string {
			if !r.Spent {
				return "-"
			}
			return fmt.Sprintf("%.2f", r.share(unit))
		}
	}
	t.row(fmt.Sprintf("share of the binding limit (%s) in the span (target >= %.2f)", c.Binding, c.Target), each(rs, shareOf(c.Binding)))
	t.row(fmt.Sprintf("share of the other limit (%s)", c.Other), each(rs, shareOf(c.Other)))
	t.row(fmt.Sprintf("tokens/s charged by the provider (limit %.0f/s)", c.lim.tokenRate()), each(rs, func(r lResult) string { return fmt.Sprintf("%.0f", r.TokensPerSec) }))
	t.row("tokens/s used (the usage the responses reported)", each(rs, func(r lResult) string { return fmt.Sprintf("%.0f", r.UsedPerSec) }))
	t.row(fmt.Sprintf("requests/s admitted (limit %.1f/s)", c.lim.requestRate()), each(rs, func(r lResult) string { return fmt.Sprintf("%.2f", r.RequestsPerSec) }))
	t.row("measured span (s after the start)", each(rs, func(r lResult) string {
		if !r.Spent {
			return "none: burst never spent"
		}
		return fmt.Sprintf("%.2f-%.2f", r.From.Seconds(), r.To.Seconds())
	}))
	t.row(fmt.Sprintf("drain time (ideal %s)", secs(c.Ideal)), each(rs, func(r lResult) string {
		if !r.Finished {
			return "DNF>" + secs(r.Drain)
		}
		return fmt.Sprintf("%s (%s)", secs(r.Drain), ratio(r.Drain.Seconds(), r.Ideal.Seconds()))
	}))
	t.row(fmt.Sprintf("tasks done / given up (cookbook: after %d attempts; ours: archived) (of %d)", cookbookMaxAttempts, c.Tasks), each(rs, func(r lResult) string {
		s := fmt.Sprintf("%d / %d", r.Client.Succeeded, r.Client.Failed)
		if r.Client.Duplicates > 0 {
			s += fmt.Sprintf(", %d DUPLICATED", r.Client.Duplicates)
		}
		if r.Client.UsedErrors > 0 {
			s += fmt.Sprintf(", %d Used failed", r.Client.UsedErrors)
		}
		return s
	}))
	t.row("calls: made / admitted by the provider", each(rs, func(r lResult) string { return fmt.Sprintf("%d / %d", r.Client.Calls, r.Admitted) }))
	t.row(fmt.Sprintf("pauses begun (cookbook: %v after a 429; ours: key suspended)", cookbookPause), each(rs, func(r lResult) string { return fmt.Sprint(r.Client.Pauses) }))
	if slices.ContainsFunc(rs, func(r lResult) bool { return r.Client.Learning != nil }) {
		target := ""
		if c.mode.MaxDeferrals > 0 {
			target = fmt.Sprintf(" (target <= %.1f)", c.mode.MaxDeferrals)
		}
		t.row("ours: deferrals per task"+target, each(rs, func(r lResult) string {
			if r.Client.Learning == nil {
				return "-"
			}
			return fmt.Sprintf("%.2f (%d)", r.deferrals(), r.Client.Deferrals)
		}))
	}
	if slices.ContainsFunc(rs, func(r lResult) bool { return r.Client.Learning != nil }) {
		t.row(fmt.Sprintf("ours: admission to the provider's decision, longest / calls later than the %v headroom", lHeadroom), each(rs, func(r lResult) string {
			if r.Client.Learning == nil {
				return "-"
			}
			return fmt.Sprintf("%v / %d", r.Client.Lag.Round(time.Millisecond), r.Client.Late)
		}))
	}
}

// deferrals is ours' deferrals per task.
func (r lResult) deferrals() float64 {
	if r.Tasks == 0 {
		return 0
	}
	return float64(r.Client.Deferrals) / float64(r.Tasks)
}

// printLVerdict marks issue 24's targets for one run: no 429, and the
// case's share of the binding unit's limit (and, where the case says, ours'
// deferrals per task).
func printLVerdict(w io.Writer, c lCase, r lResult) {
	share := r.share(c.Binding)
	drain := "drained"
	if !r.Finished {
		drain = fmt.Sprintf("NOT DRAINED by the cut-off (%d of %d tasks settled)", r.Client.Succeeded+r.Client.Failed, r.Tasks)
	}
	shareIs := fmt.Sprintf("%.2f %s", share, verdict(share >= c.Target))
	if !r.Spent {
		shareIs = fmt.Sprintf("none MISSED (the provider's %s bucket was never drawn down to %v of its rate: no span)", c.Binding, lSpentAt)
	}
	if m := c.mode.MaxDeferrals; m > 0 && r.Client.Learning != nil {
		shareIs += fmt.Sprintf(" (>= %.2f); deferrals per task %.2f %s (<= %.1f", c.Target, r.deferrals(), verdict(r.deferrals() <= m), m)
	} else {
		shareIs += fmt.Sprintf(" (>= %.2f", c.Target)
	}
	fmt.Fprintf(w, "targets %s %s: 429s %d %s (0); share of the %s limit %s); %s\n", c.Name, r.Variant,
		r.Limited, verdict(r.Limited == 0), c.Binding, shareIs, drain)
}

func printLNotes(w io.Writer) {
	fmt.Fprintf(w, "notes: measured span: from %v after the start, or later once the binding bucket holds at most %v of its rate (its saved burst spent),\n", lWarmup, lSpentAt)
	fmt.Fprintln(w, "       to the last admission (or the cut-off). A unit's share = what the provider charged of it in the span over what the limit allowed")
	fmt.Fprintln(w, "       in it: what the bucket held at the span's start + the unit's rate x the span. Tasks: enough for the ideal drain to last about 12 s")
	fmt.Fprintln(w, "       (6 s with -quick) past the time one process needs to spend a bucket's burst.")
	fmt.Fprintln(w, "       binding: the unit the workload's charges need longest at the stated rates (the ideal drain: each bucket's capacity at once, then its rate).")
	fmt.Fprintln(w, "       the provider charges a call's estimate when it admits it (max: OpenAI counts prompt + max_tokens), or charges the estimate and settles")
	fmt.Fprintln(w, "       it to the call's usage when the call completes (2xmedian, refunds); a call is admitted only if both buckets hold 1 request and its estimate.")
	fmt.Fprintln(w, "       the cookbook's capacity starts at, and refills to, a minute's worth of the stated limits, whatever the provider's buckets hold.")
	fmt.Fprintln(w, "       ours: drain time to its last task done (its fleet stops after); ratios: ours over the column (share: higher is better; drain: lower).")
	fmt.Fprintf(w, "       ours-10x(-s): learned = the limit in force (Inspect, polled every %v) within %.0f %% of the provider's rate (per second, whatever the tier's period) and of what its bucket holds;\n", lPoll, lLearnTolerance*100)
	fmt.Fprintln(w, "       responses: those the handlers had had by that poll, or (read after each) by a handler's read of the key right after its Observe;")
	fmt.Fprintln(w, "       both upper bounds, loose at the start: the fleet's first 48 calls go out at once and their responses come back within milliseconds.")
	fmt.Fprintln(w, "       Suspensions: polls that saw the key suspended after one that did not.")
}
