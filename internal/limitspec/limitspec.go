// Package limitspec reads and writes limits in the operator's short form,
// shared by the CLI and the dashboard so that what one shows the other
// accepts:
//
//	10/s  50/m  5000/h  100/1500ms  10/s:burst=20   a token bucket (throttle.PerSecond, ...)
//	5000/h:window                                    a sliding window (throttle.Window)
//	5000/h:fixed                                     a fixed window aligned to the clock (throttle.FixedWindow)
//	4:inflight                                       tasks running at once (throttle.InFlight)
//	30s:adaptive                                     adapt to 429s, 30 s clean intervals (throttle.Adaptive)
//
// A limit is its numbers, then at most one ":" modifier that says more
// about it: its burst, or that it is a window or an in-flight cap.
package limitspec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Forms names the accepted forms, for errors and help texts.
const Forms = `RATE/PERIOD[:burst=N] (a token bucket), RATE/PERIOD:window (at most RATE in any sliding PERIOD), RATE/PERIOD:fixed (at most RATE in each PERIOD aligned to the clock), N:inflight (at most N tasks running at once) or PERIOD:adaptive (rates halved on each 429 suspension, won back every clean PERIOD); PERIOD one of s, m, h, d or a duration such as 1500ms, 10s, 2m (e.g. 10/s, 10/s:burst=20, 100/1500ms, 5000/h:window, 4:inflight, 30s:adaptive)`

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("bad limit")

// The modifiers after ':'.
const (
	modBurst    = "burst="
	modWindow   = "window"
	modFixed    = "fixed"
	modInFlight = "inflight"
	modAdaptive = "adaptive"
)

// units are the named periods.
var units = []struct {
	name string
	d    time.Duration
}{
	{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour},
}

// Parse reads one limit. It returns it the way throttle.Limiter.Limits
// returns limits read from Redis, so that Parse(Format(l)) == l for every l
// that Limits returns or Parse accepts: a bucket's Burst is always set (its
// Rate when the spec gives none), a window's Burst is 0, an in-flight limit
// is throttle.InFlight(n). Range checks (at most MaxPer, ...) are
// SetLimits'.
func Parse(spec string) (throttle.Limit, error) {
	bad := func(format string, a ...any) (throttle.Limit, error) {
		return throttle.Limit{}, fmt.Errorf("%w %q: %s; want %s", ErrSyntax, spec, fmt.Sprintf(format, a...), Forms)
	}
	body, mod, hasMod := strings.Cut(spec, ":")
	if body == modWindow || body == modFixed || body == modInFlight || body == modAdaptive || strings.HasPrefix(body, modBurst) {
		// "window:5000/h", "inflight:4": the kind goes after the numbers.
		return bad("%q goes after the limit, as in %s:%s", body, mod, body)
	}
	if hasMod && strings.Contains(mod, ":") {
		return bad("%q has more than one ':' modifier; give one of :burst=N, :window, :fixed, :inflight, :adaptive", ":"+mod)
	}
	if hasMod && mod == modInFlight {
		n, err := count("number of tasks in flight", body)
		if err != nil {
			if strings.Contains(body, "/") {
				return bad("an in-flight limit has no period: write %s:%s", strings.SplitN(body, "/", 2)[0], modInFlight)
			}
			return bad("%v", err)
		}
		return throttle.InFlight(n), nil
	}
	if hasMod && mod == modAdaptive {
		if strings.Contains(body, "/") {
			return bad("an adaptive limit is its clean interval alone: write PERIOD:%s, as in 30s:%s", modAdaptive, modAdaptive)
		}
		per, err := period(body)
		if err != nil {
			return bad("%v", err)
		}
		return throttle.Adaptive(per), nil
	}
	rateS, perS, ok := strings.Cut(body, "/")
	if !ok {
		return bad("no '/' between rate and period in %q (an in-flight limit is written N:inflight)", body)
	}
	rate, err := count("rate", rateS)
	if err != nil {
		return bad("%v", err)
	}
	per, err := period(perS)
	if err != nil {
		return bad("%v", err)
	}
	l := throttle.Limit{N: rate, Per: per, Burst: rate}
	switch {
	case !hasMod:
	case mod == modWindow:
		l = throttle.Window(rate, per)
	case mod == modFixed:
		l = throttle.FixedWindow(rate, per)
	case strings.HasPrefix(mod, modBurst):
		b, err := count("burst", strings.TrimPrefix(mod, modBurst))
		if err != nil {
			return bad("%v", err)
		}
		l.Burst = b
	case mod == "":
		return bad("nothing after ':'; give one of :burst=N, :window, :fixed, :inflight, :adaptive")
	default:
		return bad("%q after ':' is none of burst=N, window, fixed, inflight, adaptive", mod)
	}
	return l, nil
}

// count reads a whole number > 0 named what.
func count(what, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s %q is not a whole number > 0", what, s)
	}
	return n, nil
}

// period reads a named unit or a positive duration.
func period(s string) (time.Duration, error) {
	for _, u := range units {
		if s == u.name {
			return u.d, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("period %q is neither s, m, h, d nor a duration > 0", s)
	}
	return d, nil
}

// ParseAll reads limits separated by spaces or given one per element.
func ParseAll(specs ...string) ([]throttle.Limit, error) {
	var out []throttle.Limit
	for _, s := range specs {
		for _, f := range strings.Fields(s) {
			l, err := Parse(f)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no limit given; want %s", ErrSyntax, Forms)
	}
	return out, nil
}

// Format writes a limit the way Parse reads it; a bucket's burst is shown
// when it differs from its rate (Burst 0 means the rate).
func Format(l throttle.Limit) string {
	switch l.Kind {
	case throttle.KindInFlight:
		return strconv.Itoa(l.N) + ":" + modInFlight
	case throttle.KindAdaptive:
		p := formatPeriod(l.Per)
		if len(p) == 1 { // a named unit alone: "1m:adaptive", not "m:adaptive"
			p = "1" + p
		}
		return p + ":" + modAdaptive
	case throttle.KindWindow:
		return strconv.Itoa(l.N) + "/" + formatPeriod(l.Per) + ":" + modWindow
	case throttle.KindFixedWindow:
		return strconv.Itoa(l.N) + "/" + formatPeriod(l.Per) + ":" + modFixed
	}
	s := strconv.Itoa(l.N) + "/" + formatPeriod(l.Per)
	if l.Burst != 0 && l.Burst != l.N {
		s += ":" + modBurst + strconv.Itoa(l.Burst)
	}
	return s
}

// FormatAll joins limits with spaces, as ParseAll reads them.
func FormatAll(ls []throttle.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = Format(l)
	}
	return strings.Join(parts, " ")
}

func formatPeriod(d time.Duration) string {
	for _, u := range units {
		if d == u.d {
			return u.name
		}
	}
	return d.String()
}

// Burst is the most a limit holds at once: a bucket's burst (Burst 0 means
// Rate), a window's calls per window, an in-flight limit's slots.
func Burst(l throttle.Limit) int {
	if l.Burst == 0 || l.Kind != throttle.KindBucket {
		return l.N
	}
	return l.Burst
}

// Names of the kinds, from KindName.
const (
	KindBucket   = "bucket"
	KindWindow   = "window"
	KindFixed    = "fixed"
	KindInFlight = "inflight"
	KindAdaptive = "adaptive"
)

// KindName names a limit's kind for tables and JSON: "bucket", "window",
// "fixed", "inflight" or "adaptive" (as the modifier is written).
func KindName(k throttle.Kind) string {
	switch k {
	case throttle.KindBucket:
		return KindBucket
	case throttle.KindWindow:
		return KindWindow
	case throttle.KindFixedWindow:
		return KindFixed
	case throttle.KindInFlight:
		return KindInFlight
	case throttle.KindAdaptive:
		return KindAdaptive
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// TierView is one of a key's limits with its state now, as the CLI's -o json
// and the web view's API show it.
type TierView struct {
	Kind          string  `json:"kind"`  // bucket, window, fixed, inflight or adaptive
	Limit         string  `json:"limit"` // as `set` takes it: 10/s:burst=20, 5000/h:window, 4:inflight
	Rate          int     `json:"rate"`  // per period; an in-flight limit: the slots
	PeriodSeconds float64 `json:"period_seconds"`
	Burst         int     `json:"burst"`  // in force: a bucket's burst, a window's calls per window, the slots
	Tokens        float64 `json:"tokens"` // a bucket's tokens, a window's calls left, the slots free
	// InForce is the limit in force when it is below the configured one
	// (learned from the provider's responses, or cut by adaptive mode).
	InForce string `json:"in_force,omitempty"`
	// LearnedSeconds is how long a quota learned from the provider stays in
	// force unconfirmed.
	LearnedSeconds float64 `json:"learned_seconds,omitempty"`
}

// SlotsView is an in-flight limit's slots: held now, and the most.
type SlotsView struct {
	Held int `json:"held"`
	Max  int `json:"max"`
}

// Views returns each of st's limits with its state, and its in-flight
// slots (nil without an InFlight limit).
func Views(st throttle.Status) ([]TierView, *SlotsView) {
	tiers := []TierView{}
	var slots *SlotsView
	for i, l := range st.Limits {
		t := TierView{Kind: KindName(l.Kind), Limit: Format(l), Rate: l.N, PeriodSeconds: l.Per.Seconds(), Burst: Burst(l)}
		if i < len(st.Tokens) {
			t.Tokens = st.Tokens[i]
		}
		if i < len(st.InForce) && st.InForce[i] != l {
			t.InForce = Format(st.InForce[i])
			t.Burst = Burst(st.InForce[i])
		}
		if i < len(st.LearnedFor) && st.LearnedFor[i] > 0 {
			t.LearnedSeconds = st.LearnedFor[i].Seconds()
		}
		if l.Kind == throttle.KindInFlight {
			slots = &SlotsView{Held: st.InFlight, Max: l.N}
		}
		tiers = append(tiers, t)
	}
	return tiers, slots
}
