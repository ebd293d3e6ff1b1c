package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
	"github.com/asynq-throttle/asynq-throttle/internal/jitter"
	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Outcome is what the middleware did with one task.
type Outcome int

const (
	// Ran: a token was taken and the handler ran.
	Ran Outcome = iota
	// Deferred: refused; the task will run later.
	Deferred
	// Suspended: the handler reported a rate limit; the key was suspended
	// fleet-wide and the task deferred.
	Suspended
	// Unthrottled: the task has no key, or its key has no limits; the
	// handler ran without a decision.
	Unthrottled
	// Failed: Redis could not decide; the failure policy applied (Event.Ran
	// tells whether the handler ran).
	Failed
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
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Event describes one middleware decision, for WithObserver.
type Event struct {
	Key      string
	TaskID   string
	TaskType string
	Outcome  Outcome
	// Reason is the refusal's reason when Deferred.
	Reason Reason
	// Delay is how long a Deferred or Suspended task waits.
	Delay time.Duration
	// Reserved reports that the deferred task holds a reserved slot.
	Reserved bool
	// Leased reports that the task ran on a token its process had leased,
	// without a decision in Redis.
	Leased bool
	// Copied reports that the deferral re-enqueued a copy of the task (the
	// path used outside worker.NewServer and on a task's last attempt).
	Copied bool
	// Ran reports whether the handler ran.
	Ran bool
	// Err is the Redis error of a Failed decision.
	Err error
	// Latency is how long the decision in Redis took; 0 when none was
	// asked (a leased token, a cached suspension or "no limits", no key).
	// A Suspended event repeats the Latency of its task's Ran event.
	Latency time.Duration
}

// ByProvider returns an asynq middleware that throttles every task by its key
// (see Key, WithKeyFunc) with limits shared through rdb by every process:
//
//	mux.Use(throttle.ByProvider(rdb))
//
// Before the handler runs it makes one decision in Redis. When allowed, the
// handler runs. When refused, the handler does not run: the task is deferred
// to run after the retry-after, and the worker goroutine is free at once. A
// handler error wrapping RateLimited suspends the key fleet-wide.
//
// Use it in a server built by worker.NewServer: deferrals then keep the task's
// ID and retry count and count as neither processed nor failed. In a plain
// asynq.Server (and on a task's last allowed attempt, which asynq would
// archive) the task is deferred by enqueueing a copy with a new ID and
// finishing the original, which asynq counts as processed.
func ByProvider(rdb redis.UniversalClient, opts ...Option) asynq.MiddlewareFunc {
	return NewLimiter(rdb, opts...).Middleware()
}

// Middleware returns the ByProvider middleware of l.
func (l *Limiter) Middleware() asynq.MiddlewareFunc {
	m := &middleware{
		l:      l,
		jitter: jitter.New(l.o.jitterSource, l.o.jitterMin, l.o.jitterMax, l.o.jitterFraction),
		client: l.o.deferralClient,
		now:    time.Now,
	}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			return m.process(ctx, t, next)
		})
	}
}

type middleware struct {
	l          *Limiter
	jitter     *jitter.Jitter
	now        func() time.Time
	clientOnce sync.Once
	client     *asynq.Client
	warned     sync.Map // key -> struct{}: "no limits" logged once per key
	// suspended remembers, per key, a suspension that Redis answered without
	// a reserved slot: until then every task of the key gets the same answer,
	// so it is deferred without asking again (see suspensionCacheMax).
	suspended sync.Map // key -> suspendedUntil
	// unlimited remembers, per key, that Redis had no limits for it: its
	// tasks run without asking again until then (see noLimitsCacheFor).
	unlimited sync.Map // key -> time.Time
	// leases holds, per key, tokens a decision took for this process.
	leases sync.Map // key -> *lease
}

// lease is tokens taken in Redis for this process, handed out to its next
// tasks of one key until they run out or expire. size is how many the next
// decision of the key asks for: it doubles (up to the WithLease maximum)
// when a lease is used up before it expires, and halves when leased tokens
// expire unused or a decision far enough from the limit to ask got none.
type lease struct {
	mu    sync.Mutex
	n     int
	until time.Time
	size  int
}

// leaseStart is the size a key's first lease asks for.
const leaseStart = 8

// request returns how many tokens the next decision of the key asks for.
func (l *lease) request(max int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size == 0 {
		l.size = min(leaseStart, max)
	}
	return l.size
}

// add records an allowed decision that asked for asked tokens and got n
// extra ones, valid for d. Tokens of an expired lease are dropped.
func (l *lease) add(asked, n int, now time.Time, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(l.until) {
		if l.n > 0 {
			l.size = max(l.size/2, 2) // more than this process used in time
		}
		l.n = 0
	}
	if n == 0 && asked > 1 {
		l.size = max(min(l.size, asked/2), 2) // the bucket held too few for asked
	}
	if n > 0 {
		l.n += n
		l.until = now.Add(d)
	}
}

// take hands out one leased token, if any is left and still valid. The last
// one makes the next lease of the key twice as large, up to max.
func (l *lease) take(now time.Time, max int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n <= 0 || !now.Before(l.until) {
		return false
	}
	l.n--
	if l.n == 0 {
		l.size = min(2*l.size, max)
	}
	return true
}

// noLimitsCacheFor is how long a process trusts "this key has no limits":
// limits set later with SetLimits reach it within this time.
const noLimitsCacheFor = 5 * time.Second

// suspendedUntil is a cached suspension: ask Redis again at until (local
// clock); tasks before it are deferred to retryAt.
type suspendedUntil struct{ until, retryAt time.Time }

// suspensionCacheMax bounds how long a process trusts a cached suspension,
// so that an operator's Resume reaches every process within it.
const suspensionCacheMax = 5 * time.Second

func (m *middleware) process(ctx context.Context, t *asynq.Task, next asynq.Handler) error {
	o := &m.l.o
	key, err := o.keyOf(t)
	if err != nil {
		return err
	}
	id, _ := asynq.GetTaskID(ctx)
	ev := Event{Key: key, TaskID: id, TaskType: t.Type()}
	if key == "" {
		ev.Outcome, ev.Ran = Unthrottled, true
		m.observe(ev)
		return next.ProcessTask(ctx, t)
	}

	if v, ok := m.unlimited.Load(key); ok {
		if m.now().Before(v.(time.Time)) {
			ev.Outcome, ev.Ran = Unthrottled, true
			m.observe(ev)
			return next.ProcessTask(ctx, t)
		}
		m.unlimited.Delete(key)
	}
	if v, ok := m.suspended.Load(key); ok {
		now := m.now()
		if su := v.(suspendedUntil); now.Before(su.until) {
			return m.deferDecision(ctx, t, key, Decision{RetryAfter: su.retryAt.Sub(now), Reason: RefusedBySuspension}, ev, Deferred)
		}
		m.suspended.Delete(key)
	}

	var ls *lease
	if o.lease > 1 && o.leaseFor > 0 {
		v, ok := m.leases.Load(key)
		if !ok {
			v, _ = m.leases.LoadOrStore(key, &lease{})
		}
		ls = v.(*lease)
		if ls.take(m.now(), o.lease) {
			return m.run(ctx, t, next, key, id, ev, true)
		}
	}

	asked := 0
	if ls != nil {
		asked = ls.request(o.lease)
	}
	start := time.Now()
	d, err := m.decide(ctx, key, t, id, asked)
	ev.Latency = time.Since(start)
	if err == nil && d.Allowed && ls != nil {
		ls.add(asked, d.Lease, m.now(), o.leaseFor)
	}
	if err == nil && !d.Allowed && !d.Reserved && d.Reason == RefusedBySuspension {
		now := m.now()
		m.suspended.Store(key, suspendedUntil{
			until:   now.Add(min(d.RetryAfter, suspensionCacheMax)),
			retryAt: now.Add(d.RetryAfter),
		})
	}
	switch {
	case errors.Is(err, ErrNoLimits):
		m.unlimited.Store(key, m.now().Add(noLimitsCacheFor))
		if _, seen := m.warned.LoadOrStore(key, struct{}{}); !seen {
			o.logger.Warn("throttle: key has no limits, running its tasks unthrottled; call SetLimits or use WithDefaultLimits",
				"key", key, "task_type", t.Type())
		}
		ev.Outcome, ev.Ran = Unthrottled, true
		m.observe(ev)
		return next.ProcessTask(ctx, t)
	case err != nil:
		ev.Outcome, ev.Err = Failed, err
		if o.failure == FailOpen {
			o.logger.Error("throttle: cannot decide, running task unthrottled (fail open)", "key", key, "task_id", id, "err", err)
			ev.Ran = true
			m.observe(ev)
			return next.ProcessTask(ctx, t)
		}
		delay := m.roundUp(m.jitter.Add(o.failureDelay))
		o.logger.Error("throttle: cannot decide, deferring task (fail closed)", "key", key, "task_id", id, "retry_in", delay, "err", err)
		ev.Delay = delay
		var derr error
		ev.Copied, derr = m.deferTask(ctx, t, key, delay, "redis unavailable")
		m.observe(ev)
		return derr
	case !d.Allowed:
		return m.deferDecision(ctx, t, key, d, ev, Deferred)
	}

	return m.run(ctx, t, next, key, id, ev, false)
}

// run runs the handler of an admitted task, and turns a RateLimited error
// into a fleet-wide suspension of its key.
func (m *middleware) run(ctx context.Context, t *asynq.Task, next asynq.Handler, key, id string, ev Event, leased bool) error {
	o := &m.l.o
	ev.Outcome, ev.Ran, ev.Leased = Ran, true, leased
	m.observe(ev)
	herr := next.ProcessTask(ctx, t)
	var rl *RateLimitedError
	if !errors.As(herr, &rl) {
		return herr
	}
	m.leases.Delete(key) // the provider disagrees: lease no more tokens
	// The provider said "too many requests": stop the whole fleet.
	wait := rl.RetryAfter
	if wait <= 0 {
		wait = o.defaultSuspend
	}
	left, err := m.l.suspend(ctx, key, wait)
	if err != nil {
		o.logger.Error("throttle: cannot suspend key after a rate limit, deferring the task", "key", key, "err", err)
		left = wait
	} else {
		o.logger.Warn("throttle: provider rate limited a task, key suspended fleet-wide", "key", key, "task_id", id, "suspended_for", left)
	}
	d, err := m.decide(ctx, key, t, id, 0)
	if err != nil || d.Allowed {
		// Without a decision (or with a token that appeared), wait out the
		// suspension spread by jitter.
		d = Decision{RetryAfter: left, Reason: RefusedBySuspension}
	}
	return m.deferDecision(ctx, t, key, d, ev, Suspended)
}

// decide asks Redis for a decision on t; lease is how many tokens it may
// take for this process (0: one).
func (m *middleware) decide(ctx context.Context, key string, t *asynq.Task, id string, lease int) (Decision, error) {
	a := lua.DecideArgs{Granule: Granule, Lease: lease}
	if origin := t.Headers()[HeaderOrigin]; origin != "" {
		id = origin
	}
	if m.l.o.horizon > 0 && id != "" {
		a.TaskID, a.Horizon = id, m.l.o.horizon
	}
	return m.l.decide(ctx, key, a)
}

// deferDecision defers a refused task: a task with a reserved slot comes back
// right after it; others get jitter so a crowd does not come back at once.
func (m *middleware) deferDecision(ctx context.Context, t *asynq.Task, key string, d Decision, ev Event, out Outcome) error {
	var delay time.Duration
	if d.Reserved {
		// Aim at the slot itself (a whole second of the Redis clock), not at
		// now+RetryAfter: the reply's travel time would push the task past
		// the boundary and cost it a whole second.
		delay = m.until(d.Slot)
	} else {
		delay = m.roundUp(m.jitter.Add(d.RetryAfter))
	}
	ev.Outcome, ev.Reason, ev.Delay, ev.Reserved = out, d.Reason, delay, d.Reserved
	m.l.o.logger.Debug("throttle: task deferred", "key", key, "task_id", ev.TaskID, "reason", d.Reason, "retry_in", delay, "reserved", d.Reserved)
	var err error
	ev.Copied, err = m.deferTask(ctx, t, key, delay, d.Reason.String())
	m.observe(ev)
	return err
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
// It reports whether it re-enqueued a copy.
func (m *middleware) deferTask(ctx context.Context, t *asynq.Task, key string, delay time.Duration, why string) (bool, error) {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, hasMax := asynq.GetMaxRetry(ctx)
	if deferral.Marked(ctx) && hasMax && retried < maxRetry {
		// asynq's retry path: atomic, same task ID, retry count untouched.
		return false, &deferral.Error{Key: key, Reason: why, Delay: delay}
	}
	return true, m.enqueueCopy(ctx, t, delay, maxRetry, hasMax)
}

// enqueueCopy re-enqueues t to run after delay and lets the original finish.
// The copy's ID is derived from the original's, so doing it twice (a crash
// between enqueue and finish) finds the first copy instead of making another.
func (m *middleware) enqueueCopy(ctx context.Context, t *asynq.Task, delay time.Duration, maxRetry int, hasMax bool) error {
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	headers := make(map[string]string, len(t.Headers())+2)
	for k, v := range t.Headers() {
		headers[k] = v
	}
	origin := headers[HeaderOrigin]
	if origin == "" {
		origin = id
		headers[HeaderOrigin] = id
	}
	n, _ := strconv.Atoi(headers[HeaderDeferrals])
	n++
	headers[HeaderDeferrals] = strconv.Itoa(n)
	opts := []asynq.Option{asynq.ProcessIn(delay), asynq.TaskID(origin + "~throttle-" + strconv.Itoa(n))}
	if queue != "" {
		opts = append(opts, asynq.Queue(queue))
	}
	if hasMax {
		opts = append(opts, asynq.MaxRetry(maxRetry))
	}
	m.clientOnce.Do(func() {
		if m.client == nil {
			m.client = asynq.NewClientFromRedisClient(m.l.rdb)
		}
	})
	_, err := m.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers), opts...)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("throttle: cannot re-enqueue deferred task %s: %w", id, err)
	}
	return nil
}

func (m *middleware) observe(ev Event) {
	if f := m.l.o.observer; f != nil {
		f(ev)
	}
}
