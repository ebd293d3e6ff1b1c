package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario S, the soak: 8 Limiters (8 processes' worth, each with its own
// connection pool) hammer one key with two tiers for 60 s while the limits
// are raised, suspended, the server's scripts and functions flushed, and
// the limits lowered. Every admitted call is recorded with its bracket on
// the clock Redis decides on, and checked offline: every window of each
// tier against burst + rate x span, across the changes by the rule of
// docs/guarantees.md (window_check.go).

// soakPhases are the key's limits over the run: tier 1 binds first, the
// raise makes tier 2 bind, the lowering clamps both.
var soakPhases = [][]throttle.Limit{
	{throttle.PerSecond(100).WithBurst(20), throttle.PerMinute(4800).WithBurst(400)},
	{throttle.PerSecond(200).WithBurst(40), throttle.PerMinute(4800).WithBurst(400)},
	{throttle.PerSecond(50).WithBurst(10), throttle.PerMinute(1200).WithBurst(100)},
}

// soakEvent is something the run did to the key or the server, with its
// bracket (seconds since the start).
type soakEvent struct {
	What          string
	Sent, Replied float64
}

type scenarioS struct {
	Duration             time.Duration
	Clients, Goroutines  int
	Suspension           time.Duration
	Events               []soakEvent
	Admitted, Refused    int64
	Errors               map[string]int64
	InSuspension         int // admissions inside the suspension
	AdmittedPerPhase     []int
	Tiers                []windowResult // on the exact times
	Brackets             []windowResult // on the callers' brackets
	Replayed             int64          // admissions replayed from MONITOR
	MonitorLines         int
	StateWrites          int
	Disagree             int
	Changes              []float64  // the two SetLimits, exact (s since the start)
	Suspended            [2]float64 // the suspension, exact
	WidthP50, WidthP99   time.Duration
	WidthMax             time.Duration
	ScriptRuns, Decision int64
}

func runS(ctx context.Context, e *env, w io.Writer) (*scenarioS, error) {
	s := &scenarioS{Duration: 60 * time.Second, Clients: 8, Goroutines: 4, Suspension: 3 * time.Second, Errors: map[string]int64{}}
	if e.quick {
		s.Duration, s.Suspension = 15*time.Second, time.Second
	}
	fmt.Fprintf(w, "\n== S. soak: %d Limiters x %d goroutines on one key for %v; limits raised, a %v suspension, SCRIPT FLUSH + FUNCTION FLUSH, limits lowered; every window of each tier checked\n",
		s.Clients, s.Goroutines, s.Duration, s.Suspension)
	_, prefix := e.names("s", "soak")
	defer func() { _ = e.cleanup(context.Background(), "", prefix) }()
	const key = "soak"
	mon, err := startMonitor(ctx, e.opts, prefix+":{"+key+"}:b")
	if err != nil {
		return s, err
	}
	monitoring := true
	defer func() {
		if monitoring {
			mon.stop()
		}
	}()
	op := throttle.NewLimiter(e.ctl, throttle.WithPrefix(prefix))
	if err := op.SetLimits(ctx, key, soakPhases[0]...); err != nil {
		return s, err
	}
	var lims []*throttle.Limiter
	for range s.Clients {
		c := e.newClient(16)
		defer c.Close()
		lims = append(lims, throttle.NewLimiter(c, throttle.WithPrefix(prefix)))
	}
	st0, err := commandStats(ctx, e.ctl)
	if err != nil {
		return s, err
	}

	load := &soakLoad{start: time.Now()}
	load.run(ctx, lims, key, s.Goroutines)
	runErr := s.timeline(ctx, e, op, key, load.start)
	load.end()
	if runErr != nil {
		return s, runErr
	}
	st1, err := commandStats(ctx, e.ctl)
	if err != nil {
		return s, err
	}
	for _, c := range []string{"fcall", "evalsha", "eval"} {
		s.ScriptRuns += st1[c].calls - st0[c].calls
	}
	s.Decision = load.decisions.Load()
	s.Admitted, s.Refused = int64(len(load.adm)), load.refused.Load()
	load.errKinds.Range(func(k, v any) bool { s.Errors[k.(string)] = v.(*atomic.Int64).Load(); return true })
	writes, lines := mon.stop()
	monitoring = false
	exact, err := s.replay(writes, lines, load.start.UnixMicro())
	if err != nil {
		return s, err
	}
	s.check(exact, load.adm)
	s.print(w)
	return s, nil
}

// soakLoad is the callers of the soak: goroutines that take from one key
// until stopped, each as a caller that waits as told, and what they got.
type soakLoad struct {
	start     time.Time
	mu        sync.Mutex
	adm       []admission // on the callers' clock: brackets' midpoints and widths
	refused   atomic.Int64
	stop      atomic.Bool
	wg        sync.WaitGroup
	errKinds  sync.Map // kind -> *atomic.Int64
	decisions atomic.Int64
}

func (l *soakLoad) since(t time.Time) float64 { return t.Sub(l.start).Seconds() }

// run starts n callers on each Limiter.
func (l *soakLoad) run(ctx context.Context, lims []*throttle.Limiter, key string, n int) {
	for _, lim := range lims {
		for range n {
			l.wg.Go(func() { l.call(ctx, lim, key) })
		}
	}
}

// call takes from key until the load stops.
func (l *soakLoad) call(ctx context.Context, lim *throttle.Limiter, key string) {
	var mine []admission
	for !l.stop.Load() {
		sent := time.Now()
		d, err := lim.Take(ctx, key)
		got := time.Now()
		l.decisions.Add(1)
		switch {
		case err != nil:
			l.countErr(err)
			time.Sleep(10 * time.Millisecond)
		case d.Allowed:
			mine = append(mine, admission{t: (l.since(sent) + l.since(got)) / 2, w: got.Sub(sent).Seconds()})
		default:
			l.refused.Add(1)
			// A caller that waits as told (at most 100 ms, so that
			// a suspension is polled), with some jitter.
			wait := min(d.RetryAfter, 100*time.Millisecond)
			time.Sleep(wait + time.Duration(rand.Int64N(int64(wait)/10+1)))
		}
	}
	l.mu.Lock()
	l.adm = append(l.adm, mine...)
	l.mu.Unlock()
}

// countErr counts an error by its kind.
func (l *soakLoad) countErr(err error) {
	kind := "other: " + err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	case strings.Contains(err.Error(), "NOSCRIPT"), strings.Contains(err.Error(), "Function not found"):
		kind = "script missing"
	}
	v, _ := l.errKinds.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// end stops the callers and waits for them.
func (l *soakLoad) end() {
	l.stop.Store(true)
	l.wg.Wait()
}

// timeline does to the key and the server what the soak does, each at its
// fraction of the run from start, records it in s.Events, and waits for the
// end of the run.
func (s *scenarioS) timeline(ctx context.Context, e *env, op *throttle.Limiter, key string, start time.Time) error {
	since := func(t time.Time) float64 { return t.Sub(start).Seconds() }
	at := func(f float64) time.Time { return start.Add(time.Duration(f * float64(s.Duration))) }
	do := func(when time.Time, what string, fn func() error) error {
		select {
		case <-time.After(time.Until(when)):
		case <-ctx.Done():
			return ctx.Err()
		}
		sent := time.Now()
		err := fn()
		s.Events = append(s.Events, soakEvent{What: what, Sent: since(sent), Replied: since(time.Now())})
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		progress("S: %.1fs %s", since(sent), what)
		return nil
	}
	steps := []struct {
		f    float64
		what string
		fn   func() error
	}{
		{0.25, "SetLimits " + limitsString(soakPhases[1]) + " (raise)", func() error { return op.SetLimits(ctx, key, soakPhases[1]...) }},
		{0.40, fmt.Sprintf("Suspend %v", s.Suspension), func() error { return op.Suspend(ctx, key, s.Suspension) }},
		{0.55, "SCRIPT FLUSH + FUNCTION FLUSH", func() error {
			return errors.Join(e.ctl.ScriptFlush(ctx).Err(), e.ctl.FunctionFlush(ctx).Err())
		}},
		{0.65, "SetLimits " + limitsString(soakPhases[2]) + " (lower)", func() error { return op.SetLimits(ctx, key, soakPhases[2]...) }},
	}
	for _, st := range steps {
		if err := do(at(st.f), st.what, st.fn); err != nil {
			return err
		}
	}
	select {
	case <-time.After(time.Until(at(1))):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replay reads the admissions, the changes of limits and the suspension
// back from the bucket's state writes (MONITOR), on the Redis clock, in
// seconds since startUS, and returns the admissions' exact times.
func (s *scenarioS) replay(writes []stateWrite, lines int, startUS int64) ([]admission, error) {
	rp, err := admissionsFromWrites(writes)
	if err != nil {
		return nil, fmt.Errorf("replaying the state writes: %w", err)
	}
	s.MonitorLines, s.StateWrites, s.Disagree = lines, len(writes), rp.disagree
	s.Replayed = int64(len(rp.admitted))
	if len(rp.changes) != len(soakPhases) || len(rp.suspend) != 1 {
		return nil, fmt.Errorf("MONITOR saw %d SetLimits and %d suspensions, want %d and 1", len(rp.changes), len(rp.suspend), len(soakPhases))
	}
	rel := func(us int64) float64 { return float64(us-startUS) / 1e6 }
	exact := make([]admission, len(rp.admitted))
	for i, us := range rp.admitted {
		exact[i] = admission{t: rel(us)}
	}
	s.Changes = []float64{rel(rp.changes[1]), rel(rp.changes[2])}
	// The suspension began at the script's TIME: its end less its length.
	s.Suspended = [2]float64{rel(rp.suspend[0][1] - s.Suspension.Microseconds()), rel(rp.suspend[0][1])}
	return exact, nil
}

// check checks every window of each tier on the exact times, and on the
// callers' brackets as a cross-check that needs no MONITOR; and counts the
// admissions of each phase and in the suspension.
func (s *scenarioS) check(exact, brackets []admission) {
	for tier := range 2 {
		s.Tiers = append(s.Tiers, worstWindow(exact, s.schedule(tier, true)))
		s.Brackets = append(s.Brackets, worstWindow(brackets, s.schedule(tier, false)))
	}
	s.AdmittedPerPhase = make([]int, 3)
	for _, a := range exact {
		if a.t > s.Suspended[0] && a.t < s.Suspended[1] {
			s.InSuspension++
		}
		switch {
		case a.t < s.Changes[0]:
			s.AdmittedPerPhase[0]++
		case a.t < s.Changes[1]:
			s.AdmittedPerPhase[1]++
		default:
			s.AdmittedPerPhase[2]++
		}
	}
	widths := make([]float64, len(brackets))
	for i, a := range brackets {
		widths[i] = a.w
	}
	slices.Sort(widths)
	if n := len(widths); n > 0 {
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		s.WidthP50, s.WidthP99, s.WidthMax = sec(widths[n/2]), sec(widths[n*99/100]), sec(widths[n-1])
	}
}

// schedule is a tier's limits over the run: changed at the exact times
// MONITOR saw, or within the brackets of the SetLimits calls.
func (s *scenarioS) schedule(tier int, exactTimes bool) tierSchedule {
	ev := func(prefix string) soakEvent {
		return *find(s.Events, func(e soakEvent) bool { return strings.HasPrefix(e.What, prefix) })
	}
	raise, lower := ev("SetLimits "+limitsString(soakPhases[1])), ev("SetLimits "+limitsString(soakPhases[2]))
	sch := tierSchedule{name: fmt.Sprintf("tier %d (per %v)", tier+1, soakPhases[0][tier].Per)}
	for k, phase := range soakPhases {
		l := phase[tier]
		step := tierStep{rate: float64(l.N) / l.Per.Seconds(), burst: float64(l.Burst)}
		switch {
		case k == 0:
		case exactTimes:
			step.at, step.late = s.Changes[k-1], s.Changes[k-1]
		case k == 1:
			step.at, step.late = raise.Sent, raise.Replied
		default:
			step.at, step.late = lower.Sent, lower.Replied
		}
		sch.steps = append(sch.steps, step)
	}
	return sch
}

// limitsString writes limits as the CLI does: "100/s:burst=20 4800/m:burst=400".
func limitsString(ls []throttle.Limit) string {
	var parts []string
	for _, l := range ls {
		per := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[l.Per]
		if per == "" {
			per = l.Per.String()
		}
		parts = append(parts, fmt.Sprintf("%d/%s:burst=%d", l.N, per, l.Burst))
	}
	return strings.Join(parts, " ")
}

func (s *scenarioS) print(w io.Writer) {
	fmt.Fprintf(w, "  timeline (seconds since the start; limits at 0: %s):\n", limitsString(soakPhases[0]))
	for _, e := range s.Events {
		fmt.Fprintf(w, "    %6.3f-%.3f  %s\n", e.Sent, e.Replied, e.What)
	}
	fmt.Fprintf(w, "  on the Redis clock (MONITOR): SetLimits at %.6f and %.6f, suspended %.6f to %.6f\n",
		s.Changes[0], s.Changes[1], s.Suspended[0], s.Suspended[1])
	fmt.Fprintf(w, "  decisions %d in %d script runs; admitted %d (%d / %d / %d in the three limit phases), refused %d\n",
		s.Decision, s.ScriptRuns, s.Admitted, s.AdmittedPerPhase[0], s.AdmittedPerPhase[1], s.AdmittedPerPhase[2], s.Refused)
	fmt.Fprintf(w, "  replayed from the bucket's state writes: %d admissions (callers counted %d), %d of %d writes with tiers disagreeing (target 0)\n",
		s.Replayed, s.Admitted, s.Disagree, s.StateWrites)
	errs := "none"
	if len(s.Errors) > 0 {
		var parts []string
		for k, v := range s.Errors {
			parts = append(parts, fmt.Sprintf("%s: %d", k, v))
		}
		slices.Sort(parts)
		errs = strings.Join(parts, ", ")
	}
	fmt.Fprintf(w, "  errors (target none, through the flush too): %s\n", errs)
	fmt.Fprintf(w, "  admitted while suspended (target 0): %d\n", s.InSuspension)
	t := newTable("  tier", "worst window: admitted", "bound", "excess (<= 0 holds)", "its start", "its span", "worst <= 1s window: admitted / bound")
	for _, r := range s.Tiers {
		t.row("  "+r.Tier, []string{fmt.Sprint(r.Count), fmt.Sprintf("%.2f", r.Bound), fmt.Sprintf("%+.2f", r.Excess),
			fmt.Sprintf("%.6fs", r.Start), fmt.Sprintf("%.6fs", r.Span),
			fmt.Sprintf("%d / %.2f (%+.2f)", r.Count1s, r.Bound1s, r.Window1s)})
	}
	t.print(w)
	fmt.Fprintf(w, "  cross-check on the callers' brackets (sent to answered: p50 %v, p99 %v, max %v):\n",
		s.WidthP50.Round(time.Microsecond), s.WidthP99.Round(time.Microsecond), s.WidthMax.Round(time.Microsecond))
	for _, r := range s.Brackets {
		fmt.Fprintf(w, "    %s: worst excess %+.2f at the midpoints, %+.2f with each call anywhere in its bracket\n", r.Tier, r.Excess, r.Certain)
	}
	fmt.Fprintln(w, "  notes: each admission's time is its decision's Redis TIME, replayed from the bucket state the script writes")
	fmt.Fprintln(w, "         (MONITOR): what a tier owes rises by per_us for each call admitted. Every window [t_i, t_j] between two")
	fmt.Fprintln(w, "         admissions is checked; bound = burst at t_i + the tier's rate integrated over the window (across a")
	fmt.Fprintln(w, "         change: each tier keeps its tokens, clamped to the new burst; a raise grants no sudden burst).")
	fmt.Fprintln(w, "         The bracket cross-check uses the callers' clock (this host's, as the harness's Redis).")
}
