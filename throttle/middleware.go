package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
	"github.com/asynq-throttle/asynq-throttle/internal/jitter"
	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// Outcome is what the middleware did with one task.
type Outcome int

const (
	// Ran: a token was taken and the handler runs (after its paced wait,
	// if any: see Event.Wait).
	Ran Outcome = iota
	// Deferred: refused; the task will run later.
	Deferred
	// Suspended: the handler reported a rate limit; the key was suspended
	// fleet-wide and the task deferred.
	Suspended
	// Unthrottled: the task has no key, or its key has no limits; the
	// handler ran without a decision.
	Unthrottled
	// Failed: Redis could not decide; the failure policy applied
	// (Event.HandlerRan tells whether the handler ran: WithFailOpen).
	Failed
	// Rejected: the task can never be throttled (an invalid key or cost in
	// its headers, a cost above what a tier of its key can ever admit); it
	// failed for good (asynq.SkipRetry), and asynq archived it.
	Rejected
	// Unsettled: a handler's Used could not be recorded in Redis (Event.Err
	// says why). The task's result stands: its call to the provider was
	// made, and failing it would make the call again; the key's tiers
	// count the task's estimate instead of what it used.
	Unsettled
)

// String names the outcome for logs.
func (o Outcome) String() string {
	switch o {
	case Ran:
		return "ran"
	case Deferred:
		return "deferred"
	case Suspended:
		return "suspended"
	case Unthrottled:
		return "unthrottled"
	case Failed:
		return "failed"
	case Rejected:
		return "rejected"
	case Unsettled:
		return "unsettled"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Event describes one middleware decision, for the functions given to
// Limiter.OnEvent. A handler that reports a rate limit gives a second event
// for the same task: Suspended, or, for a wait of the task alone
// (RateLimitedError.TaskOnly), Deferred with RefusedByProvider; a Used that
// could not be recorded, one more: Unsettled. A task admitted ahead whose
// key this process learns is suspended during its paced wait gives Ran,
// then Deferred with RefusedBySuspension: its handler did not run after
// all (see Event.Wait).
type Event struct {
	Key      string
	TaskID   string
	TaskType string
	// Tenant is the task's tenant (Tenant; "" the default tenant).
	Tenant  string
	Outcome Outcome
	// Reason is the refusal's reason when Deferred.
	Reason Reason
	// Tier is, when Reason is RefusedByTier, the 1-based position of the
	// limit that refused, in the limits of the key that made the task wait.
	// For a task of several keys (Key with more than one name), Key is
	// that key on a Deferred event, and the task's first key otherwise.
	Tier int
	// Delay is how long a Deferred or Suspended task waits.
	Delay time.Duration
	// Wait is how long a task Ran waits in its worker before its handler
	// starts: admitted at its reserved time a moment ahead (see WithPacing).
	// The event comes when it was admitted, before the wait. If its key is
	// suspended during the wait (as far as this process knows: its own 429,
	// Suspend, or a decision that saw one), the task does not run after
	// all: a Deferred event (RefusedBySuspension) follows. (A paced task
	// may also wait in its worker before it is admitted, to ask again near
	// its time; that wait is not in Wait.)
	Wait time.Duration
	// Reserved reports that the deferred task holds a reservation: it runs
	// at its reserved time without contending again.
	Reserved bool
	// Leased reports that the task ran on a token its process had leased,
	// without a decision in Redis.
	Leased bool
	// Cached reports a decision the process made from what Redis told it
	// a moment before (a suspension, or a key without limits), without a
	// call to Redis.
	Cached bool
	// Copied reports that the deferral re-enqueued a copy of the task (the
	// path used outside worker.NewServer and on a task's last attempt).
	Copied bool
	// HandlerRan reports whether the handler ran (on a Ran event, sent
	// before it runs: that it is to run).
	HandlerRan bool
	// Latency is how long the decision took in Redis, round trip included
	// (0 when it took none: leased, cached, no key; and on a Suspended
	// event, which follows its task's Ran event).
	Latency time.Duration
	// Err is the Redis error of a Failed decision, or the error that kept a
	// deferred task from being re-enqueued.
	Err error

	left int       // tokens the task's decision left in Redis, -1 unknown (for Observe)
	cost taskCost  // the task's cost (for Used)
	at   time.Time // when its decision admitted it (Redis clock), for Used's refunds
	gen  int64     // the limits' generation of that decision
	// A task of several keys: its keys (the first is Key when it ran),
	// and, admitted, what each key holds.
	keys  []string
	parts []keyPart
}

// ByProvider returns an asynq middleware that throttles every task by its key
// (see Key, WithKeyFunc) with limits shared through rdb by every process:
//
//	mux.Use(throttle.ByProvider(rdb))
//
// Before the handler runs it makes one decision in Redis. When allowed, the
// handler runs. When refused, the handler does not run: the task is deferred
// to run after the retry-after, and the worker goroutine is free at once. A
// handler error wrapping RateLimited suspends the key fleet-wide, whatever
// path ran the handler (a key without limits, a Redis that could not
// decide under FailOpen).
//
// Use it in a server built by worker.NewServer: deferrals then keep the task's
// ID and retry count and count as neither processed nor failed. In a plain
// asynq.Server (and on a task's last allowed attempt, which asynq would
// archive) the task is deferred by enqueueing a copy with a new ID and
// finishing the original, which asynq counts as processed.
//
// ByProvider makes a Limiter for the middleware, which lives as long as the
// process (it holds no connection while idle). To share one Limiter with
// other code, or to Close it, use NewLimiter and Limiter.Middleware. It
// panics on an invalid option, as NewLimiter does.
func ByProvider(rdb redis.UniversalClient, opts ...Option) asynq.MiddlewareFunc {
	return NewLimiter(rdb, opts...).Middleware()
}

// Middleware returns the asynq middleware that throttles every task of a
// server by its key, with l's options (see ByProvider, which makes a
// Limiter for it):
//
//	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
//	mux := asynq.NewServeMux()
//	mux.Use(lim.Middleware())
//
// For each task it finds the key (Key through NewTask, else WithKeyFunc,
// else the type's prefix: "slack:sync" is throttled as "slack"; a task
// without one runs unthrottled) and makes one decision in Redis: the key's
// suspension, then a token of the task's Cost from every tier of its
// limits, or none. Allowed, the handler runs. Refused, the handler does not
// run: the task is deferred to its reserved run time (or after the
// retry-after) and its worker goroutine is free at once for other keys'
// tasks. A deferral spends none of the task's retries: under
// worker.NewServer it goes through asynq's retry path with the same task
// ID and retry count, counted neither processed nor failed; under a plain
// asynq.Server, and on a task's last allowed attempt, a copy is enqueued
// and the original finished (see ByProvider).
//
// A handler error that wraps RateLimited (Observe returns one for a 429)
// suspends the key fleet-wide and defers the task past the suspension,
// again without spending a retry. When Redis cannot decide within
// WithTimeout the task is deferred (WithFailOpen runs it instead). A task
// that can never be throttled (an invalid key; a Cost above a tier's
// burst, ErrCostTooHigh) is archived at once with asynq.SkipRetry. Every
// decision is reported to the functions given to OnEvent (package metrics
// counts them).
//
// Several servers (or muxes) may use the middleware of one Limiter; it is
// safe for concurrent use.
func (l *Limiter) Middleware() asynq.MiddlewareFunc {
	m := &middleware{
		l:      l,
		jitter: jitter.New(nil, 0, maxJitter, jitterFraction),
		now:    time.Now,
	}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			return m.process(ctx, t, next)
		})
	}
}

type middleware struct {
	l      *Limiter
	jitter *jitter.Jitter
	now    func() time.Time
}

// A deferral without a reserved time waits its retry-after and a tenth more
// at random, at most 10 s more: a crowd does not come back at once.
const (
	jitterFraction = 0.1
	maxJitter      = 10 * time.Second
)

// noLimitsCacheFor is how long a process trusts "this key has no limits":
// limits set later with SetLimits reach it within this time.
const noLimitsCacheFor = 5 * time.Second

// suspensionCacheMax bounds how long a process trusts a cached suspension,
// so that an operator's Resume reaches every process within it.
const suspensionCacheMax = 5 * time.Second

// maxParked bounds the tasks one cached suspension remembers.
const maxParked = 10_000

func (m *middleware) process(ctx context.Context, t *asynq.Task, next asynq.Handler) error {
	o := &m.l.o
	id, _ := asynq.GetTaskID(ctx)
	key, err := o.keyOf(t)
	if err != nil {
		return m.badTask(ctx, t, id, key, err)
	}
	ev := Event{Key: key, TaskID: id, TaskType: t.Type(), left: -1}
	if key == "" {
		ev.Outcome = Unthrottled
		return m.run(ctx, t, next, nil, ev)
	}
	cost, err := costOf(t)
	if err != nil {
		return m.badTask(ctx, t, id, key, err)
	}
	tenant, err := tenantOf(t)
	if err != nil {
		return m.badTask(ctx, t, id, key, err)
	}
	ev.cost, ev.Tenant = cost, tenant
	if keys, err := keysOfTask(t, key); err != nil {
		return m.badTask(ctx, t, id, key, err)
	} else if keys != nil {
		ev.keys = keys
		return m.processMulti(ctx, t, next, keys, ev)
	}
	ks := m.l.keys.get(key)
	if done, err := m.decideInProcess(ctx, t, next, ks, &ev); done {
		return err
	}
	asked := 0
	if o.lease > 1 && o.leaseFor > 0 && cost.n < o.lease && cost.units == "" && tenant == "" && !ks.fair.Load() && !ks.transient {
		asked = ks.lease.request(o.lease)
	}
	d, err := m.decideAndWait(ctx, key, t, id, asked, cost, ks, &ev)
	return m.act(ctx, t, next, ks, ev, d, err)
}

// decideInProcess decides without Redis when this process knows the
// answer: the key has no limits, or is suspended (both cached for a few
// seconds), or a token its process leased is left. It reports whether it
// decided, and the task's result then.
func (m *middleware) decideInProcess(ctx context.Context, t *asynq.Task, next asynq.Handler, ks *keyState, ev *Event) (bool, error) {
	o := &m.l.o
	now := m.now()
	if ks.noLimits(now) {
		ev.Outcome, ev.Cached = Unthrottled, true
		return true, m.run(ctx, t, next, ks, *ev)
	}
	if retryAt, ok := ks.suspendedUntil(now); ok {
		ev.Cached = true
		return true, m.deferDecision(ctx, t, ks, Decision{RetryAfter: retryAt.Sub(now), Reason: RefusedBySuspension}, *ev, Deferred)
	}
	if o.lease > 1 && o.leaseFor > 0 && ev.cost.n < o.lease && ev.cost.units == "" && ev.Tenant == "" && !ks.fair.Load() && ks.lease.take(now, o.lease, ev.cost.n) {
		ev.Outcome, ev.Leased = Ran, true
		return true, m.run(ctx, t, next, ks, *ev)
	}
	return false, nil
}

// act carries out decision d (or err, when Redis could not decide) on task
// t: run it, defer it, run it unthrottled (no limits), or reject it.
func (m *middleware) act(ctx context.Context, t *asynq.Task, next asynq.Handler, ks *keyState, ev Event, d Decision, err error) error {
	key := ev.Key
	switch {
	case errors.Is(err, ErrNoLimits):
		ks.setNoLimits(m.now().Add(noLimitsCacheFor))
		if ks.warnOnce() {
			m.l.o.logger.Warn("throttle: key has no limits, running its tasks unthrottled; call SetLimits or use WithDefaultLimits",
				"key", key, "task_type", t.Type())
		}
		ev.Outcome = Unthrottled
		return m.run(ctx, t, next, ks, ev)
	case errors.Is(err, ErrCostTooHigh):
		return m.badTask(ctx, t, ev.TaskID, key, err)
	case err != nil:
		return m.cannotDecide(ctx, t, ks, next, ev, err)
	case !d.Allowed:
		return m.deferDecision(ctx, t, ks, d, ev, Deferred)
	}
	if m.tooFarAhead(ctx, d.wait) {
		// Admitted at a paced time further ahead than the worker waits, or
		// than the task's deadline lets it wait while leaving its handler
		// at least as long: give the admission back and defer the task to
		// it (it comes back with its whole timeout). Its call never starts
		// before the instant its tiers counted it at.
		m.giveBack(ctx, key, d, ev.cost, ev.Tenant)
		return m.deferDecision(ctx, t, ks, Decision{RetryAfter: d.wait, Reason: RefusedByQueue}, ev, Deferred)
	}
	if d.Slot != "" {
		release := m.l.holdSlot(key, d.Slot)
		defer release() // also when the handler panics
	}
	ev.Outcome, ev.left, ev.at, ev.gen = Ran, d.Remaining, d.at, d.gen
	ev.Wait = d.wait
	return m.run(ctx, t, next, ks, ev)
}

// decideAndWait decides on task t, and waits in its worker for a slot in
// flight expected free within a granule (a deferral would bring the task
// back on the next whole second at the earliest, leaving the slot idle
// meanwhile), asking again with its place among the waiters kept (a
// probe). No wait runs into the time the task needs before its deadline
// to be deferred after all (see waitBudget).
func (m *middleware) decideAndWait(ctx context.Context, key string, t *asynq.Task, id string, asked int, cost taskCost, ks *keyState, ev *Event) (Decision, error) {
	if dl, ok := ctx.Deadline(); ok && m.l.o.timeout > 0 && dl.Sub(m.now()) < m.l.o.timeout+deferReserve {
		// The decision gives up in time for the task to be deferred.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-deferReserve))
		defer cancel()
	}
	// A task with the time to wait in its worker for its paced instant asks
	// as one that does (near): on a key with units, it is admitted at most
	// lua.NearAhead ahead of its instant, and told to wait until then
	// otherwise, so that the room its key has meanwhile is not counted as
	// used by its call (see holder_turn in decide.lua). It waits and asks
	// again, for at most maxNearWait in all.
	near := m.l.o.pacing && m.waitBudget(ctx, m.l.o.timeout) >= maxNearWait
	sent := m.now()
	d, err := m.decideNear(ctx, key, t, id, asked, cost, near)
	ev.Latency = m.now().Sub(sent)
	for waited := time.Duration(0); near && err == nil && !d.Allowed && d.near; {
		w := d.RetryAfter
		if w > maxPaceWait || waited+w > maxNearWait || w > m.waitBudget(ctx, m.l.o.timeout) {
			break
		}
		if serr := m.sleep(ctx, w); serr != nil {
			return d, serr
		}
		waited += w
		d, err = m.decideNear(ctx, key, t, id, asked, cost, true)
	}
	for waited := time.Duration(0); err == nil && !d.Allowed && d.Reason == RefusedBySlots; {
		w := max(d.RetryAfter, minSlotPoll)
		if waited+w > maxSlotWait || w > m.waitBudget(ctx, m.l.o.timeout) {
			break
		}
		if serr := m.sleep(ctx, w); serr != nil {
			return d, serr
		}
		waited += w
		d, err = m.decideProbe(ctx, key, t, id, cost)
	}
	if err == nil {
		m.saw(ks, d, sent, asked)
	}
	return d, err
}

// suspendedMeanwhile reports a suspension this process knows of, on a
// key of the admitted task of ev, after it waited in its worker for its
// paced instant: the key suspended, and until when.
func (m *middleware) suspendedMeanwhile(ev Event) (string, time.Time, bool) {
	keys := ev.keys
	if len(keys) == 0 {
		keys = []string{ev.Key}
	}
	return m.suspendedKnown(keys, m.now())
}

// suspendedKnown reports the suspension this process knows of (cached) on
// keys that ends last at now: its key, and until when.
func (m *middleware) suspendedKnown(keys []string, now time.Time) (string, time.Time, bool) {
	var latest time.Time
	by := ""
	for _, k := range keys {
		if at, ok := m.l.keys.get(k).suspendedUntil(now); ok && at.After(latest) {
			latest, by = at, k
		}
	}
	return by, latest, by != ""
}

// deferAdmitted gives back the admission of a task of ev that will not run
// after all (its key by was suspended until retryAt while it waited for its
// paced instant), and defers it as a task refused by that suspension: a
// Deferred event follows its Ran one. Its slots in flight are released by
// whoever holds them (act, processMulti).
func (m *middleware) deferAdmitted(ctx context.Context, t *asynq.Task, by string, retryAt time.Time, ev Event) error {
	if len(ev.parts) > 0 {
		for _, p := range ev.parts {
			m.giveBack(ctx, p.key, Decision{at: p.at, gen: p.gen}, ev.cost, ev.Tenant)
		}
	} else {
		m.giveBack(ctx, ev.Key, Decision{at: ev.at, gen: ev.gen}, ev.cost, ev.Tenant)
	}
	ev = Event{Key: by, TaskID: ev.TaskID, TaskType: ev.TaskType, Tenant: ev.Tenant, keys: ev.keys, cost: ev.cost, Cached: true}
	d := Decision{RetryAfter: max(retryAt.Sub(m.now()), 0), Reason: RefusedBySuspension}
	return m.deferDecision(ctx, t, m.l.keys.get(by), d, ev, Deferred)
}

// deferReserve is what a task keeps of its time before its deadline, beyond
// any Redis call still to come, to be deferred: asynq counts a task whose
// deadline passes as failed, whatever its handler returns afterwards.
const deferReserve = 100 * time.Millisecond

// waitBudget is how long the task of ctx may still wait in its worker
// before calls taking up to then more (a decision: WithTimeout) and its
// deferral, all before its deadline. A task without a deadline may wait.
func (m *middleware) waitBudget(ctx context.Context, then time.Duration) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return maxPaceWait + maxSlotWait
	}
	return dl.Sub(m.now()) - then - deferReserve
}

// giveBack undoes the admission d of a task that will not run now: its slot
// in flight and its cost go back to the key.
func (m *middleware) giveBack(ctx context.Context, key string, d Decision, cost taskCost, tenant string) {
	ctx = context.WithoutCancel(ctx)
	if d.Slot != "" {
		if err := m.l.Release(ctx, key, d.Slot); err != nil {
			m.l.o.logger.Warn("throttle: cannot give back a slot in flight; it frees when it expires",
				"key", key, "slot", d.Slot, "slot_expiry", m.l.o.slotExpiry, "err", err)
		}
	}
	if err := m.l.refund(ctx, key, d.at, d.gen, cost, tenant); err != nil {
		m.l.o.logger.Warn("throttle: cannot give back the tokens of a task that did not run", "key", key, "cost", cost.String(), "err", err)
	}
}

// badTask fails a task that no worker can ever throttle (an invalid key or
// cost in its headers, or a cost above what a tier of its key can ever
// admit) for good: asynq archives it at once (asynq.SkipRetry), where it
// can be run again once its limits change, instead of retrying it until its
// retries run out. The enqueuer's bug, logged at Error.
func (m *middleware) badTask(ctx context.Context, t *asynq.Task, id, key string, err error) error {
	m.observe(Event{Key: key, TaskID: id, TaskType: t.Type(), Outcome: Rejected, Err: err})
	msg := "throttle: task can never be throttled; archiving it (asynq.SkipRetry): fix how it is enqueued, then run it again from the archive"
	if errors.Is(err, ErrCostTooHigh) {
		msg = "throttle: task costs more than a tier of its key can ever admit; archiving it (raise the tier's burst or lower the task's Cost, then run it again from the archive)"
	}
	m.l.o.logger.Error(msg, "key", key, "task_id", id, "task_type", t.Type(), "err", err)
	return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
}

// cannotDecide applies the failure policy to a task Redis could not decide.
func (m *middleware) cannotDecide(ctx context.Context, t *asynq.Task, ks *keyState, next asynq.Handler, ev Event, err error) error {
	o := &m.l.o
	ev.Outcome, ev.Err = Failed, err
	if o.failOpen {
		o.logger.Error("throttle: cannot decide, running task unthrottled (fail open)", "key", ev.Key, "task_id", ev.TaskID, "err", err)
		return m.run(ctx, t, next, ks, ev)
	}
	delay := m.roundUp(m.jitter.Add(o.failureDelay))
	o.logger.Error("throttle: cannot decide, deferring task (fail closed)", "key", ev.Key, "task_id", ev.TaskID, "retry_in", delay, "err", err)
	ev.Delay = delay
	var derr error
	ev.Copied, _, derr = m.deferTask(ctx, t, ev.Key, delay, "redis unavailable")
	if derr != nil && !isDeferral(derr) {
		ev.Err = derr
	}
	m.observe(ev)
	return derr
}

// maxPaceWait bounds the wait for a paced slot: one granule and the
// tolerance the script allows a task back early.
const maxPaceWait = granule + lua.PaceEarly

// maxNearWait bounds how long a paced task waits in its worker, asking
// again, before it is admitted near its instant (decideAndWait): back a
// paced wait early, and a granule more if its key's tiers have no room at
// its instant. A task whose deadline leaves less asks as before (admitted
// up to maxPaceWait ahead).
const maxNearWait = maxPaceWait + granule

// tooFarAhead reports whether a task admitted wait ahead (paced) should be
// deferred to its instant instead of waiting for it in its worker: the
// worker never waits longer than maxPaceWait, and never into the half of
// the time left before the task's deadline.
func (m *middleware) tooFarAhead(ctx context.Context, wait time.Duration) bool {
	return wait > 0 && (wait > maxPaceWait || wait > m.waitBudget(ctx, 0)/2)
}

// maxSlotWait bounds how long a task refused a slot waits in its worker
// for one expected free; minSlotPoll is the shortest such wait.
const (
	maxSlotWait = granule
	minSlotPoll = 20 * time.Millisecond
)

// sleep waits d (at most maxPaceWait) or until ctx ends.
func (m *middleware) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(min(d, maxPaceWait))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// saw updates the process's view of a key from a decision sent at sent:
// leased tokens, and a suspension without a reserved time to offer, which every
// task of the key would be told until it ends. Any refusal (the bucket at
// its limit, a suspension) drops the key's leased tokens, as does a change
// of limits (a new generation).
func (m *middleware) saw(ks *keyState, d Decision, sent time.Time, asked int) {
	now := m.now()
	if !d.Allowed {
		ks.lease.drop()
	} else if asked > 0 {
		ks.lease.add(asked, d.lease, sent, m.l.o.leaseFor, d.gen, now)
	}
	if !d.Allowed && !d.reserved && d.Reason == RefusedBySuspension {
		ks.cacheSuspension(now, d.RetryAfter, false)
	}
}

// run runs the handler of an admitted task, and turns a RateLimited error
// into a fleet-wide suspension of its key and a deferral of the task. ks is
// nil for a task without a key.
func (m *middleware) run(ctx context.Context, t *asynq.Task, next asynq.Handler, ks *keyState, ev Event) error {
	o := &m.l.o
	ev.HandlerRan = true
	m.observe(ev)
	if ev.Wait > 0 {
		// Admitted at its reserved time a moment ahead (pacing): the tokens
		// are taken as of then, so the call starts then.
		if err := m.sleep(ctx, ev.Wait); err != nil {
			return err
		}
		if ks != nil {
			if by, retryAt, ok := m.suspendedMeanwhile(ev); ok {
				// Its key was suspended while it waited (a 429 this
				// process saw, or Suspend): the call does not start.
				return m.deferAdmitted(ctx, t, by, retryAt, ev)
			}
		}
	}
	if ks != nil {
		cost := ev.cost.orOne()
		if ev.Outcome == Unthrottled || ev.Outcome == Failed {
			// Nothing was taken (no limits, or run unthrottled when Redis
			// could not decide): Used takes all it says.
			cost = taskCost{}
		}
		tc := &taskCharge{l: m.l, ks: ks, key: ev.Key, tenant: ev.Tenant, cost: cost, left: ev.left, at: ev.at, gen: ev.gen}
		for _, p := range ev.parts {
			if p.key != ev.Key {
				tc.also = append(tc.also, &taskCharge{l: m.l, ks: m.l.keys.get(p.key), key: p.key, tenant: ev.Tenant, cost: cost, left: -1, at: p.at, gen: p.gen})
			}
		}
		ctx = context.WithValue(ctx, chargeKey{}, tc)
	}
	herr := next.ProcessTask(ctx, t)
	var rl *RateLimitedError
	if ks == nil || !errors.As(herr, &rl) {
		return herr
	}
	key := ev.Key
	if rl.Key != "" && rl.Key != key {
		if slices.Contains(ev.keys, rl.Key) {
			// A task of several keys: the handler named the key whose
			// limit the provider enforced.
			key, ks = rl.Key, m.l.keys.get(rl.Key)
		} else if !rl.TaskOnly {
			o.logger.Warn("throttle: RateLimitedError names a key the task does not have; suspending the task's first key",
				"key", key, "named", rl.Key, "task_id", ev.TaskID, "task_keys", ev.keys)
		}
	}
	if rl.TaskOnly {
		ev.Key = key // (a task of several keys: the key named)
		return m.waitTaskOnly(ctx, t, ks, ev, rl)
	}
	ks.lease.drop() // the provider disagrees: lease no more tokens
	ks.forgetNoLimits()
	// The provider said "too many requests": stop the whole fleet.
	wait := rl.RetryAfter
	if wait <= 0 {
		wait = o.defaultSuspend
	}
	wait = min(wait, o.maxSuspension)
	// A suspension is kept in microseconds: never shorter than asked.
	wait = (wait + time.Microsecond - 1).Truncate(time.Microsecond)
	how := lua.SuspendKey
	if rl.spendCap != "" || rl.allocation {
		how = lua.SuspendForSpendCap // no adaptive cut: a cap (or a daily allocation used up) says nothing of the rate
	}
	left, err := m.l.suspendAs(ctx, key, wait, how)
	if err == nil && rl.spendCap != "" {
		o.logger.Error("throttle: the provider says the account's spend cap is reached; this is not a rate limit, no quota was learned. The key is suspended fleet-wide: raise the cap (or wait for the billing period), then resume it (asynq-throttle resume KEY, or Limiter.Resume)",
			"key", key, "task_id", ev.TaskID, "reason", rl.spendCap, "status", rl.StatusCode, "suspended_for", left)
	} else if err != nil {
		o.logger.Error("throttle: provider rate limited a task but the key could not be suspended in Redis; this process pauses it, the task is deferred",
			"key", key, "task_id", ev.TaskID, "suspended_for", wait, "err", err)
		left = wait
	} else if rl.allocation {
		o.logger.Warn("throttle: the provider's allocation (a daily quota) is used up; key suspended fleet-wide until it is back, at most WithMaxSuspension at a time",
			"key", key, "task_id", ev.TaskID, "status", rl.StatusCode, "suspended_for", left)
	} else {
		o.logger.Warn("throttle: provider rate limited a task, key suspended fleet-wide", "key", key, "task_id", ev.TaskID, "suspended_for", left)
	}
	// This process stops at once, even when Redis could not be told.
	ks.cacheSuspension(m.now(), left, err != nil)
	cost, keys := ev.cost.orOne(), ev.keys
	ev = Event{Key: key, TaskID: ev.TaskID, TaskType: ev.TaskType, Tenant: ev.Tenant, keys: keys}
	if rl.spendCap != "" {
		ev.Err = rl // a Suspended event that says why: a spend cap, not a rate limit
	}
	d := Decision{RetryAfter: left, Reason: RefusedBySuspension}
	if err == nil {
		// A reserved time after the suspension, so the deferred crowd comes back
		// spread out. A suspension short enough to be over already admits
		// the task: that admission is given back, the task deferred anyway
		// (the provider refused its call).
		id, _ := asynq.GetTaskID(ctx)
		var rd Decision
		var derr error
		if keys != nil {
			rd, derr = m.decideMultiTask(ctx, keys, t, id, cost, false)
		} else {
			rd, derr = m.decide(ctx, key, t, id, 0, cost)
		}
		switch {
		case derr != nil:
		case rd.Allowed && keys != nil:
			m.giveBackMulti(ctx, rd, cost, ev.Tenant)
		case rd.Allowed:
			m.giveBack(ctx, key, rd, cost, ev.Tenant)
		case rd.Reason == RefusedBySuspension:
			d = rd
		}
	}
	return m.deferDecision(ctx, t, ks, d, ev, Suspended)
}

// waitTaskOnly defers a task whose provider asked it alone to wait (a
// RateLimitedError with TaskOnly: one object locked, one resource's
// limit): by the wait asked (the default suspension when none, at most
// WithMaxSuspension), and nothing else. The key is not suspended, its
// lease and its other tasks run on, and the call the task made keeps its
// tokens (the provider counted it).
func (m *middleware) waitTaskOnly(ctx context.Context, t *asynq.Task, ks *keyState, ev Event, rl *RateLimitedError) error {
	o := &m.l.o
	wait := rl.RetryAfter
	if wait <= 0 {
		wait = o.defaultSuspend
	}
	wait = min(wait, o.maxSuspension)
	o.logger.Debug("throttle: the provider asked this task alone to wait; its key is not suspended",
		"key", ev.Key, "task_id", ev.TaskID, "retry_in", wait, "status", rl.StatusCode)
	ev = Event{Key: ev.Key, TaskID: ev.TaskID, TaskType: ev.TaskType, Tenant: ev.Tenant}
	return m.deferDecision(ctx, t, ks, Decision{RetryAfter: wait, Reason: RefusedByProvider}, ev, Deferred)
}

// decide asks Redis for a decision on t, which costs cost; lease is how
// many tokens it may take for this process (0: just its cost).
func (m *middleware) decide(ctx context.Context, key string, t *asynq.Task, id string, lease int, cost taskCost) (Decision, error) {
	return m.decideNear(ctx, key, t, id, lease, cost, false)
}

// decideNear is decide for a task that waits in its worker for a paced
// instant ahead and asks again when near is set (lua.DecideArgs.Near).
func (m *middleware) decideNear(ctx context.Context, key string, t *asynq.Task, id string, lease int, cost taskCost, near bool) (Decision, error) {
	return m.decideAs(ctx, key, t, id, cost, variant{granule: granule, lease: lease, headroom: m.l.o.headroom, pace: m.l.o.pacing, near: near})
}

// decideProbe asks again for a task waiting in its worker for a slot in
// flight: it keeps its place among the waiters.
func (m *middleware) decideProbe(ctx context.Context, key string, t *asynq.Task, id string, cost taskCost) (Decision, error) {
	return m.decideAs(ctx, key, t, id, cost, variant{granule: granule, headroom: m.l.o.headroom, pace: m.l.o.pacing, probe: true})
}

func (m *middleware) decideAs(ctx context.Context, key string, t *asynq.Task, id string, cost taskCost, v variant) (Decision, error) {
	if origin := t.Headers()[keyspace.Origin]; origin != "" {
		id = origin
	}
	if m.l.o.horizon > 0 && id != "" {
		v.horizon = m.l.o.horizon
	} else {
		id = ""
	}
	tenant, _ := tenantOf(t) // (validated by process)
	return m.l.decide(ctx, key, v, id, cost, tenant)
}

// deferDecision defers a refused task by deferDelay. A task deferred on a
// cached suspension is remembered with it, to be brought back if the
// suspension turns out to have ended early (Resume).
func (m *middleware) deferDecision(ctx context.Context, t *asynq.Task, ks *keyState, d Decision, ev Event, out Outcome) error {
	delay := m.deferDelay(d)
	ev.Outcome, ev.Reason, ev.Tier, ev.Delay, ev.Reserved = out, d.Reason, d.Tier, delay, d.reserved
	m.l.o.logger.Debug("throttle: task deferred", "key", ev.Key, "task_id", ev.TaskID, "reason", d.Reason, "retry_in", delay, "reserved", d.reserved)
	copied, waitingAs, err := m.deferTask(ctx, t, ev.Key, delay, d.Reason.String())
	ev.Copied = copied
	if err != nil && !isDeferral(err) {
		ev.Err = err
	} else if ev.Cached {
		queue, _ := asynq.GetQueueName(ctx)
		if s := ks.park(parkedTask{queue: queue, id: waitingAs}); s != nil {
			time.AfterFunc(time.Until(s.until), func() { m.checkParked(ev.Key, ks, s) })
		}
	}
	m.observe(ev)
	return err
}

// deferDelay is how long a refused task waits in asynq before it is
// dequeued again: a task with a reservation comes back right after its
// reserved time (or, paced, on the whole second before it, its worker
// waiting for the time itself);
// others get jitter so a crowd does not come back at once.
func (m *middleware) deferDelay(d Decision) time.Duration {
	switch {
	case d.Reason == RefusedBySlots:
		// A slot in flight expected free at now+RetryAfter: come back on the
		// whole second before it; the worker waits for the slot from there
		// (maxSlotWait) instead of leaving it idle until the next second. A
		// task holding a reservation keeps it, but its reserved time does not
		// free a slot: it is told when one is expected.
		return max(m.now().Add(d.RetryAfter).Truncate(time.Second).Sub(m.now()), 0)
	case d.reserved && m.l.o.pacing && d.reservedAt.Truncate(time.Second) != d.reservedAt:
		// A paced reservation, inside a second: come back on the whole
		// second before it; the worker then waits for its time itself.
		return max(d.reservedAt.Truncate(time.Second).Sub(m.now()), 0)
	case d.reserved:
		// Aim at the reserved time itself (a whole second of the Redis
		// clock), not at now+RetryAfter: the reply's travel time would push
		// the task past the boundary and cost it a whole second.
		return m.until(d.reservedAt)
	}
	return m.roundUp(m.jitter.Add(d.RetryAfter))
}

// checkParked runs when a cached suspension that deferred tasks expires: if
// Redis says the key is no longer suspended, or until earlier than the
// tasks were told, those still waiting for a later time are brought back
// now rather than at the old end, and logged.
func (m *middleware) checkParked(key string, ks *keyState, s *suspension) {
	parked := ks.unpark(s)
	if len(parked) == 0 {
		return
	}
	timeout := m.l.o.timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := m.l.Inspect(ctx, key)
	if err != nil {
		m.l.o.logger.Warn("throttle: cannot check a cached suspension; tasks it deferred wait for their time", "key", key, "tasks", len(parked), "err", err)
		return
	}
	if st.SuspendedFor > 0 && time.Now().Add(st.SuspendedFor).After(s.retryAt.Add(-granule)) {
		return // still suspended as long as the tasks were told
	}
	// Most often nothing moves: the suspension ran its course and the
	// tasks are due (or ran) already, or a Resume brought them back itself.
	if n := m.l.tasks.run(parked, soonest, func(info *asynq.TaskInfo) bool { return deferredBy(info, key, RefusedBySuspension.String()) }); n > 0 {
		m.l.o.logger.Info("throttle: key's suspension ended before the tasks this process deferred on it were due; they run now",
			"key", key, "tasks", n)
	}
}

// roundUp stretches d so that now+d falls on a whole second: asynq scores
// delayed tasks in whole seconds and runs them once that second has begun, so
// a task is never brought back before the time it was given.
func (m *middleware) roundUp(d time.Duration) time.Duration {
	return m.until(m.now().Add(d))
}

// until returns the delay that brings a task back at the first whole second
// at or after at (measured on one reading of the clock).
func (m *middleware) until(at time.Time) time.Duration {
	now := m.now()
	if at.Before(now) {
		at = now
	}
	if t := at.Truncate(time.Second); t.Before(at) {
		at = t.Add(time.Second)
	}
	return at.Sub(now)
}

// deferTask makes t run again after delay without spending its retry budget.
// It reports whether it re-enqueued a copy, and the ID the task waits under
// in asynq.
func (m *middleware) deferTask(ctx context.Context, t *asynq.Task, key string, delay time.Duration, why string) (copied bool, waitingAs string, err error) {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, hasMax := asynq.GetMaxRetry(ctx)
	if deferral.Marked(ctx) && hasMax && retried < maxRetry {
		// asynq's retry path: atomic, same task ID, retry count untouched.
		return false, id, &deferral.Error{Key: key, Reason: why, Delay: delay, Until: m.now().Add(delay)}
	}
	copyID, err := m.l.tasks.enqueueCopy(ctx, t, key, why, delay)
	if err != nil {
		m.l.o.logger.Error("throttle: cannot re-enqueue a deferred task", "key", key, "task_id", id, "err", err)
		return false, id, err
	}
	return true, copyID, nil
}

func isDeferral(err error) bool {
	_, ok := deferral.As(err)
	return ok
}

func (m *middleware) observe(ev Event) {
	if fs := m.l.onEvent.Load(); fs != nil {
		for _, f := range *fs {
			f(ev)
		}
	}
}

// suspension is a suspension Redis told this process without a reserved
// time to offer: until then every task of the key gets the same answer, so it is
// deferred to retryAt without asking again (see suspensionCacheMax). Tasks
// it deferred are parked with it.
type suspension struct {
	until, retryAt time.Time
	local          bool // Redis could not be told: nothing to check there
	parked         []parkedTask
}

func (ks *keyState) noLimits(now time.Time) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return now.Before(ks.noLimitsUntil)
}

func (ks *keyState) setNoLimits(until time.Time) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.noLimitsUntil = until
}

func (ks *keyState) forgetNoLimits() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.noLimitsUntil = time.Time{}
}

// warnOnce reports true the first time it is called for the key's state.
func (ks *keyState) warnOnce() bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	first := !ks.warned
	ks.warned = true
	return first
}

// suspendedUntil returns the time a cached suspension defers tasks to, while
// the cache holds.
func (ks *keyState) suspendedUntil(now time.Time) (time.Time, bool) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if s := ks.susp; s != nil && now.Before(s.until) {
		return s.retryAt, true
	}
	return time.Time{}, false
}

// cacheSuspension remembers that the key is suspended for d from now
// (local: known to this process only, Redis could not be told).
func (ks *keyState) cacheSuspension(now time.Time, d time.Duration, local bool) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.susp = &suspension{until: now.Add(min(d, suspensionCacheMax)), retryAt: now.Add(d), local: local}
}

func (ks *keyState) forgetSuspension() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.susp != nil {
		ks.susp.until = time.Time{}
	}
}

// park remembers a task deferred on the current cached suspension. It
// returns the suspension when the task is its first (the caller schedules
// the check), else nil.
func (ks *keyState) park(p parkedTask) *suspension {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	s := ks.susp
	if s == nil || s.local || len(s.parked) >= maxParked {
		return nil
	}
	s.parked = append(s.parked, p)
	if len(s.parked) == 1 {
		return s
	}
	return nil
}

// unpark takes the tasks parked on s.
func (ks *keyState) unpark(s *suspension) []parkedTask {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	p := s.parked
	s.parked = nil
	return p
}
