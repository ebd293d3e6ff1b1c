package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/rules"
)

// Limiter enforces fleet-wide limits per key through Redis. Every decision is
// one Lua script run inside Redis, so any number of processes sharing one Redis
// (or Redis Cluster) share each key's limits without a lock or a coordinator.
//
// A Limiter is safe for concurrent use. Limits, buckets and suspensions all
// live in Redis; in the process it keeps only what saves Redis calls (the
// commands it built per key, leases and short-lived caches of the
// middleware), forgets keys it has not used for a minute, and keeps such
// state for at most 10,000 keys at once (about 9 MB): keys beyond are
// decided all the same, each call building its own command.
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
	index  indexer   // keys to record in the index of the limiter's keys

	onEvent atomic.Pointer[[]func(Event)] // OnEvent's functions, copied on write
	eventMu sync.Mutex                    // serializes OnEvent
	reach   *reach                        // why Redis does not answer, when it does not
}

// NewLimiter returns a Limiter on rdb (a *redis.Client, *redis.ClusterClient
// or failover client). Give it a client with ContextTimeoutEnabled: its
// calls then end by their own deadline (WithTimeout) on the caller's
// goroutine.
//
// NewLimiter panics if an option is invalid (a negative timeout, limits out
// of range, ...), naming the option: that is a programming error, caught at
// start, never a task stalled at run time.
func NewLimiter(rdb redis.UniversalClient, opts ...Option) *Limiter {
	o := newOptions(opts)
	if o.err != nil {
		panic(o.err)
	}
	l := &Limiter{rdb: rdb, runner: lua.NewRunner(rdb), o: o, reach: newReach(rdb)}
	l.keys = keyStates{idle: stateIdle, max: maxKeyStates, now: time.Now}
	l.index.idle = sync.NewCond(&l.index.mu)
	l.flight = flight{rdb: rdb, runner: l.runner, timeout: o.timeout, inline: boundsIO(rdb, o.timeout), reach: l.reach, giveBack: l.giveBack}
	if c, ok := rdb.(*redis.Client); ok && c.Options().PoolSize >= minPoolForOwn {
		l.flight.owner, l.flight.renew = c, ownRenew
	}
	l.tasks.setup(rdb, o)
	l.checkEviction()
	return l
}

// OnEvent registers f to be called once for every middleware decision, and
// once more when a handler reports a rate limit (see Event): for metrics,
// logs and progress displays. It runs on the worker goroutine: keep it fast.
// OnEvent is safe to call at any time, also while tasks run; metrics.New
// registers its collector this way.
func (l *Limiter) OnEvent(f func(Event)) {
	l.eventMu.Lock()
	defer l.eventMu.Unlock()
	var fs []func(Event)
	if old := l.onEvent.Load(); old != nil {
		fs = append(fs, *old...)
	}
	fs = append(fs, f)
	l.onEvent.Store(&fs)
}

// Logger returns the logger l logs to (WithLogger; slog.Default() when
// none was given), for code that logs beside it: package dashboard logs
// the actions taken from the web view there.
func (l *Limiter) Logger() *slog.Logger { return l.o.logger }

// Close gives back to the client's pool the connection the Limiter keeps for
// lone decisions, and keeps none from then on. It also waits, up to
// WithTimeout, until the keys this process decided are recorded in the
// index of the limiter's keys that Keys reads (done in the background, a
// moment after a key's first decision), so that a short-lived program's
// keys are listed too. It does not close rdb, and the Limiter still works
// after Close (every call then goes through the pool). A Limiter that is
// dropped without Close gives the connection back once it goes unused for
// a moment; Close is for callers that want it back now, such as a
// short-lived Limiter next to an application that sizes its pool tightly,
// and for programs about to exit.
func (l *Limiter) Close() error {
	l.flight.close()
	ctx := context.Background()
	if l.o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.o.timeout)
		defer cancel()
	}
	l.flushIndex(ctx)
	return nil
}

// decide makes one decision for a caller of key: task id ("" none), cost,
// tenant ("" the default tenant). A task of a tenant, and any task of a key
// Redis said tenants share, is decided in the order of fair shares.
func (l *Limiter) decide(ctx context.Context, key string, v variant, id string, cost taskCost, tenant string) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: key %q: decide: %w", key, err)
	}
	ks, err := l.state(key)
	if err != nil {
		return Decision{}, err
	}
	if tenant != "" || ks.fair.Load() {
		v.fair, v.lease = true, 0 // (no lease: it would bypass the shares)
	}
	r, err := l.decideOnce(ctx, ks, key, v, id, cost, tenant)
	if err == nil && r.Status == lua.StatusFair && !v.fair {
		// Tenants share the key: ask again as the default tenant, and from
		// now on.
		ks.fair.Store(true)
		v.fair, v.lease = true, 0
		r, err = l.decideOnce(ctx, ks, key, v, id, cost, "")
	}
	if err != nil {
		return Decision{}, err
	}
	return l.decision(key, cost, r)
}

// decideOnce sends one decision of key to Redis and reads its reply.
func (l *Limiter) decideOnce(ctx context.Context, ks *keyState, key string, v variant, id string, cost taskCost, tenant string) (lua.DecideReply, error) {
	tmpl, err := l.template(ks, key, v)
	if err != nil {
		return lua.DecideReply{}, err
	}
	c := getCall()
	c.tmpl, c.key, c.id, c.cost, c.fair, c.tenant = tmpl, key, id, cost, v.fair, tenant
	reply, err := l.flight.do(ctx, c)
	if err != nil {
		return lua.DecideReply{}, fmt.Errorf("throttle: key %q: decide: %w", key, err)
	}
	r, err := lua.ParseDecide(reply)
	if err != nil {
		return lua.DecideReply{}, fmt.Errorf("throttle: key %q: %w", key, err)
	}
	if r.Status != lua.StatusNoLimits && r.Status != lua.StatusFair {
		l.touch(ks, key, r.Generation > 0 || r.Status == lua.StatusBadConfig || r.Status == lua.StatusCostTooHigh)
	}
	return r, nil
}

// decision reads a decide reply of key as the Decision its caller gets.
func (l *Limiter) decision(key string, cost taskCost, r lua.DecideReply) (Decision, error) {
	switch r.Status {
	case lua.StatusNoLimits:
		return Decision{}, fmt.Errorf("%w %q", ErrNoLimits, key)
	case lua.StatusBadConfig:
		return Decision{}, &ConfigError{Key: key, Field: r.Field, Reason: r.Reason}
	case lua.StatusCostTooHigh:
		return Decision{}, fmt.Errorf("%w: key %q: a cost of %v, and %s", ErrCostTooHigh, key, cost, tooHigh(r))
	case lua.StatusFair:
		return Decision{}, fmt.Errorf("throttle: key %q: %w", key, lua.ErrBadReply)
	}
	d := Decision{
		Allowed:    r.Status == lua.StatusAllowed,
		RetryAfter: r.RetryAfter,
		Remaining:  int(r.Remaining),
		Slot:       r.Slot,
		reserved:   !r.Reserved.IsZero(),
		reservedAt: r.Reserved,
		wait:       r.Wait,
		lease:      int(r.Lease),
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
		d.Reason = RefusedReserved
	case r.RefusedBy == "near":
		d.Reason, d.near = RefusedReserved, true
	case r.RefusedBy == "inflight":
		d.Reason = RefusedBySlots
	case r.RefusedBy == "booked":
		d.Reason, d.booked = RefusedReserved, true
	default:
		d.Reason = RefusedByTier
		d.Tier, _ = strconv.Atoi(strings.TrimPrefix(r.RefusedBy, "tier:"))
	}
	return d, nil
}

// tooHigh says which tier can never hold a cost, as the key's limits list
// it: "tier 1 (2/s) holds at most 2", "tier 2 (100/m:window) admits at most
// 100 per window", "tier 2 (30000/m:tokens) holds at most 30000 tokens".
func tooHigh(r lua.DecideReply) string {
	t := r.TooHigh
	kind, holds := rules.KindBucket, "holds at most "+r.Reason
	switch t.Kind {
	case lua.KindWindow:
		kind, holds = rules.KindWindow, "admits at most "+r.Reason
	case lua.KindFixed:
		kind, holds = rules.KindFixed, "admits at most "+r.Reason
	}
	if t.Unit != "" {
		holds += " " + t.Unit
	}
	if kind != rules.KindBucket {
		holds += " per window"
	}
	spec := rules.Tier(kind, t.Rate, time.Duration(t.PerMS)*time.Millisecond, t.Burst, t.Unit)
	return fmt.Sprintf("tier %s (%s) %s", r.Field, spec, holds)
}

// state returns the process state of key, made when missing.
func (l *Limiter) state(key string) (*keyState, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	return l.keys.get(key), nil
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
		Defaults: l.defaults(key), Lease: v.lease,
		Headroom: v.headroom, Book: v.book, Pace: v.pace, Probe: v.probe, Near: v.near, SlotExpiry: l.o.slotExpiry, Fair: v.fair,
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

// maxVariants bounds the decide commands kept per key (lease sizes, and
// the middleware's, Enqueue's and a slot waiter's flags).
const maxVariants = 16

// defaults returns the limits a key falls back to when Redis has none
// (validated when the options were).
func (l *Limiter) defaults(string) []lua.Tier { return l.o.defaultTiers }

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

// adjust is Adjust for call: a refund is given back as far as it can be
// without admitting more real calls than had the call cost that much less
// (see lua.Adjust).
func (l *Limiter) adjust(ctx context.Context, key string, delta int, call lua.Call) error {
	_, err := l.settle(ctx, key, delta, call)
	return err
}

// settle is adjust, and returns the IDs of the tasks whose reservations a
// refund brought forward (call.Forward, see lua.Settle): the caller runs
// them (Limiter.forward).
func (l *Limiter) settle(ctx context.Context, key string, delta int, call lua.Call) ([]lua.Forwarded, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return nil, err
	}
	if _, err := l.state(key); err != nil {
		return nil, err
	}
	ids, err := bounded(l, ctx, func(ctx context.Context) ([]lua.Forwarded, error) {
		return lua.Settle(ctx, l.runner, keys, delta, call, l.defaults(key))
	})
	if err != nil {
		return nil, fmt.Errorf("throttle: key %q: adjust by %d: %w", key, delta, err)
	}
	return ids, nil
}
