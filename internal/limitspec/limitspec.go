// Package limitspec reads and writes limits in the operator's short form,
// shared by the CLI and the dashboard so that what one shows the other
// accepts:
//
//	10/s  50/m  5000/h  100/1500ms  10/s:burst=20   a token bucket (throttle.PerSecond, ...)
//	5000/h:window                                    a sliding window (throttle.Window)
//	5000/h:fixed                                     a fixed window aligned to the clock (throttle.FixedWindow)
//	30000/m:tokens  100/m:window:tokens              a tier counted in another unit than requests (Limit.In)
//	4:inflight                                       tasks running at once (throttle.InFlight)
//	30s:adaptive                                     adapt to 429s, 30 s clean intervals (throttle.Adaptive)
//
// A limit is its numbers, then at most one ":" modifier that says more
// about it: its burst, or that it is a window or an in-flight cap. A rate
// tier (a bucket or a window) may end with its unit, last:
// 30000/m:burst=2000:tokens. A word after ':' that is none of the
// modifiers is a unit, as throttle checks one (1 to 32 of a-z, 0-9, '_'
// and '-', starting with a letter); "requests" is the default and is
// written without a modifier. So that a misspelt modifier is not taken
// for a unit, a unit within two edits of a modifier's name (or of
// "requests") is refused: ":windwo" asks "did you mean :window?".
package limitspec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/rules"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Forms names the accepted forms, for help texts.
const Forms = `RATE/PERIOD[:burst=N] (a token bucket), RATE/PERIOD:window (at most RATE in any sliding PERIOD), RATE/PERIOD:fixed (at most RATE in each PERIOD aligned to the clock), each in requests or, with a last :UNIT, in another unit (RATE/PERIOD:UNIT, RATE/PERIOD:window:UNIT; UNIT 1 to 32 of a-z, 0-9, _ and -, starting with a letter), N:inflight (at most N tasks running at once) or PERIOD:adaptive (rates halved on each 429 suspension, won back every clean PERIOD); PERIOD one of s, m, h, d, a whole number of one (2d, 90s, 1500ms) or a duration such as 1m30s (e.g. 10/s, 10/s:burst=20, 100/1500ms, 5000/h:window, 30000/m:tokens, 4:inflight, 30s:adaptive)`

// Examples are a few limits of each form, for a hint after an error where
// no help text is at hand (the web view).
const Examples = "10/s, 10/s:burst=20, 5000/h:window, 5000/h:fixed, 30000/m:tokens, 4:inflight, 30s:adaptive"

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

// Requests is the default unit: a tier written without a unit counts
// requests (throttle.Limit.In).
const Requests = "requests"

// Parse reads one limit. It returns it the way throttle.Limiter.Limits
// returns limits read from Redis, so that Parse(Format(l)) == l for every l
// that Limits returns or Parse accepts: a bucket's Burst is always set (its
// Rate when the spec gives none), a window's Burst is 0, an in-flight limit
// is throttle.InFlight(n), a tier in requests has Unit "". It checks the
// bounds SetLimits enforces (a period of at most 30 days, ...), so that
// the error says what is wrong in the spec's own terms. An error leads
// with the fault, without the accepted forms (Forms, Examples).
func Parse(spec string) (throttle.Limit, error) {
	bad := func(format string, a ...any) (throttle.Limit, error) {
		return throttle.Limit{}, fmt.Errorf("%w %q: %s", ErrSyntax, spec, fmt.Sprintf(format, a...))
	}
	body, rest, hasMod := strings.Cut(spec, ":")
	mod, unit, msg := modifiers(body, rest, hasMod)
	if msg != "" {
		return bad("%s", msg)
	}
	switch mod {
	case modInFlight:
		n, err := count("number of tasks in flight", body)
		if err != nil {
			if strings.Contains(body, "/") {
				return bad("an in-flight limit has no period: write %s:%s", strings.SplitN(body, "/", 2)[0], modInFlight)
			}
			return bad("%v", err)
		}
		if n > rules.MaxInFlight {
			return bad("%d tasks in flight is over %d, the most", n, rules.MaxInFlight)
		}
		return throttle.InFlight(n), nil
	case modAdaptive:
		if strings.Contains(body, "/") {
			return bad("an adaptive limit is its clean interval alone: write PERIOD:%s, as in 30s:%s", modAdaptive, modAdaptive)
		}
		per, err := period(body)
		if err != nil {
			return bad("%v", err)
		}
		if per < rules.MinAdaptive {
			return bad("the clean period %s is under %s, the shortest", rules.FormatPeriod(per), rules.FormatWords(rules.MinAdaptive))
		}
		return throttle.Adaptive(per), nil
	}
	l, err := rateLimit(body, mod)
	var pe *rules.PeriodError
	if errors.As(err, &pe) && pe.Suggestion != "" {
		return bad("the period %q is not one: did you mean %s?", pe.Period, strings.Replace(spec, "/"+pe.Period, "/"+pe.Suggestion, 1))
	}
	if err != nil {
		return bad("%v", err)
	}
	l.Unit = unit
	return l, nil
}

// modifiers reads what follows a limit's numbers: at most one modifier,
// then at most a unit ("" for requests). msg says what is wrong, if
// anything.
func modifiers(body, rest string, hasMod bool) (mod, unit, msg string) {
	if isModifier(body) {
		// "window:5000/h", "inflight:4": the kind goes after the numbers.
		return "", "", fmt.Sprintf("%q goes after the limit, as in %s:%s", body, rest, body)
	}
	if !strings.Contains(body, "/") && strings.Contains(rest, "/") && CheckUnit(body) == nil {
		// "tokens:30000/m": so does the unit.
		return "", "", fmt.Sprintf("the unit %q goes after the limit, as in %s:%s", body, rest, body)
	}
	var mods []string
	if hasMod {
		mods = strings.Split(rest, ":")
	}
	switch {
	case len(mods) == 1 && isModifier(mods[0]):
		mod = mods[0]
	case len(mods) == 1:
		unit = mods[0]
	case len(mods) == 2 && isModifier(mods[0]) && !isModifier(mods[1]):
		mod, unit = mods[0], mods[1]
	case len(mods) == 2 && !isModifier(mods[0]) && isModifier(mods[1]) && unitError(mods[0]) == "":
		return "", "", fmt.Sprintf("the unit goes last: write %s:%s:%s", body, mods[1], mods[0])
	case len(mods) == 2 && !isModifier(mods[0]):
		if msg := unitError(mods[0]); msg != "" {
			return "", "", msg
		}
		return "", "", fmt.Sprintf("%q has two units; a tier counts one: write %s:%s or %s:%s", ":"+rest, body, mods[0], body, mods[1])
	case len(mods) >= 2:
		return "", "", fmt.Sprintf("%q has more than one ':' modifier; give one of :burst=N, :window, :fixed, :inflight, :adaptive, and then at most a unit (as in 100/m:window:tokens)", ":"+rest)
	}
	if unit == "" && (len(mods) == 0 || isModifier(mods[len(mods)-1])) {
		return mod, "", ""
	}
	if msg := unitError(unit); msg != "" {
		return "", "", msg
	}
	switch mod {
	case modInFlight:
		return "", "", fmt.Sprintf("an in-flight limit counts tasks running, not a unit: write %s:%s", body, modInFlight)
	case modAdaptive:
		return "", "", fmt.Sprintf("an adaptive limit has no unit (it cuts the key's rate tiers, whatever they count): write %s:%s", body, modAdaptive)
	}
	if unit == Requests {
		unit = "" // the default, as Limits returns it
	}
	return mod, unit, ""
}

// rateLimit reads a rate tier, "RATE/PERIOD", with its modifier mod.
func rateLimit(body, mod string) (throttle.Limit, error) {
	rateS, perS, ok := strings.Cut(body, "/")
	if !ok {
		return throttle.Limit{}, fmt.Errorf("no '/' between rate and period in %q (an in-flight limit is written N:inflight)", body)
	}
	rate, err := count("rate", rateS)
	if err != nil {
		return throttle.Limit{}, err
	}
	per, err := period(perS)
	if err != nil {
		return throttle.Limit{}, err
	}
	if int64(rate) > rules.MaxRatePerSecond*per.Milliseconds()/1000 {
		return throttle.Limit{}, fmt.Errorf("%d per %s is %s per second, over %d per second, the highest rate",
			rate, rules.FormatWords(per), rules.Decimal(float64(rate)/per.Seconds()), rules.MaxRatePerSecond)
	}
	l := throttle.Limit{N: rate, Per: per, Burst: rate}
	switch {
	case mod == modWindow:
		l = throttle.Window(rate, per)
	case mod == modFixed:
		l = throttle.FixedWindow(rate, per)
	case strings.HasPrefix(mod, modBurst):
		b, err := count("burst", strings.TrimPrefix(mod, modBurst))
		if err != nil {
			return throttle.Limit{}, err
		}
		l.Burst = b
	}
	switch {
	case l.Kind != throttle.KindBucket && rate > rules.MaxBurst:
		return throttle.Limit{}, fmt.Errorf("%d calls per window is over %d, the most a window holds", rate, rules.MaxBurst)
	case l.Burst > rules.MaxBurst && strings.HasPrefix(mod, modBurst):
		return throttle.Limit{}, fmt.Errorf("the burst %d is over %d, the largest", l.Burst, rules.MaxBurst)
	case l.Burst > rules.MaxBurst:
		return throttle.Limit{}, fmt.Errorf("the burst, %d (the rate, unless :burst=N), is over %d, the largest: give a smaller :burst=N", l.Burst, rules.MaxBurst)
	}
	return l, nil
}

// isModifier reports whether s is one of the modifiers (burst=N, window,
// fixed, inflight, adaptive), not a unit.
func isModifier(s string) bool {
	switch s {
	case modWindow, modFixed, modInFlight, modAdaptive:
		return true
	}
	return strings.HasPrefix(s, modBurst)
}

// CheckUnit checks a unit's name as throttle does: 1 to 32 of a-z, 0-9,
// '_' and '-', starting with a letter.
func CheckUnit(unit string) error { return keyspace.ValidateUnit(unit) }

// unitError says why word, after ':' and not a modifier, is not a unit
// ("" when it is one): a name throttle refuses, or one so close to a
// modifier's name (or to "requests") that it is more likely a typo.
func unitError(word string) string {
	if word == "" {
		return "nothing after ':'; give one of :burst=N, :window, :fixed, :inflight, :adaptive, or a unit"
	}
	if word == Requests {
		return ""
	}
	if word == "burst" {
		return "\":burst\" needs its size: write :burst=N (a bucket's burst), as in 10/s:burst=20"
	}
	if s := near(word); s != "" {
		if CheckUnit(word) != nil {
			return fmt.Sprintf("%q after ':' is none of burst=N, window, fixed, inflight, adaptive, nor a unit: did you mean :%s?", word, s)
		}
		return fmt.Sprintf("%q after ':' looks like a misspelt modifier, not a unit: did you mean :%s? (a unit may not be within two edits of burst, window, fixed, inflight, adaptive or requests)", word, s)
	}
	if err := CheckUnit(word); err != nil {
		msg := fmt.Sprintf("%q after ':' is none of burst=N, window, fixed, inflight, adaptive, nor a unit (%v)", word, err)
		if low := strings.ToLower(word); CheckUnit(low) == nil {
			msg += ": did you mean :" + low + "?"
		}
		return msg
	}
	return ""
}

// near returns the modifier (or "requests") that word, compared without
// case, is within two edits of, as it would be written ("burst=20" for
// "brust=20"); "" when none is.
func near(word string) string {
	w := strings.ToLower(word)
	name, arg, hasArg := strings.Cut(w, "=")
	best, bestD := "", 3
	for _, m := range []string{"burst", modWindow, modFixed, modInFlight, modAdaptive, Requests} {
		if d := keyspace.EditDistance(name, m); d < bestD {
			best, bestD = m, d
		}
	}
	switch {
	case best == "":
		return ""
	case best == "burst" && hasArg && arg != "":
		return modBurst + arg
	case best == "burst":
		return modBurst + "N"
	case hasArg:
		return "" // "windw=3": not a misspelt window
	}
	return best
}

// count reads a whole number > 0 named what.
func count(what, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		if err != nil && len(s) > 0 && strings.Trim(s, "+0123456789") == "" {
			return 0, fmt.Errorf("%s %q is too large", what, s)
		}
		return 0, fmt.Errorf("%s %q is not a whole number > 0", what, s)
	}
	return n, nil
}

// period reads a period (rules.ParsePeriod), at most rules.MaxPer.
func period(s string) (time.Duration, error) { return rules.ParsePeriod(s) }

// ParseAll reads limits separated by spaces or given one per element, and
// checks them as a set as SetLimits does: at most rules.MaxTiers buckets
// and windows, no tier twice (a tier is its kind, period and unit), at
// most one in-flight and one adaptive limit, and a rate tier beside an
// adaptive one.
func ParseAll(specs ...string) ([]throttle.Limit, error) {
	var (
		out   []throttle.Limit
		given []string
	)
	for _, s := range specs {
		for _, f := range strings.Fields(s) {
			l, err := Parse(f)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
			given = append(given, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no limit given (such as 10/s)", ErrSyntax)
	}
	rates, adaptive := 0, -1
	for i, l := range out {
		switch l.Kind {
		case throttle.KindInFlight, throttle.KindAdaptive:
			for j := range i {
				if out[j].Kind == l.Kind {
					return nil, fmt.Errorf("%w: %q and %q: a key has one %s limit", ErrSyntax, given[j], given[i], KindName(l.Kind))
				}
			}
			if l.Kind == throttle.KindAdaptive {
				adaptive = i
			}
			continue
		}
		rates++
		for j := range i {
			o := out[j]
			if o.Kind == l.Kind && o.Per == l.Per && Unit(o) == Unit(l) {
				return nil, fmt.Errorf("%w: %q and %q are one tier twice (a tier is its kind, period and unit): give each once", ErrSyntax, given[j], given[i])
			}
		}
	}
	switch {
	case rates > rules.MaxTiers:
		return nil, fmt.Errorf("%w: %d buckets and windows, at most %d (besides one :inflight and one :adaptive)", ErrSyntax, rates, rules.MaxTiers)
	case adaptive >= 0 && rates == 0:
		return nil, fmt.Errorf("%w: %q adapts the key's rates, and none is given: add one, such as 10/s", ErrSyntax, given[adaptive])
	}
	return out, nil
}

// Format writes a limit the way Parse reads it; a bucket's burst is shown
// when it differs from its rate (Burst 0 means the rate), a rate tier's
// unit last when it is not requests (30000/m:tokens).
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
	}
	s := strconv.Itoa(l.N) + "/" + formatPeriod(l.Per)
	switch {
	case l.Kind == throttle.KindWindow:
		s += ":" + modWindow
	case l.Kind == throttle.KindFixedWindow:
		s += ":" + modFixed
	case l.Burst != 0 && l.Burst != l.N:
		s += ":" + modBurst + strconv.Itoa(l.Burst)
	}
	if u := l.Unit; u != "" && u != Requests {
		s += ":" + u
	}
	return s
}

// Unit names what a limit counts: its unit for a rate tier (Requests when
// it names none), "" for an in-flight or adaptive limit, which count none.
func Unit(l throttle.Limit) string {
	switch {
	case l.Kind == throttle.KindInFlight || l.Kind == throttle.KindAdaptive:
		return ""
	case l.Unit == "":
		return Requests
	}
	return l.Unit
}

// HasUnits reports whether any of ls counts another unit than requests.
func HasUnits(ls []throttle.Limit) bool {
	for _, l := range ls {
		if u := Unit(l); u != "" && u != Requests {
			return true
		}
	}
	return false
}

// FormatAll joins limits with spaces, as ParseAll reads them.
func FormatAll(ls []throttle.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = Format(l)
	}
	return strings.Join(parts, " ")
}

func formatPeriod(d time.Duration) string { return rules.FormatPeriod(d) }

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
	Kind  string `json:"kind"`  // bucket, window, fixed, inflight or adaptive
	Limit string `json:"limit"` // as `set` takes it: 10/s:burst=20, 5000/h:window, 30000/m:tokens, 4:inflight
	// Unit is what a bucket or window counts: "requests", or the unit it
	// is in (Limit.In: "tokens"); absent for an in-flight or adaptive
	// limit. Rate, Burst and Tokens are in it.
	Unit          string  `json:"unit,omitempty"`
	Rate          int     `json:"rate"` // per period; an in-flight limit: the slots
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
		t := TierView{Kind: KindName(l.Kind), Limit: Format(l), Unit: Unit(l), Rate: l.N, PeriodSeconds: l.Per.Seconds(), Burst: Burst(l)}
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
