package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Limiter enforces fleet-wide limits per key through Redis. Every decision is
// one Lua script run inside Redis, so any number of processes sharing one Redis
// (or Redis Cluster) share each key's limits without a lock or a coordinator.
//
// A Limiter is safe for concurrent use. It keeps no state of its own besides
// its options: limits, buckets and suspensions all live in Redis.
type Limiter struct {
	rdb    redis.UniversalClient
	o      options
	flight flight

	// templates caches the EVALSHA command of each key (and reservation
	// mode), built once: a decision then only copies it and sets the task ID.
	templates  sync.Map // templateKey -> []any
	nTemplates atomic.Int64
}

type templateKey struct {
	key              string
	horizon, granule time.Duration
	lease            int
}

// maxTemplates bounds the template cache; past it the cache starts over.
const maxTemplates = 4096

// NewLimiter returns a Limiter on rdb (a *redis.Client, *redis.ClusterClient
// or failover client). An invalid option does not panic: every method of the
// Limiter (and every task through its middleware) returns an error naming it.
func NewLimiter(rdb redis.UniversalClient, opts ...Option) *Limiter {
	l := &Limiter{rdb: rdb, o: newOptions(opts)}
	l.flight = flight{rdb: rdb, timeout: l.o.timeout, inline: boundsIO(rdb, l.o.timeout)}
	if c, ok := rdb.(*redis.Client); ok && c.Options().PoolSize >= minPoolForOwn {
		l.flight.owner, l.flight.renew = c, ownRenew
	}
	l.checkEviction()
	return l
}

// Reason says why a Decision refused.
type Reason int

const (
	// NotRefused is the Reason of an allowed decision.
	NotRefused Reason = iota
	// RefusedByTier: the tier Decision.Tier has no token.
	RefusedByTier
	// RefusedBySuspension: the key is suspended fleet-wide.
	RefusedBySuspension
	// RefusedByQueue: tokens are promised to callers that reserved a slot
	// earlier; this caller waits behind them.
	RefusedByQueue
	// RefusedBeforeSlot: the caller holds a reservation that is not due yet.
	RefusedBeforeSlot
)

// String names the reason for logs.
func (r Reason) String() string {
	switch r {
	case NotRefused:
		return "allowed"
	case RefusedByTier:
		return "tier"
	case RefusedBySuspension:
		return "suspended"
	case RefusedByQueue:
		return "queued"
	case RefusedBeforeSlot:
		return "before slot"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Decision is the outcome of Take or Reserve.
type Decision struct {
	// Allowed reports whether a token was taken from every tier.
	Allowed bool
	// RetryAfter is, when not allowed, how long to wait before trying again.
	RetryAfter time.Duration
	// Remaining is, when allowed, how many tokens the tightest tier has left.
	Remaining int
	// Reason says what refused (NotRefused when allowed).
	Reason Reason
	// Tier is the 1-based tier that refused when Reason is RefusedByTier.
	Tier int
	// Reserved reports that a run slot was reserved for the caller's ID:
	// coming back at Slot (after RetryAfter) it is admitted before others.
	Reserved bool
	// Slot is the reserved slot on the Redis clock.
	Slot time.Time
	// Lease is, when allowed, how many more tokens were taken for the
	// caller's process to hand out itself (see WithLease). Take and Reserve
	// never ask for any.
	Lease int
}

// Take takes one token from every tier of key's limits, or none. When refused,
// Decision.RetryAfter says when a token will be there. Take never reserves.
//
// It returns ErrNoLimits when key has no limits (see WithDefaultLimits), a
// *ConfigError when the limits in Redis are invalid, ErrInvalidKey for a bad
// key name, and Redis errors as they are.
func (l *Limiter) Take(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, lua.DecideArgs{})
}

// Reserve is Take for a caller with a stable identity (a task ID). When it is
// refused and a slot within horizon is free, the slot is reserved for id: the
// caller should come back after RetryAfter, when it is admitted ahead of
// callers without a reservation. Slots are handed out in the order callers
// are refused, each tier simulating its bucket at the slots, so callers
// coming back at their slots find their tokens. granule is how precisely
// callers come back (asynq: Granule): slots then fall on whole granules and
// each granule gets what every bucket holds at that instant; zero means
// callers return exactly on time. A caller back within one granule of its
// slot is decided by the buckets. A reservation not used within DefaultLapse
// of its slot lapses; SetLimits drops all reservations of the key.
func (l *Limiter) Reserve(ctx context.Context, key, id string, horizon, granule time.Duration) (Decision, error) {
	if id == "" {
		return Decision{}, errors.New("throttle: Reserve needs a non-empty id")
	}
	return l.decide(ctx, key, lua.DecideArgs{TaskID: id, Horizon: horizon, Granule: granule})
}

func (l *Limiter) decide(ctx context.Context, key string, a lua.DecideArgs) (Decision, error) {
	if l.o.err != nil {
		return Decision{}, l.o.err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: decide: %w", key, err)
	}
	tmpl, err := l.template(key, a.Horizon, a.Granule, a.Lease)
	if err != nil {
		return Decision{}, err
	}
	c := getCall()
	c.tmpl, c.id = tmpl, a.TaskID
	reply, err := l.flight.do(ctx, c)
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: decide: %w", key, err)
	}
	r, err := lua.ParseDecide(reply)
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: %w", key, err)
	}
	switch r.Status {
	case lua.StatusNoLimits:
		return Decision{}, fmt.Errorf("%w %q", ErrNoLimits, key)
	case lua.StatusBadConfig:
		return Decision{}, &ConfigError{Key: key, Field: r.Field, Reason: r.Reason}
	}
	d := Decision{
		Allowed:    r.Status == lua.StatusAllowed,
		RetryAfter: r.RetryAfter,
		Remaining:  int(r.Remaining),
		Reserved:   !r.Slot.IsZero(),
		Slot:       r.Slot,
		Lease:      int(r.Lease),
	}
	switch {
	case d.Allowed:
	case r.RefusedBy == "suspended":
		d.Reason = RefusedBySuspension
	case r.RefusedBy == "queue":
		d.Reason = RefusedByQueue
	case r.RefusedBy == "reserved":
		d.Reason = RefusedBeforeSlot
	default:
		d.Reason = RefusedByTier
		d.Tier, _ = strconv.Atoi(strings.TrimPrefix(r.RefusedBy, "tier:"))
	}
	return d, nil
}

// template returns the EVALSHA command of decisions on key without their
// task IDs, from the cache or built and cached. Decisions sharing a template
// share script runs.
func (l *Limiter) template(key string, horizon, granule time.Duration, lease int) ([]any, error) {
	tk := templateKey{key: key, horizon: horizon, granule: granule, lease: lease}
	if v, ok := l.templates.Load(tk); ok {
		return v.([]any), nil
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return nil, err
	}
	defaults, err := l.defaults(key)
	if err != nil {
		return nil, err
	}
	tmpl := lua.AppendDecideArgs(nil, keys, lua.DecideArgs{
		Granule: granule, Horizon: horizon, Lapse: l.o.lapse,
		IdleExpiry: l.o.idleExpiry, Defaults: defaults, Lease: lease,
	})
	if l.nTemplates.Add(1) > maxTemplates {
		l.templates.Clear()
		l.nTemplates.Store(1)
	}
	l.templates.Store(tk, tmpl)
	return tmpl, nil
}

// defaults returns the limits a key falls back to when Redis has none.
func (l *Limiter) defaults(key string) ([]lua.Tier, error) {
	limits, ok := l.o.keyDefaults[key]
	if !ok {
		limits = l.o.defaults
	}
	if len(limits) == 0 {
		return nil, nil
	}
	tiers, err := validateLimits(limits)
	if err != nil {
		return nil, fmt.Errorf("throttle: default limits of key %q: %w", key, err)
	}
	return tiers, nil
}

func (l *Limiter) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.o.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.o.timeout)
}

// SetLimits stores key's limits in Redis, replacing any before them. Every
// process obeys them from its next decision: no restart, no deploy. Tokens
// already in the bucket are kept, clamped to the new bursts, so lowering a
// limit takes effect at once and raising one grants no sudden burst.
//
// Limits are tiers taken all or nothing: SetLimits(ctx, "slack",
// PerSecond(1).WithBurst(3), PerMinute(50)) admits a call only when both have
// a token. The limits expire after WithIdleExpiry without any call.
func (l *Limiter) SetLimits(ctx context.Context, key string, limits ...Limit) error {
	if l.o.err != nil {
		return l.o.err
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	tiers, err := validateLimits(limits)
	if err != nil {
		return err
	}
	defaults, err := l.defaults(key)
	if err != nil {
		return err
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	field, reason, err := lua.SetLimits(ctx, l.rdb, keys, l.o.idleExpiry, tiers, defaults)
	if err != nil {
		return fmt.Errorf("throttle: key %q: set limits: %w", key, err)
	}
	if field != "" {
		return fmt.Errorf("%w: key %q: %s: %s", ErrInvalidLimit, key, field, reason)
	}
	return nil
}

// Limits returns the limits key has in Redis. Without any there, it returns
// the limiter's defaults for key, or ErrNoLimits. A config in Redis that is
// invalid gives a *ConfigError, exactly as Take would.
func (l *Limiter) Limits(ctx context.Context, key string) ([]Limit, error) {
	st, err := l.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	if st.Limits == nil {
		return nil, fmt.Errorf("%w %q", ErrNoLimits, key)
	}
	return st.Limits, nil
}

// Suspend stops every process from taking tokens of key for d: each of them
// is refused with the remaining suspension as RetryAfter on its next decision.
// A suspension is only ever extended, never shortened, and d is capped by
// WithMaxSuspension. Inspect tells how long a key is suspended for.
func (l *Limiter) Suspend(ctx context.Context, key string, d time.Duration) error {
	_, err := l.suspend(ctx, key, d)
	return err
}

func (l *Limiter) suspend(ctx context.Context, key string, d time.Duration) (time.Duration, error) {
	if l.o.err != nil {
		return 0, l.o.err
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("throttle: key %q: suspend for %v: duration must be > 0", key, d)
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	left, err := lua.Suspend(ctx, l.rdb, keys, d, l.o.maxSuspension)
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: suspend: %w", key, err)
	}
	return left, nil
}

// Resume ends key's suspension at once.
func (l *Limiter) Resume(ctx context.Context, key string) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	if err := l.rdb.Del(ctx, keys.Suspend).Err(); err != nil {
		return fmt.Errorf("throttle: key %q: resume: %w", key, err)
	}
	return nil
}

// Status is a read-only view of one key, from Inspect.
type Status struct {
	// Limits in force (from Redis, or the defaults); nil when none.
	Limits []Limit
	// Tokens in each tier now, matching Limits.
	Tokens []float64
	// Suspended is the remaining suspension, 0 when not suspended.
	Suspended time.Duration
	// Reservations is the number of outstanding reserved slots.
	Reservations int
	// QueuedFor is how long until the last reserved slot.
	QueuedFor time.Duration
}

// Inspect reports key's limits, tokens, suspension and reservations without
// changing anything. The limits are validated by the same script code as a
// decision, so Inspect fails exactly when Take would.
func (l *Limiter) Inspect(ctx context.Context, key string) (Status, error) {
	if l.o.err != nil {
		return Status{}, l.o.err
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return Status{}, err
	}
	defaults, err := l.defaults(key)
	if err != nil {
		return Status{}, err
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	r, err := lua.Inspect(ctx, l.rdb, keys, defaults)
	if err != nil {
		return Status{}, fmt.Errorf("throttle: key %q: inspect: %w", key, err)
	}
	if r.Status == lua.StatusBadConfig {
		return Status{}, &ConfigError{Key: key, Field: r.Field, Reason: r.Reason}
	}
	s := Status{Suspended: r.Suspended, Reservations: int(r.Reservations), QueuedFor: r.QueuedFor, Tokens: r.Tokens}
	for _, t := range r.Tiers {
		s.Limits = append(s.Limits, Limit{Rate: int(t.Rate), Per: time.Duration(t.PerMS) * time.Millisecond, Burst: int(t.Burst)})
	}
	return s, nil
}
