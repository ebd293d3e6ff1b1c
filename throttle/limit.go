package throttle

import (
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/rules"
)

// Bounds on limits (TestLimitDocsStateTheBounds compares them with the docs).
// Values outside them are refused with ErrInvalidLimit, by SetLimits in Go
// and again by the scripts for limits read from Redis.
const (
	maxTiers         = rules.MaxTiers // rate tiers per key (windows and buckets)
	maxPer           = rules.MaxPer   // the longest period
	maxRatePerSecond = rules.MaxRatePerSecond
	maxBurst         = rules.MaxBurst
	maxInFlight      = rules.MaxInFlight
)

// Kind says what a Limit counts.
type Kind int

const (
	// KindBucket (the zero value) is a token bucket: N every Per, at most
	// Burst at once (PerSecond, PerMinute, PerHour).
	KindBucket Kind = iota
	// KindWindow is a sliding window: at most N calls in any window of
	// length Per, whatever its phase (Window).
	KindWindow
	// KindInFlight caps the tasks running at once: at most N hold a slot
	// across the fleet (InFlight).
	KindInFlight
	// KindAdaptive makes the key's rate limits adaptive (Adaptive): its Per
	// is the clean period after which a step of a cut is won back.
	KindAdaptive
	// KindFixedWindow is a fixed window: at most N calls in each window of
	// length Per aligned to the Unix epoch on the Redis clock (FixedWindow).
	KindFixedWindow
)

// Limit is one limit of a key, one of four kinds; each field means the same
// in every kind that uses it:
//
//	Kind          N                   Per                Burst
//	KindBucket    calls per Per       the refill period  calls at once (0: N)
//	KindWindow    calls per Per       the window         -
//	KindFixedWindow calls per Per     the window         -
//	KindInFlight  calls at once       -                  -
//	KindAdaptive  -                   the clean period   -
//
// The constructors (PerSecond, PerMinute, PerHour, Window, FixedWindow,
// InFlight, Adaptive) make valid limits; SetLimits refuses a Limit whose unused fields
// are set. The zero value is not a valid limit.
//
// A rate tier counts requests (a task takes its Cost, 1 without one)
// unless In names another unit: then it counts what tasks say they use of
// that unit (Uses), settled after the call (Used).
//
// Bounds: a key has at most 8 rate tiers (buckets and windows), one
// InFlight and one Adaptive; Per is at most 30 days (an Adaptive clean
// period at least 1s); a tier allows at most 1000000 calls per second;
// Burst and a window's N are at most 1000000000; InFlight's N is at most
// 1000000. SetLimits refuses anything outside them with ErrInvalidLimit,
// naming the field.
type Limit struct {
	Kind  Kind
	N     int
	Per   time.Duration
	Burst int
	// Unit is what a rate tier counts: "" (or "requests") for requests,
	// else another unit, as In sets it.
	Unit string
}

// In returns a copy of l counted in unit instead of requests: "tokens" for
// an LLM provider's tokens per minute, beside its requests per minute:
//
//	lim.SetLimits(ctx, "openai:gpt-4o",
//		throttle.PerMinute(500),                // requests
//		throttle.PerMinute(30000).In("tokens"), // tokens
//		throttle.InFlight(16))
//
// A task takes from it what it says it uses of the unit (Uses; nothing
// when it says nothing), from every tier of every unit at once or from
// none. "requests" is the default unit; a unit is 1 to 32 of a-z, 0-9, '_'
// and '-', starting with a letter (SetLimits refuses others, naming the
// field). Two tiers of one kind and period in different units are two
// tiers.
func (l Limit) In(unit string) Limit {
	if unit == unitRequests {
		unit = ""
	}
	l.Unit = unit
	return l
}

// PerSecond allows n calls per second with a burst of n.
func PerSecond(n int) Limit { return Limit{N: n, Per: time.Second} }

// PerMinute allows n calls per minute with a burst of n.
func PerMinute(n int) Limit { return Limit{N: n, Per: time.Minute} }

// PerHour allows n calls per hour with a burst of n.
func PerHour(n int) Limit { return Limit{N: n, Per: time.Hour} }

// Window allows at most n calls in any window of length w, whatever the
// phase of the provider's own windows: a quota stated as "5,000 per hour"
// (GitHub) or "100 per minute" is never exceeded, as a token bucket of the
// same numbers would (PerHour(5000) can admit close to 10,000 inside one of
// GitHub's fixed hours). A backlog gets n calls every w plus the
// middleware's headroom (WithHeadroom) plus the time a batch's calls take
// to start (about 0.1s for 60 tasks across a fleet): against a provider
// whose windows are fixed, that drift leaves one of its windows without a
// call every so often (one in about ten at w = 1s, bench scenario E). Use
// FixedWindow for such a provider. It is a
// tier like the others in SetLimits, taken all or nothing with them.
func Window(n int, w time.Duration) Limit { return Limit{Kind: KindWindow, N: n, Per: w} }

// FixedWindow allows at most n calls in each window of length w aligned to
// the Unix epoch on the Redis clock: a minute window starts on the minute,
// an hour on the hour (UTC), as a provider that resets its count at fixed
// instants (GitHub's X-RateLimit-Reset, the IETF RateLimit's reset) counts
// them. A backlog gets its n calls as each window opens, every window: no
// drift, no window without a call, which a sliding Window cannot promise
// against fixed windows. Calls are made only from the middleware's headroom
// (WithHeadroom, at most w/4) after a window's start to the headroom before
// its end, so a call up to the headroom late, or a provider's clock up to
// the headroom apart from Redis's, still lands in the window that counted
// it. Against a provider whose windows slide, or are aligned elsewhere
// (an hour from its first call), it can admit up to 2n in one of them: use
// Window there. A refund (Used below the estimate) goes back to the window
// the call was counted in, while it is current.
func FixedWindow(n int, w time.Duration) Limit { return Limit{Kind: KindFixedWindow, N: n, Per: w} }

// InFlight allows at most n tasks of the key running at once across the
// fleet (Stripe's, GitHub's or a CRM's cap on concurrent requests). It goes
// in SetLimits beside the rate limits and is taken in the same decision: a
// slot and a token from every tier, or nothing. The middleware holds the
// slot while the handler runs and gives it back when it returns (success,
// error, panic, deferral, 429); a slot expires on the Redis clock unless the
// middleware renews it while the handler runs (WithSlotExpiry), so a worker
// killed mid-task gives its slots back. A task refused a slot is deferred
// to when one is expected to free (from how long the key's slots were held
// lately), in the order tasks were refused. A direct caller (Take) gets
// Decision.Slot and must Release it.
func InFlight(n int) Limit { return Limit{Kind: KindInFlight, N: n} }

// Adaptive makes a key's rate limits adapt to a provider that says nothing
// but 429: each new suspension of the key (a handler returned RateLimited,
// or Suspend) halves every rate limit in force (down to 1/64 of the
// configured one), fleet-wide and once per suspension, however many workers
// saw the 429; every clean period after the suspension ends wins back a
// tenth of the configured rates, up to them. The configured limits stay the
// ceiling. It goes in SetLimits beside a rate limit (it needs one):
//
//	lim.SetLimits(ctx, "crm", throttle.PerSecond(20), throttle.Adaptive(30*time.Second))
func Adaptive(clean time.Duration) Limit { return Limit{Kind: KindAdaptive, Per: clean} }

// WithBurst returns a copy of l whose burst is b; 0 means the burst is N, as
// for a Limit whose Burst is left 0.
func (l Limit) WithBurst(b int) Limit {
	l.Burst = b
	return l
}

// rate reports whether k is a rate tier: a bucket or a window.
func (k Kind) rate() bool { return k == KindBucket || k.window() }

// window reports whether k is a window, sliding or fixed.
func (k Kind) window() bool { return k == KindWindow || k == KindFixedWindow }

// burst is the effective burst: Burst, or N when Burst is 0.
func (l Limit) burst() int {
	if l.Burst == 0 {
		return l.N
	}
	return l.Burst
}

// String formats l as "50/1m0s burst 50" (a bucket), "5000 per 1h0m0s
// window", "4 in flight" or "adaptive, 30s clean periods".
func (l Limit) String() string {
	switch l.Kind {
	case KindWindow:
		return fmt.Sprintf("%d per %v window", l.N, l.Per) + l.inUnit()
	case KindFixedWindow:
		return fmt.Sprintf("%d per %v fixed window", l.N, l.Per) + l.inUnit()
	case KindInFlight:
		return fmt.Sprintf("%d in flight", l.N)
	case KindAdaptive:
		return fmt.Sprintf("adaptive, %v clean periods", l.Per)
	}
	return fmt.Sprintf("%d/%v burst %d", l.N, l.Per, l.burst()) + l.inUnit()
}

// inUnit is " in <unit>" for a tier of another unit than requests.
func (l Limit) inUnit() string {
	if l.Unit == "" || l.Unit == unitRequests {
		return ""
	}
	return " in " + l.Unit
}

// validate checks one limit; i is its position, used in the error.
func (l Limit) validate(i int) error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: limits[%d].%s = %v: %s", ErrInvalidLimit, i, field, v, why)
	}
	if l.Unit != "" && l.Unit != unitRequests {
		if !l.Kind.rate() {
			return bad("Unit", l.Unit, "only a rate tier (a bucket or a window) counts a unit: leave it empty")
		}
		if err := validateUnit(l.Unit); err != nil {
			return bad("Unit", l.Unit, err.Error())
		}
	}
	if l.Kind == KindAdaptive {
		switch {
		case l.Per < rules.MinAdaptive || l.Per > maxPer:
			return bad("Per", l.Per, fmt.Sprintf("the clean interval must be from 1s to %v", maxPer))
		case l.Per%time.Millisecond != 0:
			return bad("Per", l.Per, "must be a whole number of milliseconds")
		case l.N != 0 || l.Burst != 0:
			return bad("N", l.N, "an adaptive limit has no N or burst of its own: leave them 0")
		}
		return nil
	}
	if l.Kind == KindInFlight {
		switch {
		case l.N <= 0 || l.N > maxInFlight:
			return bad("N", l.N, fmt.Sprintf("the tasks in flight must be from 1 to %d", maxInFlight))
		case l.Per != 0 || l.Burst != 0:
			return bad("Per", l.Per, "an in-flight limit has no period or burst: leave them 0")
		}
		return nil
	}
	switch {
	case !l.Kind.rate():
		return bad("Kind", l.Kind, "must be KindBucket, KindWindow, KindFixedWindow, KindInFlight or KindAdaptive")
	case l.Kind.window() && l.Burst != 0 && l.Burst != l.N:
		return bad("Burst", l.Burst, "a window has no burst of its own: leave it 0")
	case l.Kind.window() && l.N > maxBurst:
		return bad("N", l.N, fmt.Sprintf("a window holds at most %d", maxBurst))
	case l.N <= 0:
		return bad("N", l.N, "must be > 0")
	case l.Per <= 0:
		return bad("Per", l.Per, "must be > 0")
	case l.Per%time.Millisecond != 0:
		return bad("Per", l.Per, "must be a whole number of milliseconds")
	case l.Per > maxPer:
		return bad("Per", l.Per, fmt.Sprintf("must be at most %v", maxPer))
	case l.Burst < 0:
		return bad("Burst", l.Burst, "must be >= 0 (0 means N)")
	case l.burst() > maxBurst:
		return bad("Burst", l.burst(), fmt.Sprintf("must be at most %d", maxBurst))
	}
	// N/Per > Max/s  <=>  N*1000 > Max*PerMS  <=>  N > floor(Max*PerMS/1000)
	// for integer N: exact, where float division misjudges limits at the maximum.
	if int64(l.N) > maxRatePerSecond*l.Per.Milliseconds()/1000 {
		perSec := float64(l.N) / l.Per.Seconds()
		return bad("N", l.N, fmt.Sprintf("%s per second is above the maximum %d per second", rules.Decimal(perSec), maxRatePerSecond))
	}
	return nil
}

// validateLimits checks a set of tiers and converts them for the scripts.
func validateLimits(limits []Limit) ([]lua.Tier, error) {
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: no limits given (want 1 to %d)", ErrInvalidLimit, maxTiers)
	}
	rates := 0
	for _, l := range limits {
		if l.Kind.rate() {
			rates++
		}
	}
	if rates > maxTiers {
		return nil, fmt.Errorf("%w: %d limits given, at most %d (and one InFlight, one Adaptive)", ErrInvalidLimit, rates, maxTiers)
	}
	tiers := make([]lua.Tier, len(limits))
	for i, l := range limits {
		if err := l.validate(i); err != nil {
			return nil, err
		}
		for j := range i {
			if l.Kind == KindInFlight && limits[j].Kind == KindInFlight {
				return nil, fmt.Errorf("%w: limits[%d]: a second InFlight limit (limits[%d])", ErrInvalidLimit, i, j)
			}
			if l.Kind == KindAdaptive && limits[j].Kind == KindAdaptive {
				return nil, fmt.Errorf("%w: limits[%d]: a second Adaptive limit (limits[%d])", ErrInvalidLimit, i, j)
			}
			if l.Kind.rate() && limits[j].Per == l.Per && limits[j].Kind == l.Kind && limits[j].In(limits[j].Unit).Unit == l.In(l.Unit).Unit {
				return nil, fmt.Errorf("%w: limits[%d].Per = %v: same period and unit as limits[%d] (a tier is identified by its kind, period and unit)", ErrInvalidLimit, i, l.Per, j)
			}
		}
		tiers[i] = lua.Tier{Rate: int64(l.N), PerMS: l.Per.Milliseconds(), Burst: int64(l.burst()), Unit: l.In(l.Unit).Unit}
		switch l.Kind {
		case KindWindow:
			tiers[i].Kind, tiers[i].Burst = lua.KindWindow, int64(l.N)
		case KindFixedWindow:
			tiers[i].Kind, tiers[i].Burst = lua.KindFixed, int64(l.N)
		case KindInFlight:
			tiers[i] = lua.Tier{Kind: lua.KindInFlight, Rate: int64(l.N)}
		case KindAdaptive:
			tiers[i] = lua.Tier{Kind: lua.KindAdaptive, PerMS: l.Per.Milliseconds()}
		}
	}
	for i, l := range limits {
		if l.Kind == KindAdaptive && rates == 0 {
			return nil, fmt.Errorf("%w: limits[%d]: Adaptive needs a rate limit to adapt (PerSecond, Window, ...)", ErrInvalidLimit, i)
		}
	}
	return tiers, nil
}
