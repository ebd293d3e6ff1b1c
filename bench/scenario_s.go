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
// tier against burst + rate x span, across the changes by the README's
// rule (window_check.go).

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
	InSuspension         int // admissions certainly inside the suspension
	AdmittedPerPhase     []int
	Tiers                []windowResult
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

	start := time.Now()
	since := func(t time.Time) float64 { return t.Sub(start).Seconds() }
	var (
		mu        sync.Mutex
		adm       []admission
		refused   atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
		errKinds  sync.Map // kind -> *atomic.Int64
		decisions atomic.Int64
	)
	countErr := func(err error) {
		kind := "other: " + err.Error()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			kind = "timeout"
		case strings.Contains(err.Error(), "NOSCRIPT"), strings.Contains(err.Error(), "Function not found"):
			kind = "script missing"
		}
		v, _ := errKinds.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	for _, lim := range lims {
		for range s.Goroutines {
			wg.Go(func() {
				var mine []admission
				for !stop.Load() {
					sent := time.Now()
					d, err := lim.Take(ctx, key)
					got := time.Now()
					decisions.Add(1)
					switch {
					case err != nil:
						countErr(err)
						time.Sleep(10 * time.Millisecond)
					case d.Allowed:
						mine = append(mine, admission{t: (since(sent) + since(got)) / 2, w: got.Sub(sent).Seconds()})
					default:
						refused.Add(1)
						// A caller that waits as told (at most 100 ms, so that
						// a suspension is polled), with some jitter.
						wait := min(d.RetryAfter, 100*time.Millisecond)
						time.Sleep(wait + time.Duration(rand.Int64N(int64(wait)/10+1)))
					}
				}
				mu.Lock()
				adm = append(adm, mine...)
				mu.Unlock()
			})
		}
	}

	// The timeline, as fractions of the run.
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
	var runErr error
	for _, st := range steps {
		if runErr = do(at(st.f), st.what, st.fn); runErr != nil {
			break
		}
	}
	if runErr == nil {
		select {
		case <-time.After(time.Until(at(1))):
		case <-ctx.Done():
			runErr = ctx.Err()
		}
	}
	stop.Store(true)
	wg.Wait()
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
	s.Decision = decisions.Load()
	s.Admitted, s.Refused = int64(len(adm)), refused.Load()
	errKinds.Range(func(k, v any) bool { s.Errors[k.(string)] = v.(*atomic.Int64).Load(); return true })

	// The check.
	ev := func(prefix string) soakEvent {
		return *find(s.Events, func(e soakEvent) bool { return strings.HasPrefix(e.What, prefix) })
	}
	raise, lower, susp := ev("SetLimits "+limitsString(soakPhases[1])), ev("SetLimits "+limitsString(soakPhases[2])), ev("Suspend")
	for tier := range 2 {
		sch := tierSchedule{name: fmt.Sprintf("tier %d (per %v)", tier+1, soakPhases[0][tier].Per)}
		for k, phase := range soakPhases {
			l := phase[tier]
			step := tierStep{rate: float64(l.Rate) / l.Per.Seconds(), burst: float64(l.Burst)}
			switch k {
			case 1:
				step.at, step.late = raise.Sent, raise.Replied
			case 2:
				step.at, step.late = lower.Sent, lower.Replied
			}
			sch.steps = append(sch.steps, step)
		}
		s.Tiers = append(s.Tiers, worstWindow(adm, sch))
	}
	// Admitted while certainly suspended: after the Suspend returned and
	// before the earliest it could end.
	widths := make([]float64, len(adm))
	s.AdmittedPerPhase = make([]int, 3)
	for i, a := range adm {
		if a.t-a.w/2 > susp.Replied && a.t+a.w/2 < susp.Sent+s.Suspension.Seconds() {
			s.InSuspension++
		}
		switch {
		case a.t < raise.Sent:
			s.AdmittedPerPhase[0]++
		case a.t < lower.Sent:
			s.AdmittedPerPhase[1]++
		default:
			s.AdmittedPerPhase[2]++
		}
		widths[i] = a.w
	}
	slices.Sort(widths)
	if n := len(widths); n > 0 {
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		s.WidthP50, s.WidthP99, s.WidthMax = sec(widths[n/2]), sec(widths[n*99/100]), sec(widths[n-1])
	}
	s.print(w)
	return s, nil
}

// limitsString writes limits as the CLI does: "100/s:burst=20 4800/m:burst=400".
func limitsString(ls []throttle.Limit) string {
	var parts []string
	for _, l := range ls {
		per := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[l.Per]
		if per == "" {
			per = l.Per.String()
		}
		parts = append(parts, fmt.Sprintf("%d/%s:burst=%d", l.Rate, per, l.Burst))
	}
	return strings.Join(parts, " ")
}

func (s *scenarioS) print(w io.Writer) {
	fmt.Fprintf(w, "  timeline (seconds since the start; limits at 0: %s):\n", limitsString(soakPhases[0]))
	for _, e := range s.Events {
		fmt.Fprintf(w, "    %6.3f-%.3f  %s\n", e.Sent, e.Replied, e.What)
	}
	fmt.Fprintf(w, "  decisions %d in %d script runs; admitted %d (%d / %d / %d in the three limit phases), refused %d\n",
		s.Decision, s.ScriptRuns, s.Admitted, s.AdmittedPerPhase[0], s.AdmittedPerPhase[1], s.AdmittedPerPhase[2], s.Refused)
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
	fmt.Fprintf(w, "  admitted while certainly suspended (target 0): %d\n", s.InSuspension)
	fmt.Fprintf(w, "  decision brackets (sent to answered): p50 %v, p99 %v, max %v\n",
		s.WidthP50.Round(time.Microsecond), s.WidthP99.Round(time.Microsecond), s.WidthMax.Round(time.Microsecond))
	t := newTable("  tier", "worst window: admitted", "bound", "excess (<= 0 holds)", "its start", "its span", "excess, certain", "worst <= 1s window: admitted / bound")
	for _, r := range s.Tiers {
		t.row("  "+r.Tier, []string{fmt.Sprint(r.Count), fmt.Sprintf("%.2f", r.Bound), fmt.Sprintf("%+.2f", r.Excess),
			fmt.Sprintf("%.3fs", r.Start), fmt.Sprintf("%.3fs", r.Span), fmt.Sprintf("%+.2f", r.Certain),
			fmt.Sprintf("%d / %.2f (%+.2f)", r.Count1s, r.Bound1s, r.Window1s)})
	}
	t.print(w)
	fmt.Fprintln(w, "  notes: every window [t_i, t_j] between two admissions is checked; bound = burst at t_i + the tier's rate")
	fmt.Fprintln(w, "         integrated over the window (across a change: each tier keeps its tokens, clamped to the new burst;")
	fmt.Fprintln(w, "         a raise counts from the earliest moment the SetLimits call may have taken effect, a lowering from")
	fmt.Fprintln(w, "         the latest). Times are the midpoints of each decision's bracket on this host's clock, which the")
	fmt.Fprintln(w, "         harness's Redis shares; \"certain\" allows each admission anywhere in its bracket.")
}
