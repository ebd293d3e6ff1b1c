package throttle

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Defaults of the options; each With* doc names the one it changes.
const (
	// DefaultTimeout bounds every Redis call of a decision.
	DefaultTimeout = time.Second
	// DefaultIdleExpiry is how long a key's limits stay in Redis without any
	// call; every decision refreshes it.
	DefaultIdleExpiry = 7 * 24 * time.Hour
	// DefaultMaxSuspension caps one suspension, so that a bogus Retry-After
	// (a year, say) cannot stop a provider for good.
	DefaultMaxSuspension = time.Hour
	// DefaultSuspension is used for a 429 that does not say how long to wait.
	DefaultSuspension = 5 * time.Second
	// DefaultHorizon is how far ahead the middleware reserves slots for denied
	// tasks. A backlog deeper than Horizon x rate waits without a slot and
	// reserves one once it is within the horizon.
	DefaultHorizon = time.Minute
	// DefaultLapse is how long a reservation is kept after its slot for a task
	// that has not come back (deleted, or its worker down).
	DefaultLapse = 5 * time.Minute
	// DefaultLease is the most tokens one middleware decision may take for
	// its process while the bucket is far from empty (see WithLease).
	DefaultLease = 64
	// DefaultLeaseFor is how long leased tokens stay usable.
	DefaultLeaseFor = 50 * time.Millisecond
	// DefaultFailureDelay is how long a task is deferred when Redis cannot
	// decide (FailClosed).
	DefaultFailureDelay = 5 * time.Second
	// DefaultSlotLease is how long a slot of an InFlight limit is held
	// without renewal (asynq's own task lease is 30 s).
	DefaultSlotLease = 30 * time.Second
	// DefaultLearnFor is how long a quota learned from a provider's
	// response (Observe) stays in force without the provider saying it
	// again; then the key is back to its configured limits.
	DefaultLearnFor = 10 * time.Minute
	// DefaultHeadroom is the dispatch jitter the middleware keeps room for:
	// a task's call may reach the provider up to this much later than
	// another's, relative to their decisions, without the provider seeing
	// its quota exceeded.
	DefaultHeadroom = 20 * time.Millisecond
	// Granule is asynq's scheduling granularity: delayed tasks are scored in
	// whole seconds.
	Granule = time.Second
)

// FailurePolicy says what the middleware does with a task when Redis cannot
// make a decision (unreachable, timed out, invalid config).
type FailurePolicy int

const (
	// FailClosed defers the task (by WithFailureDelay plus jitter). Nothing
	// runs above the limit while Redis is down. This is the default.
	FailClosed FailurePolicy = iota
	// FailOpen runs the task unthrottled: availability over the quota.
	FailOpen
)

// String names the policy for logs.
func (p FailurePolicy) String() string {
	if p == FailOpen {
		return "fail open"
	}
	return "fail closed"
}

// Option configures a Limiter or the ByProvider middleware. Options that only
// concern the middleware are ignored by NewLimiter. An invalid option makes
// NewLimiter and ByProvider panic, naming it (see CheckOptions).
type Option func(*options)

type options struct {
	prefix        string
	timeout       time.Duration
	idleExpiry    time.Duration
	maxSuspension time.Duration
	defaults      []Limit
	keyDefaults   map[string][]Limit
	defaultTiers  []lua.Tier            // defaults, validated
	keyTiers      map[string][]lua.Tier // keyDefaults, validated
	taskRedis     redis.UniversalClient // where the tasks live, when not rdb

	// middleware only
	keyFunc        func(*asynq.Task) string
	horizon        time.Duration
	lapse          time.Duration
	jitterMin      time.Duration
	jitterMax      time.Duration
	jitterFraction float64
	jitterSource   rand.Source
	failure        FailurePolicy
	failureDelay   time.Duration
	defaultSuspend time.Duration
	lease          int
	leaseFor       time.Duration
	headroom       time.Duration
	pacing         bool
	slotLease      time.Duration
	learnFor       time.Duration
	logger         *slog.Logger
	observer       func(Event)
	deferralClient *asynq.Client

	err error // the first invalid option

	warned *onceSet // warnings logged once per process (per Limiter)
}

func newOptions(opts []Option) options {
	o := options{
		prefix:         DefaultPrefix,
		timeout:        DefaultTimeout,
		idleExpiry:     DefaultIdleExpiry,
		maxSuspension:  DefaultMaxSuspension,
		horizon:        DefaultHorizon,
		lapse:          DefaultLapse,
		jitterMin:      0,
		jitterMax:      10 * time.Second,
		jitterFraction: 0.1,
		failure:        FailClosed,
		failureDelay:   DefaultFailureDelay,
		defaultSuspend: DefaultSuspension,
		lease:          DefaultLease,
		leaseFor:       DefaultLeaseFor,
		headroom:       DefaultHeadroom,
		pacing:         true,
		slotLease:      DefaultSlotLease,
		learnFor:       DefaultLearnFor,
		logger:         slog.Default(),
		warned:         &onceSet{},
	}
	for _, opt := range opts {
		opt(&o)
	}
	o.err = o.validate()
	return o
}

// validate names the first option whose value cannot work, and converts
// the default limits for the scripts.
func (o *options) validate() error {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("throttle: option %s(%v): %s", opt, v, why)
	}
	switch {
	case o.prefix == "" || strings.ContainsAny(o.prefix, "{}"):
		return bad("WithPrefix", fmt.Sprintf("%q", o.prefix), "must be non-empty, without '{' or '}'")
	case o.idleExpiry < time.Millisecond:
		return bad("WithIdleExpiry", o.idleExpiry, "must be at least 1ms (limits would expire at once)")
	case o.maxSuspension < time.Millisecond:
		return bad("WithMaxSuspension", o.maxSuspension, "must be at least 1ms")
	case o.timeout < 0:
		return bad("WithTimeout", o.timeout, "must be >= 0 (0: no deadline of its own)")
	case o.horizon < 0:
		return bad("WithReservations", o.horizon, "must be >= 0 (0: off)")
	case o.jitterMin < 0 || o.jitterMax < o.jitterMin || o.jitterFraction < 0 || o.jitterFraction != o.jitterFraction:
		return bad("WithJitter", fmt.Sprintf("%v, %v, %v", o.jitterMin, o.jitterMax, o.jitterFraction), "want 0 <= min <= max and fraction >= 0")
	case o.failure != FailClosed && o.failure != FailOpen:
		return bad("WithFailurePolicy", int(o.failure), "must be FailClosed or FailOpen")
	case o.failureDelay <= 0:
		return bad("WithFailureDelay", o.failureDelay, "must be > 0")
	case o.defaultSuspend <= 0:
		return bad("WithDefaultSuspension", o.defaultSuspend, "must be > 0")
	case o.lease < 0 || o.lease > MaxLease:
		return bad("WithLease", o.lease, fmt.Sprintf("must be from 0 to %d", MaxLease))
	case o.leaseFor < 0:
		return bad("WithLease", o.leaseFor, "the lease time must be >= 0")
	case o.headroom < 0 || o.headroom > time.Second:
		return bad("WithHeadroom", o.headroom, "must be from 0 to 1s")
	case o.slotLease < 100*time.Millisecond || o.slotLease > time.Hour:
		return bad("WithSlotLease", o.slotLease, "must be from 100ms to 1h")
	case o.learnFor < time.Second || o.learnFor > MaxPer:
		return bad("WithLearnFor", o.learnFor, fmt.Sprintf("must be from 1s to %v", MaxPer))
	case o.logger == nil:
		return bad("WithLogger", nil, "must not be nil")
	}
	if len(o.defaults) > 0 {
		tiers, err := validateLimits(o.defaults)
		if err != nil {
			return fmt.Errorf("throttle: option WithDefaultLimits: %w", err)
		}
		o.defaultTiers = tiers
	}
	for key, limits := range o.keyDefaults {
		if err := ValidateKey(key); err != nil {
			return fmt.Errorf("throttle: option WithKeyLimits(%q): %w", key, err)
		}
		tiers, err := validateLimits(limits)
		if err != nil {
			return fmt.Errorf("throttle: option WithKeyLimits(%q): %w", key, err)
		}
		if o.keyTiers == nil {
			o.keyTiers = make(map[string][]lua.Tier)
		}
		o.keyTiers[key] = tiers
	}
	return nil
}

// WithPrefix sets the prefix of every Redis key (default DefaultPrefix,
// "throttle"). Processes that share limits must use the same prefix.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithTimeout bounds how long every call of the Limiter (a decision, as
// Take, Reserve and the middleware make, and SetLimits, Suspend, Inspect,
// ...) waits for Redis (default DefaultTimeout, 1 s): past it the call
// fails with context.DeadlineExceeded, whatever the client's own timeouts,
// and the middleware applies its failure policy. A Redis that refuses
// connections is named in the error ("cannot reach Redis at ...: connection
// refused"); while it keeps refusing, calls fail at once. Zero sets no
// bound of its own (the caller's context and the client's read/write
// timeouts still apply).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithIdleExpiry sets how long a key's limits stay in Redis with no call at
// all (default DefaultIdleExpiry, 7 days). Every decision refreshes it.
// Buckets themselves expire as soon as they are full again.
func WithIdleExpiry(d time.Duration) Option { return func(o *options) { o.idleExpiry = d } }

// WithMaxSuspension caps a single suspension (default DefaultMaxSuspension,
// 1 hour).
func WithMaxSuspension(d time.Duration) Option { return func(o *options) { o.maxSuspension = d } }

// WithDefaultLimits sets the limits of every key that has none in Redis (no
// default: such keys get ErrNoLimits from Take and run unthrottled under the
// middleware, with one warning per key; the middleware asks Redis again after
// 5 s, so limits set later apply within 5 s). Limits set in Redis by
// SetLimits win.
func WithDefaultLimits(limits ...Limit) Option {
	return func(o *options) { o.defaults = limits }
}

// WithKeyLimits sets the default limits of one key; they win over
// WithDefaultLimits, and limits set in Redis by SetLimits win over both.
func WithKeyLimits(key string, limits ...Limit) Option {
	return func(o *options) {
		if o.keyDefaults == nil {
			o.keyDefaults = make(map[string][]Limit)
		}
		o.keyDefaults[key] = limits
	}
}

// WithKeyFunc sets how the middleware finds the key of a task that has no Key
// header (default: the task type up to its first ':', so "slack:sync" is
// throttled as "slack"). Return "" to run the task unthrottled. A key
// that is not valid (see ValidateKey) is a bug the middleware reports by
// failing the task without retry (asynq.SkipRetry), logged at Error.
func WithKeyFunc(f func(*asynq.Task) string) Option { return func(o *options) { o.keyFunc = f } }

// WithReservations sets how far ahead the middleware reserves a run slot for a
// denied task (default DefaultHorizon, 1 minute). A task with a slot is
// admitted when it comes back instead of contending again, so a backlog drains
// with about one deferral per task. Zero turns reservations off: denied tasks
// simply retry after the retry-after (plus jitter).
func WithReservations(horizon time.Duration) Option {
	return func(o *options) { o.horizon = horizon }
}

// WithJitter bounds the random delay added to a deferral that has no reserved
// slot: between min and max, and fraction of the retry-after in between
// (defaults 0, 10 s and 0.1). Jitter is only ever added, never subtracted.
func WithJitter(min, max time.Duration, fraction float64) Option {
	return func(o *options) { o.jitterMin, o.jitterMax, o.jitterFraction = min, max, fraction }
}

// WithJitterSource sets the random source of the jitter (default: randomly
// seeded). Tests pass a seeded source.
func WithJitterSource(src rand.Source) Option { return func(o *options) { o.jitterSource = src } }

// MaxLease bounds WithLease.
const MaxLease = 1000

// WithLease lets one middleware decision take up to n tokens when every tier
// of the key still holds at least as many more: the process hands the extra
// ones to its next tasks of that key within d, without asking Redis, and
// drops what it has not used by then (defaults DefaultLease, 64, and
// DefaultLeaseFor, 50 ms). The size a process asks for adapts per key: it
// starts at 8 (or n, if smaller), doubles up to n each time a lease is used
// up before it expires, and halves when leased tokens expire unused or the
// bucket was too low to grant one. The tokens are taken in Redis, so the
// fleet-wide bound holds; near the limit no lease is granted and every task
// asks. A lease trades a little precision (unused leased tokens are lost)
// for far fewer Redis calls on a busy key. n of 0 or 1 turns it off. A key
// with a Window tier is never leased: an unused leased call would be lost
// for a whole window there.
func WithLease(n int, d time.Duration) Option {
	return func(o *options) { o.lease, o.leaseFor = n, d }
}

// WithHeadroom sets the dispatch jitter the middleware keeps room for
// (default DefaultHeadroom, 20 ms): a task is admitted only when every tier
// would still admit it d later, so that calls reaching the provider up to d
// apart from their decisions never find its quota short, and a limit set to
// exactly the provider's published quota draws no 429 from it. It costs a
// token bucket rate x d tokens of its burst, and a window d of its length;
// a backlog still drains at the rate (a key whose burst cannot absorb a
// second of its rate plus d is paced, see WithPacing), except where every
// call needs the whole burst (a burst of 1, or a Cost equal to the burst):
// each then waits d after the one before, 1/(1/rate + d) calls per second.
// 0 turns it off. Limiter.Take keeps the exact bucket unless asked
// (Headroom).
func WithHeadroom(d time.Duration) Option { return func(o *options) { o.headroom = d } }

// WithSlotLease sets how long a slot of an InFlight limit is held without
// renewal (default DefaultSlotLease, 30 s, as asynq's own task lease). The
// middleware renews the slots of running handlers every third of it, so a
// slow but live handler keeps its slot however long it runs, and a worker
// killed mid-task gives its slots back at most d later.
func WithSlotLease(d time.Duration) Option { return func(o *options) { o.slotLease = d } }

// WithLearnFor sets how long a quota learned from a provider's response
// (Observe) stays in force without the provider saying it again (default
// DefaultLearnFor, 10 minutes; at least two of the tier's periods). After
// that quiet period the key is back to its configured limits.
func WithLearnFor(d time.Duration) Option { return func(o *options) { o.learnFor = d } }

// WithPacing sets whether the middleware paces a backlog inside each second
// (default true). asynq brings deferred tasks back on whole seconds, so
// without pacing a limit whose burst is below its rate per second drains at
// burst per second: 220 tasks under 40/s burst 5 take 44 s, not 5.5. With
// pacing, reserved slots are exact instants; a task comes back on the whole
// second before its slot and its worker waits for the slot (at most about
// a second, never busy) before running it, so the backlog drains at the
// rate and every second stays within the bound. Keys whose bursts cover a
// second of their rate are not paced (nothing to gain).
func WithPacing(on bool) Option { return func(o *options) { o.pacing = on } }

// WithFailurePolicy sets what the middleware does when Redis cannot decide
// (default FailClosed).
func WithFailurePolicy(p FailurePolicy) Option { return func(o *options) { o.failure = p } }

// WithFailureDelay sets how long FailClosed defers a task (default
// DefaultFailureDelay, 5 s, plus jitter).
func WithFailureDelay(d time.Duration) Option { return func(o *options) { o.failureDelay = d } }

// WithDefaultSuspension sets the suspension for a RateLimited error that does
// not say how long (default DefaultSuspension, 5 s).
func WithDefaultSuspension(d time.Duration) Option {
	return func(o *options) { o.defaultSuspend = d }
}

// WithLogger sets the middleware's logger (default slog.Default()).
// Deferrals log at Debug, suspensions at Warn, Redis failures at Error.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithObserver registers a function called once per middleware decision, for
// metrics and progress displays. It runs on the worker goroutine: keep it fast.
func WithObserver(f func(Event)) Option { return func(o *options) { o.observer = f } }

// WithTaskRedis names the Redis where the asynq tasks live, when it is not
// the one that holds the limits (default: the limiter's). The middleware
// re-enqueues copies of deferred tasks there when the retry path cannot be
// used, and looks tasks up there (a copy that already exists, tasks to bring
// back after Resume).
func WithTaskRedis(rdb redis.UniversalClient) Option { return func(o *options) { o.taskRedis = rdb } }

// WithClient sets the asynq client the middleware uses to re-enqueue a copy of
// a deferred task when the retry path cannot be used (default: a client on
// the tasks' Redis, see WithTaskRedis).
//
// Deprecated: use WithTaskRedis, which also lets the middleware look tasks
// up. With WithClient alone, tasks are looked up in the limiter's Redis.
func WithClient(c *asynq.Client) Option { return func(o *options) { o.deferralClient = c } }
