package throttle

import (
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Bounds on limits. Values outside them are refused with ErrInvalidLimit, by
// SetLimits in Go and again by the script for config read from Redis.
const (
	// MaxTiers is the most limits one key can have (e.g. per second, per
	// minute, per hour, per day).
	MaxTiers = 4
	// MaxPer is the longest period of a limit.
	MaxPer = 30 * 24 * time.Hour
	// MaxRatePerSecond is the fastest rate a limit may allow.
	MaxRatePerSecond = 1_000_000
	// MaxBurst is the largest burst a limit may allow.
	MaxBurst = 1_000_000_000
)

// maxInFlight bounds InFlight.
const maxInFlight = 1_000_000

// Kind says what a Limit counts.
type Kind int

const (
	// KindBucket (the zero value) is a token bucket: Rate every Per, at most
	// Burst at once (PerSecond, PerMinute, PerHour).
	KindBucket Kind = iota
	// KindWindow is a window: at most Rate calls in any window of length
	// Per, whatever its phase (Window). Burst is not used.
	KindWindow
	// KindInFlight caps the tasks running at once: at most Rate hold a slot
	// across the fleet (InFlight). Per and Burst are not used.
	KindInFlight
	// KindAdaptive makes the rate tiers adaptive (Adaptive): Per is the
	// clean interval. Rate and Burst are not used.
	KindAdaptive
)

// Adaptive cuts and restores.
const (
	// AdaptiveCut is what each new suspension of an adaptive key leaves of
	// the rates in force.
	AdaptiveCut = 0.5
	// AdaptiveStep is the share of the configured rates won back for each
	// clean interval.
	AdaptiveStep = 0.1
	// AdaptiveFloor is the lowest share of the configured rates adaptive
	// mode goes down to.
	AdaptiveFloor = 1.0 / 64
)

// Limit allows Rate events every Per, with at most Burst at once. A Limit is a
// token bucket (Kind KindBucket): it holds Burst tokens and refills at
// Rate/Per. Window makes the other kind: at most Rate events in any window
// of length Per.
//
// The zero value is not a valid limit. Burst 0 means Burst equals Rate.
type Limit struct {
	Kind  Kind
	Rate  int
	Per   time.Duration
	Burst int
}

// PerSecond allows n events per second with a burst of n.
func PerSecond(n int) Limit { return Limit{Rate: n, Per: time.Second} }

// PerMinute allows n events per minute with a burst of n.
func PerMinute(n int) Limit { return Limit{Rate: n, Per: time.Minute} }

// PerHour allows n events per hour with a burst of n.
func PerHour(n int) Limit { return Limit{Rate: n, Per: time.Hour} }

// Window allows at most n events in any window of length w, whatever the
// phase of the provider's own windows: a quota stated as "5,000 per hour"
// (GitHub) or "100 per minute" is never exceeded, as a token bucket of the
// same numbers would (PerHour(5000) can admit close to 10,000 inside one of
// GitHub's fixed hours). It counts calls in sub-windows of w/20, so a steady
// backlog gets at least 95 % of n per w (less by the middleware's headroom).
// It is a tier like the others in SetLimits, taken all or nothing with them.
func Window(n int, w time.Duration) Limit { return Limit{Kind: KindWindow, Rate: n, Per: w} }

// InFlight allows at most n tasks of the key running at once across the
// fleet (Stripe's, GitHub's or a CRM's cap on concurrent requests). It goes
// in SetLimits beside the rate tiers and is taken in the same decision: a
// slot and a token from every tier, or nothing. The middleware holds the
// slot while the handler runs and gives it back when it returns (success,
// error, panic, deferral, 429); a slot is a lease on the Redis clock that
// the middleware renews while the handler runs (WithSlotLease), so a
// worker killed mid-task gives its slots back when their lease ends. A task
// refused a slot is deferred to when one is expected to free (from how
// long the key's slots were held lately), in the order tasks were refused.
// Direct callers (Take) get Decision.Hold and must Release it.
func InFlight(n int) Limit { return Limit{Kind: KindInFlight, Rate: n} }

// Adaptive makes a key's rate tiers adapt to a provider that says nothing
// but 429: each new suspension of the key (a handler returned RateLimited,
// or Suspend) cuts every rate tier to AdaptiveCut of what was in force,
// fleet-wide and once per suspension, however many workers saw the 429;
// every clean interval after the suspension ends wins back AdaptiveStep of
// the configured rates, up to them. The configured tiers stay the ceiling.
// It goes in SetLimits beside the rate tiers (it needs one):
//
//	lim.SetLimits(ctx, "crm", throttle.PerSecond(20), throttle.Adaptive(30*time.Second))
func Adaptive(clean time.Duration) Limit { return Limit{Kind: KindAdaptive, Per: clean} }

// WithBurst returns a copy of l whose burst is b; 0 means the burst equals
// the rate, as for a Limit whose Burst is left 0.
func (l Limit) WithBurst(b int) Limit {
	l.Burst = b
	return l
}

// burst is the effective burst: Burst, or Rate when Burst is 0.
func (l Limit) burst() int {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// String formats l as "50/1m0s burst 50" (a bucket) or "5000 per 1h0m0s
// window".
func (l Limit) String() string {
	switch l.Kind {
	case KindWindow:
		return fmt.Sprintf("%d per %v window", l.Rate, l.Per)
	case KindInFlight:
		return fmt.Sprintf("%d in flight", l.Rate)
	case KindAdaptive:
		return fmt.Sprintf("adaptive, %v clean intervals", l.Per)
	}
	return fmt.Sprintf("%d/%v burst %d", l.Rate, l.Per, l.burst())
}

// validate checks one limit; i is its position, used in the error.
func (l Limit) validate(i int) error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: limits[%d].%s = %v: %s", ErrInvalidLimit, i, field, v, why)
	}
	if l.Kind == KindAdaptive {
		switch {
		case l.Per < time.Second || l.Per > MaxPer:
			return bad("Per", l.Per, fmt.Sprintf("the clean interval must be from 1s to %v", MaxPer))
		case l.Per%time.Millisecond != 0:
			return bad("Per", l.Per, "must be a whole number of milliseconds")
		case l.Rate != 0 || l.Burst != 0:
			return bad("Rate", l.Rate, "an adaptive limit has no rate or burst of its own: leave them 0")
		}
		return nil
	}
	if l.Kind == KindInFlight {
		switch {
		case l.Rate <= 0 || l.Rate > maxInFlight:
			return bad("Rate", l.Rate, fmt.Sprintf("the tasks in flight must be from 1 to %d", maxInFlight))
		case l.Per != 0 || l.Burst != 0:
			return bad("Per", l.Per, "an in-flight limit has no period or burst: leave them 0")
		}
		return nil
	}
	switch {
	case l.Kind != KindBucket && l.Kind != KindWindow:
		return bad("Kind", l.Kind, "must be KindBucket, KindWindow, KindInFlight or KindAdaptive")
	case l.Kind == KindWindow && l.Burst != 0 && l.Burst != l.Rate:
		return bad("Burst", l.Burst, "a window has no burst of its own: leave it 0")
	case l.Kind == KindWindow && l.Rate > MaxBurst:
		return bad("Rate", l.Rate, fmt.Sprintf("a window holds at most %d", MaxBurst))
	case l.Rate <= 0:
		return bad("Rate", l.Rate, "must be > 0")
	case l.Per <= 0:
		return bad("Per", l.Per, "must be > 0")
	case l.Per%time.Millisecond != 0:
		return bad("Per", l.Per, "must be a whole number of milliseconds")
	case l.Per > MaxPer:
		return bad("Per", l.Per, fmt.Sprintf("must be at most %v", MaxPer))
	case l.Burst < 0:
		return bad("Burst", l.Burst, "must be >= 0 (0 means Rate)")
	case l.burst() > MaxBurst:
		return bad("Burst", l.burst(), fmt.Sprintf("must be at most %d", MaxBurst))
	}
	// Rate/Per > Max/s  <=>  Rate*1000 > Max*PerMS  <=>  Rate > floor(Max*PerMS/1000)
	// for integer Rate: exact, where float division misjudges limits at the maximum.
	if int64(l.Rate) > MaxRatePerSecond*l.Per.Milliseconds()/1000 {
		perSec := float64(l.Rate) / l.Per.Seconds()
		return bad("Rate", l.Rate, fmt.Sprintf("%g per second is above the maximum %d per second", perSec, MaxRatePerSecond))
	}
	return nil
}

// validateLimits checks a set of tiers and converts them for the scripts.
func validateLimits(limits []Limit) ([]lua.Tier, error) {
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: no limits given (want 1 to %d)", ErrInvalidLimit, MaxTiers)
	}
	rates := 0
	for _, l := range limits {
		if l.Kind == KindBucket || l.Kind == KindWindow {
			rates++
		}
	}
	if rates > MaxTiers {
		return nil, fmt.Errorf("%w: %d limits given, at most %d (and one InFlight, one Adaptive)", ErrInvalidLimit, rates, MaxTiers)
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
			if (l.Kind == KindBucket || l.Kind == KindWindow) && limits[j].Per == l.Per && limits[j].Kind == l.Kind {
				return nil, fmt.Errorf("%w: limits[%d].Per = %v: same period as limits[%d] (a tier is identified by its kind and period)", ErrInvalidLimit, i, l.Per, j)
			}
		}
		tiers[i] = lua.Tier{Rate: int64(l.Rate), PerMS: l.Per.Milliseconds(), Burst: int64(l.burst())}
		switch l.Kind {
		case KindWindow:
			tiers[i].Kind, tiers[i].Burst = lua.KindWindow, int64(l.Rate)
		case KindInFlight:
			tiers[i] = lua.Tier{Kind: lua.KindInFlight, Rate: int64(l.Rate)}
		case KindAdaptive:
			tiers[i] = lua.Tier{Kind: lua.KindAdaptive, PerMS: l.Per.Milliseconds()}
		}
	}
	for i, l := range limits {
		if l.Kind == KindAdaptive && rates == 0 {
			return nil, fmt.Errorf("%w: limits[%d]: Adaptive needs a rate tier to adapt (PerSecond, Window, ...)", ErrInvalidLimit, i)
		}
	}
	return tiers, nil
}
