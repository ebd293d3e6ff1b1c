package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Limiter enforces fleet-wide limits per key through Redis. Every decision is
// one Lua script run inside Redis, so any number of processes sharing one Redis
// (or Redis Cluster) share each key's limits without a lock or a coordinator.
//
// A Limiter is safe for concurrent use. Limits, buckets and suspensions all
// live in Redis; in the process it keeps only what saves Redis calls (the
// commands it built per key, leases and short-lived caches of the
// middleware), and forgets keys it has not used for a minute.
//
// One Limiter per process (per Redis) is the intended use: it batches the
// decisions of all its goroutines into shared round trips, and keeps one
// connection of the client's pool for lone decisions (given back whenever it
// goes unused for a moment; see Close).
type Limiter struct {
	rdb    redis.UniversalClient
	runner *lua.Runner
	o      options
	flight flight
	keys   keyStates
	tasks  taskStore // the asynq side: copies, and tasks to bring back
	slots  slotBook  // slots in flight held by this process's handlers
	reach  *reach    // why Redis does not answer, when it does not
}

// NewLimiter returns a Limiter on rdb (a *redis.Client, *redis.ClusterClient
// or failover client).
//
// NewLimiter panics if an option is invalid (a negative timeout, limits out
// of range, ...), naming the option: that is a programming error, caught at
// start, never a task stalled at run time. Check options that come from
// configuration with CheckOptions first.
func NewLimiter(rdb redis.UniversalClient, opts ...Option) *Limiter {
	o := newOptions(opts)
	if o.err != nil {
		panic(o.err)
	}
	l := &Limiter{rdb: rdb, runner: lua.NewRunner(rdb), o: o, reach: newReach(rdb)}
	l.keys = keyStates{idle: stateIdle, now: time.Now}
	l.flight = flight{rdb: rdb, runner: l.runner, timeout: o.timeout, inline: boundsIO(rdb, o.timeout), reach: l.reach, giveBack: l.giveBack}
	if c, ok := rdb.(*redis.Client); ok && c.Options().PoolSize >= minPoolForOwn {
		l.flight.owner, l.flight.renew = c, ownRenew
	}
	l.tasks.setup(rdb, o)
	l.checkEviction()
	return l
}

// CheckOptions reports the first invalid option among opts, naming it, as
// NewLimiter and ByProvider would panic with it.
func CheckOptions(opts ...Option) error {
	return newOptions(opts).err
}

// Close gives back to the client's pool the connection the Limiter keeps for
// lone decisions, and keeps none from then on. It does not close rdb, and
// the Limiter still works after Close (every call then goes through the
// pool). A Limiter that is dropped without Close gives the connection back
// once it goes unused for a moment; Close is for callers that want it back
// now, such as a short-lived Limiter next to an application that sizes its
// pool tightly.
func (l *Limiter) Close() error {
	l.flight.close()
	return nil
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
	// RefusedBySlots: every slot of the key's InFlight limit is held; the
	// retry-after is when one is expected to free.
	RefusedBySlots
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
	case RefusedBySlots:
		return "in flight"
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
	// Wait is, when allowed at a reserved slot a moment ahead (the
	// middleware's pacing), how long to wait before starting: the tokens
	// are taken as of then. Take and Reserve always give 0.
	Wait time.Duration
	// Hold is, when allowed on a key with an InFlight limit, the slot the
	// caller holds: give it back with Release when the call is done (and
	// renew it with Extend if the call may outlast WithSlotLease).
	Hold string

	gen    int64     // limits generation, for leases
	at     time.Time // when allowed: the instant it was admitted at (Redis clock), for refunds
	booked bool      // a booking refused: the ID holds a reservation already
}

// CallOption changes one call of Take, TakeN, Reserve or ReserveN.
type CallOption func(*variant)

// Headroom makes a call keep room for d of dispatch jitter, as the
// middleware does (WithHeadroom): it is admitted only when every tier would
// still admit it d later, so calls that reach the provider up to d apart
// from their decisions never find its quota short. Without it a call takes
// the exact bucket: PerSecond(10) admits 10 at once.
func Headroom(d time.Duration) CallOption {
	return func(v *variant) { v.headroom = max(d, 0) }
}

// Take takes one token from every tier of key's limits, or none. When refused,
// Decision.RetryAfter says when a token will be there. Take never reserves.
//
// It returns ErrNoLimits when key has no limits (see WithDefaultLimits), a
// *ConfigError when the limits in Redis are invalid, ErrInvalidKey for a bad
// key name, and Redis errors as they are.
func (l *Limiter) Take(ctx context.Context, key string, opts ...CallOption) (Decision, error) {
	return l.TakeN(ctx, key, 1, opts...)
}

// TakeN is Take for a call that costs n tokens of every tier (a GraphQL
// query's points, say): all n from every tier, or none. A cost above a
// tier's burst (or a window's quota) can never be admitted: TakeN returns
// ErrCostTooHigh. See Charge to settle the actual cost afterwards.
func (l *Limiter) TakeN(ctx context.Context, key string, n int, opts ...CallOption) (Decision, error) {
	if n < 1 {
		return Decision{}, fmt.Errorf("throttle: key %q: TakeN(%d): the cost must be at least 1", key, n)
	}
	return l.decide(ctx, key, withCallOptions(variant{}, opts), "", n)
}

// withCallOptions returns v with opts applied. (Applied here, not in the
// caller: a variant whose address is taken escapes to the heap, and a lone
// Take without options must not allocate for it.)
func withCallOptions(v variant, opts []CallOption) variant {
	if len(opts) == 0 {
		return v
	}
	p := new(variant)
	*p = v
	for _, o := range opts {
		o(p)
	}
	return *p
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
// of its slot lapses; SetLimits and Resume drop all reservations of the key.
func (l *Limiter) Reserve(ctx context.Context, key, id string, horizon, granule time.Duration, opts ...CallOption) (Decision, error) {
	return l.ReserveN(ctx, key, id, 1, horizon, granule, opts...)
}

// ReserveN is Reserve for a caller that costs n tokens of every tier (see
// TakeN): its slot is spaced for n.
func (l *Limiter) ReserveN(ctx context.Context, key, id string, n int, horizon, granule time.Duration, opts ...CallOption) (Decision, error) {
	if id == "" {
		return Decision{}, errors.New("throttle: Reserve needs a non-empty id")
	}
	if horizon < 0 || granule < 0 {
		return Decision{}, fmt.Errorf("throttle: Reserve(horizon %v, granule %v): both must be >= 0", horizon, granule)
	}
	if n < 1 {
		return Decision{}, fmt.Errorf("throttle: key %q: ReserveN(%d): the cost must be at least 1", key, n)
	}
	return l.decide(ctx, key, withCallOptions(variant{horizon: horizon, granule: granule}, opts), id, n)
}

func (l *Limiter) decide(ctx context.Context, key string, v variant, id string, cost int) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: decide: %w", key, err)
	}
	ks, err := l.state(ctx, key)
	if err != nil {
		return Decision{}, err
	}
	tmpl, err := l.template(ks, key, v)
	if err != nil {
		return Decision{}, err
	}
	c := getCall()
	c.tmpl, c.key, c.id, c.cost = tmpl, key, id, cost
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
	case lua.StatusCostTooHigh:
		return Decision{}, fmt.Errorf("%w: key %q: a cost of %d, and a tier holds at most %s", ErrCostTooHigh, key, cost, r.Reason)
	}
	d := Decision{
		Wait:       r.Wait,
		Hold:       r.Hold,
		Allowed:    r.Status == lua.StatusAllowed,
		RetryAfter: r.RetryAfter,
		Remaining:  int(r.Remaining),
		Reserved:   !r.Slot.IsZero(),
		Slot:       r.Slot,
		Lease:      int(r.Lease),
		gen:        r.Generation,
		at:         r.At,
	}
	switch {
	case d.Allowed:
	case r.RefusedBy == "suspended":
		d.Reason = RefusedBySuspension
	case r.RefusedBy == "queue":
		d.Reason = RefusedByQueue
	case r.RefusedBy == "reserved":
		d.Reason = RefusedBeforeSlot
	case r.RefusedBy == "inflight":
		d.Reason = RefusedBySlots
	case r.RefusedBy == "booked":
		d.Reason, d.booked = RefusedBeforeSlot, true
	default:
		d.Reason = RefusedByTier
		d.Tier, _ = strconv.Atoi(strings.TrimPrefix(r.RefusedBy, "tier:"))
	}
	return d, nil
}

// state returns the process state of key, migrating the key from the
// previous storage layout the first time this process uses it.
func (l *Limiter) state(ctx context.Context, key string) (*keyState, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	ks := l.keys.get(key)
	if !ks.migrated.Load() {
		if err := l.migrate(ctx, key); err != nil {
			return nil, err
		}
		ks.migrated.Store(true)
	}
	return ks, nil
}

// migrate carries what key holds in the previous storage layout into the
// current one (see lua.Migrate).
func (l *Limiter) migrate(ctx context.Context, key string) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	defaults := l.defaults(key)
	_, err = bounded(l, ctx, func(ctx context.Context) (bool, error) {
		return lua.Migrate(ctx, l.runner, keys, l.o.idleExpiry, defaults)
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: migrate from the previous storage layout: %w", key, err)
	}
	return nil
}

// template returns the decide command of key in variant v (horizon,
// granule, lease) without its task IDs, from the key's state or built and
// kept there. Decisions sharing a template share script runs.
func (l *Limiter) template(ks *keyState, key string, v variant) ([]any, error) {
	v.mode = l.runner.Mode()
	if v == (variant{mode: v.mode}) {
		if t := ks.take.Load(); t != nil && t.v == v {
			return t.args, nil
		}
	} else {
		ks.mu.Lock()
		for _, t := range ks.tmpls {
			if t.v == v {
				ks.mu.Unlock()
				return t.args, nil
			}
		}
		ks.mu.Unlock()
	}
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return nil, err
	}
	t := &template{v: v, args: lua.AppendDecideArgs(nil, v.mode, keys, lua.DecideArgs{
		Granule: v.granule, Horizon: v.horizon, Lapse: l.o.lapse,
		IdleExpiry: l.o.idleExpiry, Defaults: l.defaults(key), Lease: v.lease,
		Headroom: v.headroom, Book: v.book, Pace: v.pace, Probe: v.probe, SlotLease: l.o.slotLease,
	})}
	if v == (variant{mode: v.mode}) {
		ks.take.Store(t)
		return t.args, nil
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for i, old := range ks.tmpls {
		if old.v.mode != v.mode { // built before a switch to EVALSHA
			ks.tmpls[i] = ks.tmpls[len(ks.tmpls)-1]
			ks.tmpls = ks.tmpls[:len(ks.tmpls)-1]
			break
		}
	}
	if len(ks.tmpls) >= maxVariants {
		ks.tmpls = ks.tmpls[1:]
	}
	ks.tmpls = append(ks.tmpls, t)
	return t.args, nil
}

// maxVariants bounds the decide commands kept per key (lease sizes, Reserve
// horizons).
const maxVariants = 16

// defaults returns the limits a key falls back to when Redis has none
// (validated when the options were).
func (l *Limiter) defaults(key string) []lua.Tier {
	if t, ok := l.o.keyTiers[key]; ok {
		return t
	}
	return l.o.defaultTiers
}

// bounded runs fn with ctx given the WithTimeout deadline, and returns by
// that deadline whatever fn waits on. A client that bounds socket I/O by
// context deadlines itself (see boundsIO) runs fn on the caller's goroutine;
// otherwise (go-redis then waits up to its ReadTimeout) fn runs on a
// goroutine of its own, which may finish after bounded returned, its result
// dropped.
func bounded[T any](l *Limiter, ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if l.o.timeout <= 0 {
		v, err := fn(ctx)
		return v, l.reach.explain(err, time.Time{})
	}
	// The client gets the timeout less a reserve in which a failed call
	// finds out why (see reach).
	deadline := time.Now().Add(l.o.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := l.reach.before(deadline); err != nil {
		return zero, err
	}
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(-l.reach.reserve(l.o.timeout)))
	defer cancel()
	if l.flight.inline {
		v, err := fn(ctx)
		return v, l.reach.explain(err, deadline)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, l.reach.explain(r.err, deadline)
	case <-ctx.Done():
		if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
			return zero, err
		}
		return zero, l.reach.explain(fmt.Errorf("%w: no answer within %v (WithTimeout)", context.DeadlineExceeded, l.o.timeout), deadline)
	}
}

// SetLimits stores key's limits in Redis, replacing any before them. Every
// process obeys them from its next decision: no restart, no deploy.
//
// A tier is identified by its period (Limit.Per): each new tier takes over
// the tokens of the old tier with the same period, wherever either sits in
// the list, brought up to date under the old limits and clamped to the new
// burst. So lowering a limit bites at once, raising one grants no sudden
// burst, and reordering, adding or dropping tiers hands no tier another's
// tokens. A tier with a period the key did not have starts full. The old
// limits are read from Redis, or else the defaults the other processes'
// decisions last used (recorded in Redis with the bucket), so a Limiter
// without the workers' defaults changes them just as well. Two tiers with
// the same period are refused.
//
// Limits are tiers taken all or nothing: SetLimits(ctx, "slack",
// PerSecond(1).WithBurst(3), PerMinute(50)) admits a call only when both have
// a token. The limits expire after WithIdleExpiry without any call. The
// reservation queue is dropped; this process drops its leased tokens of
// the key.
func (l *Limiter) SetLimits(ctx context.Context, key string, limits ...Limit) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	tiers, err := validateLimits(limits)
	if err != nil {
		return err
	}
	ks, err := l.state(ctx, key)
	if err != nil {
		return err
	}
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.SetLimitsReply, error) {
		return lua.SetLimits(ctx, l.runner, keys, l.o.idleExpiry, tiers, l.defaults(key))
	})
	ks.lease.drop()
	ks.forgetNoLimits()
	if err != nil {
		return fmt.Errorf("throttle: key %q: set limits: %w", key, err)
	}
	if r.Field != "" {
		return fmt.Errorf("%w: key %q: %s: %s", ErrInvalidLimit, key, r.Field, r.Reason)
	}
	if !r.Changed {
		return nil
	}
	// The tasks waiting for slots spaced under the old limits, or deferred
	// under them, are decided anew now: a raised limit reaches the backlog
	// already deferred, and the queue shows it again.
	reserved := make(map[string]bool, len(r.Reserved))
	for _, id := range r.Reserved {
		reserved[id] = true
	}
	if _, err := l.tasks.bringBack(ctx, func(info *asynq.TaskInfo) bool {
		return reserved[info.ID] || (info.Headers[HeaderOrigin] != "" && reserved[info.Headers[HeaderOrigin]]) || deferredBy(info, key, "")
	}); err != nil {
		return fmt.Errorf("throttle: key %q: limits set, but the tasks deferred under the old ones wait for their time: %w", key, err)
	}
	return nil
}

// Limits returns the limits key has in Redis. Without any there, it returns
// the limiter's defaults for key, or ErrNoLimits. Limits in Redis that are
// invalid give a *ConfigError, exactly as Take would.
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
// WithMaxSuspension. Inspect tells how long a key is suspended for. This
// process drops its leased tokens of the key at once.
func (l *Limiter) Suspend(ctx context.Context, key string, d time.Duration) error {
	_, err := l.suspend(ctx, key, d)
	return err
}

func (l *Limiter) suspend(ctx context.Context, key string, d time.Duration) (time.Duration, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("throttle: key %q: suspend for %v: duration must be > 0", key, d)
	}
	ks, err := l.state(ctx, key)
	if err != nil {
		return 0, err
	}
	ks.lease.drop()
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.Suspended, error) {
		return lua.SuspendKey(ctx, l.runner, keys, d, l.o.maxSuspension)
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: suspend: %w", key, err)
	}
	if r.Adapted {
		l.o.logger.Warn("throttle: adaptive limits cut fleet-wide after a new suspension; clean intervals win them back",
			"key", key, "share_of_configured", r.Factor, "suspended_for", r.Left)
	}
	return r.Left, nil
}

// Resume ends key's suspension at once, and with it the reservation queue
// built while it lasted (its slots all lie after the old end): the key runs
// at its limits from the next decision of every process (processes that
// cached the suspension ask Redis again within 5 s). Tasks that the
// middleware deferred because of the suspension, waiting in asynq's retry
// or scheduled sets for its old end, are brought back to run now (found
// through asynq's Inspector on the tasks' Redis: WithTaskRedis, else the
// limiter's); each is then decided anew. Resume reports an error when
// Redis cannot end the suspension, or when it ended it but could not look
// the deferred tasks up (they then run at their old time).
func (l *Limiter) Resume(ctx context.Context, key string) error {
	_, err := l.ResumeTasks(ctx, key)
	return err
}

// ResumeTasks is Resume, and also reports how many deferred tasks it
// brought back.
func (l *Limiter) ResumeTasks(ctx context.Context, key string) (int, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return 0, err
	}
	ks, err := l.state(ctx, key)
	if err != nil {
		return 0, err
	}
	ks.lease.drop()
	_, err = bounded(l, ctx, func(ctx context.Context) (time.Duration, error) {
		return lua.Resume(ctx, l.runner, keys)
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: resume: %w", key, err)
	}
	ks.forgetSuspension()
	n, err := l.tasks.bringBack(ctx, func(info *asynq.TaskInfo) bool {
		return deferredBy(info, key, RefusedBySuspension.String())
	})
	if err != nil {
		return n, fmt.Errorf("throttle: key %q: resumed, but deferred tasks wait for their old time: %w", key, err)
	}
	return n, nil
}

// Adjust makes every tier of key take delta more calls' worth as of now (a
// cost settled after the call: see Charge, the same for a handler under the
// middleware). A negative delta gives nothing back: a refund is safe only
// for a known call, from when it was admitted (see Charge).
func (l *Limiter) Adjust(ctx context.Context, key string, delta int) error {
	return l.adjust(ctx, key, delta, lua.Call{Generation: -1})
}

// adjust is Adjust for call: a refund is given back as far as it can be
// without admitting more real calls than had the call cost that much less
// (see lua.Adjust).
func (l *Limiter) adjust(ctx context.Context, key string, delta int, call lua.Call) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	if _, err := l.state(ctx, key); err != nil {
		return err
	}
	_, err = bounded(l, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, lua.Adjust(ctx, l.runner, keys, delta, call, l.o.idleExpiry, l.defaults(key))
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: adjust by %d: %w", key, delta, err)
	}
	return nil
}

// Status is a read-only view of one key, from Inspect.
type Status struct {
	// Limits are the limits as configured (from Redis, or the defaults), as
	// SetLimits set them; nil when none. They are the ceiling of what is
	// learned.
	Limits []Limit
	// InForce are the limits in force now, matching Limits: a tier lowered
	// by what Observe learned from the provider or by adaptive mode, else
	// the configured one.
	InForce []Limit
	// LearnedFor is, for each entry of Limits, how long the quota learned
	// from the provider stays in force unconfirmed (0: none learned).
	LearnedFor []time.Duration
	// AdaptiveFactor is the share of the configured rates adaptive mode
	// keeps in force (1 when not cut, or not adaptive).
	AdaptiveFactor float64
	// Tokens in each tier now, matching Limits, under the limits in force
	// (for a window: the calls it would still admit now; for InFlight: the
	// slots free; 0 for Adaptive).
	Tokens []float64
	// Suspended is the remaining suspension, 0 when not suspended.
	Suspended time.Duration
	// Reservations is the number of outstanding reserved slots.
	Reservations int
	// QueuedFor is how long until the last reserved slot.
	QueuedFor time.Duration
	// Generation counts the changes of the key's limits (SetLimits).
	Generation int64
	// InFlight is how many slots of an InFlight limit are held now (the
	// limit is the last of Limits; its Tokens entry is the slots free).
	InFlight int
}

// Release gives back the slots in flight that decisions on key held
// (Decision.Hold), and lets the key learn how long its slots are held,
// which it uses to tell waiters when one should free. Holds already given
// back, or taken back when their lease ended, are skipped.
func (l *Limiter) Release(ctx context.Context, key string, holds ...string) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil || len(holds) == 0 {
		return err
	}
	_, err = bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return lua.Release(ctx, l.runner, keys, holds...)
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: release %d slots in flight: %w", key, len(holds), err)
	}
	return nil
}

// Extend renews the leases of slots in flight on key (Decision.Hold): each
// is held WithSlotLease from now. It returns how many were still held (a
// slot whose lease had already ended was taken back and is not renewed).
func (l *Limiter) Extend(ctx context.Context, key string, holds ...string) (int, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil || len(holds) == 0 {
		return 0, err
	}
	n, err := bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return lua.Extend(ctx, l.runner, keys, l.o.slotLease, holds...)
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: extend %d slots in flight: %w", key, len(holds), err)
	}
	return int(n), nil
}

// Inspect reports key's limits, tokens, suspension and reservations without
// changing anything. The limits are validated by the same script code as a
// decision, so Inspect fails exactly when Take would.
func (l *Limiter) Inspect(ctx context.Context, key string) (Status, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return Status{}, err
	}
	if _, err := l.state(ctx, key); err != nil {
		return Status{}, err
	}
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.InspectReply, error) {
		return lua.Inspect(ctx, l.runner, keys, l.defaults(key), l.o.lapse)
	})
	if err != nil {
		return Status{}, fmt.Errorf("throttle: key %q: inspect: %w", key, err)
	}
	if r.Status == lua.StatusBadConfig {
		return Status{}, &ConfigError{Key: key, Field: r.Field, Reason: r.Reason}
	}
	s := Status{Suspended: r.Suspended, Reservations: int(r.Reservations), QueuedFor: r.QueuedFor, Tokens: r.Tokens,
		Generation: r.Generation, InFlight: int(r.InFlight), LearnedFor: r.LearnedFor}
	if r.Status == lua.StatusNoLimits {
		return s, nil
	}
	s.AdaptiveFactor = 1
	limitOf := func(t lua.Tier) Limit {
		l := Limit{Rate: int(t.Rate), Per: time.Duration(t.PerMS) * time.Millisecond, Burst: int(t.Burst)}
		if t.Kind == lua.KindWindow {
			l.Kind, l.Burst = KindWindow, 0
		}
		return l
	}
	for i, t := range r.Tiers {
		s.InForce = append(s.InForce, limitOf(t))
		s.Limits = append(s.Limits, limitOf(r.Configured[i]))
	}
	if r.InFlightMax > 0 {
		s.Limits = append(s.Limits, InFlight(int(r.InFlightMax)))
		s.InForce = append(s.InForce, InFlight(int(r.InFlightMax)))
		s.Tokens = append(s.Tokens, float64(max(r.InFlightMax-r.InFlight, 0)))
		s.LearnedFor = append(s.LearnedFor, 0)
	}
	if r.AdaptiveEvery > 0 {
		a := Adaptive(r.AdaptiveEvery)
		s.Limits = append(s.Limits, a)
		s.InForce = append(s.InForce, a)
		s.Tokens = append(s.Tokens, 0)
		s.LearnedFor = append(s.LearnedFor, 0)
		s.AdaptiveFactor = r.AdaptiveFactor
	}
	return s, nil
}
