package throttle

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// Option configures a Limiter and its middleware. An invalid option makes
// NewLimiter and ByProvider panic, naming it: options are the program's, and
// a wrong one is caught at start, never as a task stalled at run time.
type Option func(*options)

// The defaults; each With* doc states the one it changes
// (TestOptionDocsStateTheDefaults compares the two).
const (
	defaultTimeout       = time.Second
	defaultMaxSuspension = time.Hour
	defaultSuspension    = 5 * time.Second // a 429 that does not say how long
	defaultHorizon       = time.Minute
	defaultLapse         = 5 * time.Minute // a reservation kept after its time
	defaultLease         = 64
	defaultLeaseFor      = 50 * time.Millisecond
	defaultFailureDelay  = 5 * time.Second
	defaultSlotExpiry    = 30 * time.Second
	defaultLearnFor      = 10 * time.Minute
	defaultHeadroom      = 20 * time.Millisecond
	maxLease             = 1000
	// granule is asynq's scheduling granularity: delayed tasks are scored
	// in whole seconds.
	granule = time.Second
)

type options struct {
	prefix        string
	timeout       time.Duration
	maxSuspension time.Duration
	defaults      []Limit
	defaultTiers  []lua.Tier            // defaults, validated
	taskRedis     redis.UniversalClient // where the tasks live, when not rdb

	// the middleware's
	keyFunc        func(*asynq.Task) string
	horizon        time.Duration
	lapse          time.Duration
	failOpen       bool
	failureDelay   time.Duration
	defaultSuspend time.Duration
	lease          int
	leaseFor       time.Duration
	headroom       time.Duration
	pacing         bool
	slotExpiry     time.Duration
	learnFor       time.Duration
	logger         *slog.Logger
	dialects       map[string]func(*http.Response) (Limit, time.Duration) // WithDialect, by lower-case name
	dialectErr     error                                                  // the first invalid WithDialect

	err error // the first invalid option

	warned *onceSet // warnings logged once per process (per Limiter)
}

func newOptions(opts []Option) options {
	o := options{
		prefix:         keyspace.DefaultPrefix,
		timeout:        defaultTimeout,
		maxSuspension:  defaultMaxSuspension,
		horizon:        defaultHorizon,
		lapse:          defaultLapse,
		failureDelay:   defaultFailureDelay,
		defaultSuspend: defaultSuspension,
		lease:          defaultLease,
		leaseFor:       defaultLeaseFor,
		headroom:       defaultHeadroom,
		pacing:         true,
		slotExpiry:     defaultSlotExpiry,
		learnFor:       defaultLearnFor,
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
	case o.maxSuspension < time.Millisecond:
		return bad("WithMaxSuspension", o.maxSuspension, "must be at least 1ms")
	case o.timeout < 0:
		return bad("WithTimeout", o.timeout, "must be >= 0 (0: no deadline of its own)")
	case o.horizon < 0:
		return bad("WithReservationHorizon", o.horizon, "must be >= 0 (0: no reservations)")
	case o.failureDelay <= 0:
		return bad("WithFailureDelay", o.failureDelay, "must be > 0")
	case o.lease < 0 || o.lease > maxLease:
		return bad("WithLease", o.lease, fmt.Sprintf("must be from 0 to %d", maxLease))
	case o.leaseFor < 0:
		return bad("WithLease", o.leaseFor, "the lease time must be >= 0")
	case o.headroom < 0 || o.headroom > time.Second:
		return bad("WithHeadroom", o.headroom, "must be from 0 to 1s")
	case o.slotExpiry < 100*time.Millisecond || o.slotExpiry > time.Hour:
		return bad("WithSlotExpiry", o.slotExpiry, "must be from 100ms to 1h")
	case o.logger == nil:
		return bad("WithLogger", nil, "must not be nil")
	case o.dialectErr != nil:
		return o.dialectErr
	}
	if len(o.defaults) > 0 {
		tiers, err := validateLimits(o.defaults)
		if err != nil {
			return fmt.Errorf("throttle: option WithDefaultLimits: %w", err)
		}
		o.defaultTiers = tiers
	}
	return nil
}

// WithPrefix sets the prefix of every Redis key the Limiter writes (default
// "throttle"). Processes that share limits must use the same prefix.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithTimeout bounds how long a call waits for Redis (default 1s): past it a
// decision fails with an error wrapping context.DeadlineExceeded, whatever
// the client's own timeouts, pool wait and redial included, and the
// middleware applies its failure policy (see WithFailOpen). Zero sets no
// bound of its own (the caller's context and the client's timeouts still
// apply).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithDefaultLimits sets the limits of every key that has none in Redis
// (default: none, and such keys get ErrNoLimits from Take and run
// unthrottled under the middleware, with one warning per key; the
// middleware asks Redis again after 5s, so limits set later apply within
// 5s). Limits set with SetLimits win. Giving every key a default is also
// how to keep a mistyped key ("slakc") from running unthrottled.
func WithDefaultLimits(limits ...Limit) Option {
	return func(o *options) { o.defaults = limits }
}

// WithKeyFunc sets how the middleware finds the key of a task that has no
// Key header (default: the task type up to its first ':', so "slack:sync"
// is throttled as "slack"). Return "" to run the task unthrottled; a key
// that ValidateKey refuses fails the task for good (Outcome Rejected).
func WithKeyFunc(f func(*asynq.Task) string) Option { return func(o *options) { o.keyFunc = f } }

// WithReservationHorizon sets how far ahead the middleware reserves a run
// time for a refused task (default 1m). A task with a reservation is
// admitted when it comes back instead of contending again, so a backlog
// drains with about one deferral per task; a task whose turn lies beyond
// the horizon is deferred until it can reserve one (another deferral).
// Zero turns reservations off: refused tasks simply retry after the
// retry-after (plus jitter).
func WithReservationHorizon(d time.Duration) Option {
	return func(o *options) { o.horizon = d }
}

// WithLease lets one middleware decision take up to n tokens when every tier
// of the key still holds at least as many more: the process hands the
// extra ones to its next tasks of that key within d, without asking Redis,
// and drops what it has not used by then (defaults 64 and 50ms). The size
// a process asks for adapts per key: it starts at 8 (or n, if smaller),
// doubles up to n each time a lease is used up in time, and halves when
// leased tokens expire unused. The tokens are taken in Redis, so the
// fleet-wide bound holds; near the limit no lease is granted and every task
// asks. n of 0 or 1 turns it off; n is at most 1000. A key with a Window
// tier or an InFlight limit is never leased.
func WithLease(n int, d time.Duration) Option {
	return func(o *options) { o.lease, o.leaseFor = n, d }
}

// WithHeadroom sets the dispatch jitter the middleware keeps room for
// (default 20ms): a task is admitted only when every tier would still
// admit it d later, so that calls reaching the provider up to d apart from
// their decisions never find its quota short, and a limit set to exactly
// the provider's published quota draws no 429 from it. It costs a token
// bucket rate x d tokens of its burst, and a window d of its length; a
// backlog still drains at the rate (a key whose burst cannot absorb a
// second of its rate plus d is paced, see WithPacing), except where every
// call needs the whole burst (a burst of 1, or a Cost equal to the burst):
// each then waits d after the one before, 1/(1/rate + d) calls per second.
// 0 turns it off; d is at most 1s. Limiter.Take keeps the exact bucket.
func WithHeadroom(d time.Duration) Option { return func(o *options) { o.headroom = d } }

// WithPacing sets whether the middleware paces a backlog inside each second
// (default true). asynq brings deferred tasks back on whole seconds, so
// without pacing a limit whose burst is below its rate per second drains at
// burst per second: 220 tasks under 40/s burst 5 take 44 s, not 5.5. With
// pacing, reserved run times are exact instants; a task comes back on the
// whole second before its turn and its worker waits for it (at most about a
// second, never busy, never past the time the task needs before its
// deadline to be deferred instead), so the backlog drains at the rate.
// On a key with units (In) and without windows or tenants, a task of one
// key with the time to spare waits before it is admitted and asks again
// near its time (within 100ms), so its call does not hold the room that
// refunds make before that time.
// Keys whose bursts cover a second of their rate are not paced.
func WithPacing(on bool) Option { return func(o *options) { o.pacing = on } }

// WithFailOpen makes the middleware run a task unthrottled when Redis cannot
// decide (unreachable, timed out, invalid limits): availability over the
// quota. By default it fails closed: the task is deferred (see
// WithFailureDelay), and nothing runs above the limit while Redis is down.
func WithFailOpen() Option { return func(o *options) { o.failOpen = true } }

// WithFailureDelay sets how long a task is deferred when Redis cannot decide
// and the middleware fails closed (default 5s, plus jitter).
func WithFailureDelay(d time.Duration) Option { return func(o *options) { o.failureDelay = d } }

// WithMaxSuspension caps a single suspension (default 1h), from
// Limiter.Suspend or a handler's RateLimited, so that a bogus Retry-After (a
// year, say) cannot stop a provider for good.
func WithMaxSuspension(d time.Duration) Option { return func(o *options) { o.maxSuspension = d } }

// WithSlotExpiry sets how long a slot of an InFlight limit is held without
// renewal (default 30s, as asynq's own task lease). The middleware renews
// the slots of running handlers every third of it, so a slow but live
// handler keeps its slot however long it runs, and a worker killed mid-task
// gives its slots back at most d later. From 100ms to 1h.
func WithSlotExpiry(d time.Duration) Option { return func(o *options) { o.slotExpiry = d } }

// WithLogger sets the Limiter's logger (default slog.Default()). Deferrals
// log at Debug, suspensions and what Observe learns at Info or Warn, Redis
// failures at Error.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTaskRedis names the Redis where the asynq tasks live, when it is not
// the one that holds the limits (default: the Limiter's). The middleware
// re-enqueues copies of deferred tasks there when asynq's retry path cannot
// be used, and looks tasks up there (a copy that already exists, tasks to
// bring back after Resume or a change of limits).
func WithTaskRedis(rdb redis.UniversalClient) Option { return func(o *options) { o.taskRedis = rdb } }
