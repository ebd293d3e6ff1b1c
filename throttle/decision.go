package throttle

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// Reason says why a decision refused a call; the zero value is that of an
// allowed one.
type Reason int

const (
	// RefusedByTier: the limit at Decision.Tier has no room for the call.
	RefusedByTier Reason = iota + 1
	// RefusedBySuspension: the key is suspended fleet-wide.
	RefusedBySuspension
	// RefusedByQueue: what the limits hold is promised to tasks that
	// reserved a run time earlier (the middleware's); this call waits
	// behind them.
	RefusedByQueue
	// RefusedReserved: the task holds a reservation that is not due yet
	// (the middleware's).
	RefusedReserved
	// RefusedBySlots: every slot of the key's InFlight limit is held; the
	// retry-after is when one is expected to free.
	RefusedBySlots
	// RefusedByProvider: the provider asked the task alone to wait (its
	// handler returned a RateLimitedError with TaskOnly); its key is not
	// suspended (the middleware's).
	RefusedByProvider
)

// String names the reason for logs.
func (r Reason) String() string {
	switch r {
	case 0:
		return "allowed"
	case RefusedByTier:
		return "tier"
	case RefusedBySuspension:
		return "suspended"
	case RefusedByQueue:
		return "queued"
	case RefusedReserved:
		return "reserved"
	case RefusedBySlots:
		return "in flight"
	case RefusedByProvider:
		return "provider"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Decision is the outcome of one decision: Limiter.Take returns it, and the
// middleware acts on it (Event reports what it did).
type Decision struct {
	// Allowed reports whether every tier admitted the call: its cost was
	// taken from all of them (and, with an InFlight limit, a slot).
	Allowed bool
	// RetryAfter is, when refused, how long until the call would be
	// admitted (for RefusedBySlots, when a slot is expected to free).
	RetryAfter time.Duration
	// Remaining is, when allowed, how many calls the tightest tier still
	// admits now.
	Remaining int
	// Reason says what refused the call (the zero value when allowed).
	Reason Reason
	// Tier is the 1-based position, in the key's limits, of the limit that
	// refused when Reason is RefusedByTier.
	Tier int
	// Slot is, when allowed on a key with an InFlight limit, the slot in
	// flight the call holds: give it back with Release when the call is
	// done. It expires after WithSlotExpiry unless given back. A call of
	// several keys holds one in each key that has an InFlight limit, all
	// in Slot: Release with any of the call's keys gives back every one.
	Slot string
	// Key is, when a call of several keys is refused, the key that made it
	// wait (the one whose limit, suspension or queue Reason and Tier
	// describe; the latest to admit it when several refuse). It is "" when
	// allowed, and for a call of one key.
	Key string

	// The middleware's: what the script said beyond a direct caller's.
	reserved   bool          // a run time was reserved for the caller's ID
	reservedAt time.Time     // that time (Redis clock)
	lease      int           // tokens taken besides for the process (WithLease)
	wait       time.Duration // admitted at a paced instant this far ahead
	gen        int64         // the limits' generation, for leases and refunds
	at         time.Time     // when allowed: the instant admitted at (Redis clock), for refunds
	booked     bool          // a booking refused: the ID holds a reservation already
	near       bool          // refused "near": a holder asked as one that waits (lua.DecideArgs.Near), to ask again at its instant
	parts      []keyPart     // a call of several keys admitted: what each key holds (multikey.go)
	waitsFor   string        // a call of several keys admitted ahead (wait): the key whose turn it waits for
}

// Take takes one call's worth from every tier of key's limits, or nothing.
// When refused, Decision.RetryAfter says when the call would be admitted.
// Take keeps the exact bucket: PerSecond(10) admits 10 at once (the
// middleware keeps room for dispatch jitter, see WithHeadroom).
//
// The task options Cost, Uses and Tenant say what the call takes, as for a
// task: Take(ctx, "github", throttle.Cost(5)) takes 5 of every request
// tier; Take(ctx, "openai", throttle.Uses("tokens", 1200)) takes a request
// and 1,200 of every tokens tier, all or nothing. A cost above a tier's
// burst (or a window's N) can never be admitted: Take returns
// ErrCostTooHigh. Key names further keys the call is decided in with key,
// all or nothing (at most 4 in all, as a task's Key): Take(ctx,
// "slack:T0123", throttle.Key("slack")) takes from both or from neither,
// and a refusal says which key made the call wait (Decision.Key). Any
// other option is an error.
//
// It returns ErrNoLimits when key has no limits (see WithDefaultLimits), a
// *ConfigError when the limits in Redis are invalid, ErrInvalidKey for a bad
// key name, and the Redis error (naming the cause) when Redis cannot decide.
func (l *Limiter) Take(ctx context.Context, key string, opts ...asynq.Option) (Decision, error) {
	if len(opts) == 0 {
		return l.decide(ctx, key, variant{}, "", taskCost{n: 1}, "")
	}
	cost, tenant, more, err := takeOptions(opts)
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: Take: %w", key, err)
	}
	if len(more) > 0 {
		keys, err := moreKeys(key, more)
		if err != nil {
			return Decision{}, fmt.Errorf("throttle: key %q: Take: throttle.Key: %w", key, err)
		}
		return l.decideMulti(ctx, keys, variant{}, "", cost, tenant)
	}
	return l.decide(ctx, key, variant{}, "", cost, tenant)
}

// takeOptions reads Take's options, as NewTask reads them: the cost (Cost,
// Uses), the tenant and further keys (Key); another option is refused.
func takeOptions(opts []asynq.Option) (taskCost, string, []string, error) {
	headers, rest, err := taskHeaders(opts)
	if err != nil {
		return taskCost{}, "", nil, err
	}
	if len(rest) > 0 {
		return taskCost{}, "", nil, fmt.Errorf("Take takes Cost, Uses, Tenant and Key (further keys) only")
	}
	var more []string
	for i := 1; i <= keyspace.MaxKeys; i++ {
		if k, ok := headers[keyspace.KeyHeader(i)]; ok {
			more = append(more, k)
		}
	}
	cost := taskCost{n: 1, units: headers[keyspace.Uses]}
	if s, ok := headers[keyspace.Cost]; ok {
		cost.n, _ = strconv.Atoi(s) // (validated)
	}
	return cost, headers[keyspace.Tenant], more, nil
}

// Release gives back slots in flight that Take held on key (Decision.Slot),
// and lets the key learn how long its slots are held, which it uses to tell
// waiters when one should free. Slots already given back, or expired, are
// skipped.
func (l *Limiter) Release(ctx context.Context, key string, slots ...string) error {
	for i, s := range slots {
		if byKey, ok := splitSlots(s); ok {
			// (a call of several keys: each slot in its own key)
			rest := append(slices.Clone(slots[:i]), slots[i+1:]...)
			var first error
			for k, held := range byKey {
				if err := l.Release(ctx, k, held...); err != nil && first == nil {
					first = err
				}
			}
			if err := l.Release(ctx, key, rest...); err != nil && first == nil {
				first = err
			}
			return first
		}
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil || len(slots) == 0 {
		return err
	}
	_, err = bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return lua.Release(ctx, l.runner, keys, slots...)
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: release %d slots in flight: %w", key, len(slots), err)
	}
	return nil
}

// extend renews the slots in flight of running handlers (see slots.go): each
// expires WithSlotExpiry from now. It returns how many were still held (an
// expired slot is not renewed).
func (l *Limiter) extend(ctx context.Context, key string, slots ...string) (int, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil || len(slots) == 0 {
		return 0, err
	}
	n, err := bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return lua.Extend(ctx, l.runner, keys, l.o.slotExpiry, slots...)
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: renew %d slots in flight: %w", key, len(slots), err)
	}
	return int(n), nil
}
