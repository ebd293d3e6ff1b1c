package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/hibiken/asynq"
)

// This file is the operator's API: what the asynq-throttle CLI, the metrics
// collector and the dashboard need beyond Inspect, SetLimits, Suspend and
// Resume.

// Delete removes what key has in Redis: its limits and weights, bucket
// state, suspension and reservations. Tasks of the key then run under the
// limiter's defaults, or unthrottled without any; a task that held a
// reservation contends again. The slots in flight of handlers still running
// are kept (each until its holder gives it back or it expires), so
// limits set again with an InFlight count them. Deleting a key that has
// nothing is not an error.
func (l *Limiter) Delete(ctx context.Context, key string) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	if ks, err := l.state(key); err == nil {
		ks.lease.drop()
		ks.forgetObserved()
	}
	// One DEL: all keys share the hash tag, so one slot on a Cluster.
	_, err = bounded(l, ctx, func(ctx context.Context) (int64, error) {
		return l.rdb.Del(ctx, keyspace.Deletable(keys)...).Result()
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: delete: %w", key, err)
	}
	return nil
}

// SetLimits stores key's limits in Redis, replacing any before them. Every
// process obeys them from its next decision: no restart, no deploy.
//
// A tier is identified by its kind, period and unit (Limit.Kind, Per and
// Unit): each new tier takes over the tokens of the old tier of the same
// kind, period and unit, wherever either sits in the list, brought up to
// date under the old limits and clamped to the new burst. So lowering a
// limit bites at once, raising one grants no sudden burst, and reordering,
// adding or dropping tiers hands no tier another's tokens. A tier the key
// did not have starts full. The old
// limits are read from Redis, or else the defaults the other processes'
// decisions last used (recorded in Redis with the bucket), so a Limiter
// without the workers' defaults changes them just as well. Two tiers of the
// same kind, period and unit are refused (PerSecond(10) beside
// Window(10, time.Second) are two tiers).
//
// Limits are tiers taken all or nothing: SetLimits(ctx, "slack",
// PerSecond(1).WithBurst(3), PerMinute(50)) admits a call only when both have
// a token. They stay until Delete, however long the key is idle: an idle
// key keeps its configuration (limits and weights) and nothing else, its
// buckets' state expiring once they are full again (docs/guarantees.md,
// "What an idle key keeps").
//
// Setting the limits a key already has changes nothing. Other limits drop
// the key's reservation queue, spaced under the old ones, and bring the
// tasks deferred under them back to be decided now (through asynq's
// Inspector on the tasks' Redis: WithTaskRedis, else the limiter's), so a
// raised limit reaches the backlog already deferred. SetLimits reports an
// error when it could set the limits but not look those tasks up: they
// then run at their old times. This process drops its leased tokens of the
// key.
func (l *Limiter) SetLimits(ctx context.Context, key string, limits ...Limit) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	tiers, err := validateLimits(limits)
	if err != nil {
		return err
	}
	ks, err := l.state(key)
	if err != nil {
		return err
	}
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.SetLimitsReply, error) {
		return lua.SetLimits(ctx, l.runner, keys, tiers, l.defaults(key))
	})
	ks.lease.drop()
	ks.forgetNoLimits()
	ks.forgetObserved()
	if err != nil {
		return fmt.Errorf("throttle: key %q: set limits: %w", key, err)
	}
	if r.Field != "" {
		return fmt.Errorf("%w: key %q: %s: %s", ErrInvalidLimit, key, r.Field, r.Reason)
	}
	l.touchNow(ctx, ks, key, true)
	if !r.Changed {
		return nil
	}
	// The tasks waiting for reserved times spaced under the old limits, or deferred
	// under them, are decided anew now: a raised limit reaches the backlog
	// already deferred, and the queue shows it again.
	reserved := make(map[string]bool, len(r.Reserved))
	for _, id := range r.Reserved {
		reserved[id] = true
	}
	if _, err := l.tasks.bringBack(ctx, func(info *asynq.TaskInfo) bool {
		return reserved[info.ID] || (info.Headers[keyspace.Origin] != "" && reserved[info.Headers[keyspace.Origin]]) || deferredBy(info, key, "")
	}); err != nil {
		return fmt.Errorf("throttle: key %q: limits set, but the tasks deferred under the old ones wait for their time: %w", key, err)
	}
	return nil
}

// maxWeight is the largest weight of a tenant.
const maxWeight = 1_000_000

// SetWeights sets the weights of key's tenants (Tenant), replacing those
// set before: while several tenants have tasks waiting on the key, each
// gets the key's rate in proportion to its weight, e.g. SetWeights(ctx,
// "openai", map[string]int{"enterprise": 3}) gives "enterprise" three
// times the share of any other tenant. A tenant not named weighs 1; nil
// puts every tenant back to 1. Weights are whole numbers from 1 to
// 1000000, kept in Redis beside the limits until Delete; every process
// follows them from its next decision, and tenants with work booked count
// with their new weight at once.
func (l *Limiter) SetWeights(ctx context.Context, key string, weights map[string]int) error {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return err
	}
	for name, w := range weights {
		if err := ValidateKey(name); err != nil {
			return fmt.Errorf("throttle: key %q: set weights: tenant: %w", key, err)
		}
		if w < 1 || w > maxWeight {
			return fmt.Errorf("throttle: key %q: set weights: tenant %q: weight %d: want a whole number from 1 to %d", key, name, w, maxWeight)
		}
	}
	ks, err := l.state(key)
	if err != nil {
		return err
	}
	_, err = bounded(l, ctx, func(ctx context.Context) (int, error) {
		return lua.SetWeights(ctx, l.runner, keys, weights)
	})
	if err != nil {
		return fmt.Errorf("throttle: key %q: set weights: %w", key, err)
	}
	l.touchNow(ctx, ks, key, false)
	return nil
}

// Suspend stops every process from taking tokens of key for d: each of them
// is refused with the remaining suspension as RetryAfter on its next decision.
// A suspension is only ever extended, never shortened, and d is capped by
// WithMaxSuspension. Inspect tells how long a key is suspended for. This
// process drops its leased tokens of the key at once, and a task it
// admitted ahead, waiting in its worker for its paced instant, does not
// start.
func (l *Limiter) Suspend(ctx context.Context, key string, d time.Duration) error {
	_, err := l.suspend(ctx, key, d)
	return err
}

func (l *Limiter) suspend(ctx context.Context, key string, d time.Duration) (time.Duration, error) {
	return l.suspendAs(ctx, key, d, lua.SuspendKey)
}

// suspendAs is suspend through how (lua.SuspendKey, or
// lua.SuspendForSpendCap: no adaptive cut).
func (l *Limiter) suspendAs(ctx context.Context, key string, d time.Duration,
	how func(context.Context, *lua.Runner, lua.Keys, time.Duration, time.Duration) (lua.Suspended, error)) (time.Duration, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("throttle: key %q: suspend for %v: duration must be > 0", key, d)
	}
	ks, err := l.state(key)
	if err != nil {
		return 0, err
	}
	ks.lease.drop()
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.Suspended, error) {
		return how(ctx, l.runner, keys, d, l.o.maxSuspension)
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: suspend: %w", key, err)
	}
	// This process stops at once: a task admitted ahead and waiting in its
	// worker for its paced instant does not start.
	ks.cacheSuspension(time.Now(), r.Left, false)
	l.touchNow(ctx, ks, key, false)
	if r.Adapted {
		l.o.logger.Warn("throttle: adaptive limits cut fleet-wide after a new suspension; clean intervals win them back",
			"key", key, "share_of_configured", r.Factor, "suspended_for", r.Left)
	}
	return r.Left, nil
}

// Resume ends key's suspension at once, and with it the reservation queue
// built while it lasted (its reserved times all lie after the old end) and
// the tenants' places in line booked with it: the key runs at its limits
// from the next decision of every process (processes that cached the
// suspension ask Redis again within 5 s). Tasks waiting in asynq's retry or
// scheduled sets for the old end, deferred by the middleware or booked by
// Limiter.Enqueue, are brought back to run now (found through asynq's
// Inspector on the tasks' Redis: WithTaskRedis, else the limiter's); each
// is then decided anew. Resume reports an error when
// Redis cannot end the suspension, or when it ended it but could not look
// the deferred tasks up (they then run at their old time). It returns how
// many deferred tasks it brought back.
func (l *Limiter) Resume(ctx context.Context, key string) (int, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return 0, err
	}
	ks, err := l.state(key)
	if err != nil {
		return 0, err
	}
	ks.lease.drop()
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.Resumed, error) {
		return lua.Resume(ctx, l.runner, keys, l.defaults(key))
	})
	if err != nil {
		return 0, fmt.Errorf("throttle: key %q: resume: %w", key, err)
	}
	ks.forgetSuspension()
	// The tasks waiting for the old end: deferred by the middleware, or
	// holding a reservation it booked, or that Limiter.Enqueue booked (such
	// a task waits in asynq's scheduled set with no mark of the key).
	reserved := make(map[string]bool, len(r.Reserved))
	for _, id := range r.Reserved {
		reserved[id] = true
	}
	n, err := l.tasks.bringBack(ctx, func(info *asynq.TaskInfo) bool {
		return reserved[info.ID] || (info.Headers[keyspace.Origin] != "" && reserved[info.Headers[keyspace.Origin]]) ||
			deferredBy(info, key, RefusedBySuspension.String())
	})
	if err != nil {
		return n, fmt.Errorf("throttle: key %q: resumed, but deferred tasks wait for their old time: %w", key, err)
	}
	return n, nil
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
	// SuspendedFor is the remaining suspension, 0 when not suspended.
	SuspendedFor time.Duration
	// Reservations is the number of outstanding reservations: deferred
	// tasks waiting for their reserved run times.
	Reservations int
	// QueuedFor is how long until the last reserved run time: how long the
	// backlog takes to drain.
	QueuedFor time.Duration
	// Generation counts the changes of the key's limits (SetLimits).
	Generation int64
	// InFlight is how many slots of the key's InFlight limit are held now
	// (that limit's Tokens entry is the slots free).
	InFlight int
	// Tenants are the key's tenants (Tenant) with work booked, at most 100,
	// then the others with a weight set (SetWeights); none when its tasks
	// have no tenants.
	Tenants []TenantStatus
}

// TenantStatus is one tenant of a key, as Inspect reads it.
type TenantStatus struct {
	// Name is the tenant ("" the default tenant: tasks without Tenant).
	Name string
	// Weight is its weight (SetWeights; 1 when not set).
	Weight int
	// Share is the part of the key's rate it gets now: its weight over the
	// weights of the tenants with work booked (0 when it has none).
	Share float64
	// Backlog is the work it has booked and not yet due, in cost units.
	Backlog float64
	// Admitted is the work admitted since it last had work booked, in cost
	// units.
	Admitted int64
}

// Inspect reports key's limits, tokens, suspension and reservations without
// changing anything. The limits are validated by the same script code as a
// decision, so Inspect fails exactly when Take would.
func (l *Limiter) Inspect(ctx context.Context, key string) (Status, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return Status{}, err
	}
	if _, err := l.state(key); err != nil {
		return Status{}, err
	}
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.InspectReply, error) {
		return lua.Inspect(ctx, l.runner, keys, l.defaults(key), l.o.lapse)
	})
	if err != nil {
		return Status{}, fmt.Errorf("throttle: key %q: inspect: %w", key, err)
	}
	return statusOf(key, r)
}

// statusOf reads an inspect reply of key as its Status.
func statusOf(key string, r lua.InspectReply) (Status, error) {
	if r.Status == lua.StatusBadConfig {
		return Status{}, &ConfigError{Key: key, Field: r.Field, Reason: r.Reason}
	}
	s := Status{SuspendedFor: r.Suspended, Reservations: int(r.Reservations), QueuedFor: r.QueuedFor, Tokens: r.Tokens,
		Generation: r.Generation, InFlight: int(r.InFlight), LearnedFor: r.LearnedFor}
	for _, t := range r.Tenants {
		s.Tenants = append(s.Tenants, TenantStatus{Name: t.Name, Weight: int(t.Weight), Share: t.Share, Backlog: t.Backlog, Admitted: int64(t.Admitted)})
	}
	if r.Status == lua.StatusNoLimits {
		return s, nil
	}
	s.AdaptiveFactor = 1
	limitOf := func(t lua.Tier) Limit {
		l := Limit{N: int(t.Rate), Per: time.Duration(t.PerMS) * time.Millisecond, Burst: int(t.Burst), Unit: t.Unit}
		switch t.Kind {
		case lua.KindWindow:
			l.Kind, l.Burst = KindWindow, 0
		case lua.KindFixed:
			l.Kind, l.Burst = KindFixedWindow, 0
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
