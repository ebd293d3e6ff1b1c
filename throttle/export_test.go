package throttle

// Hooks for the tests of package throttle_test: what the library keeps
// unexported, and the tests reach.

import (
	"context"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// Bounds and defaults, as the docs state them.
const (
	MaxTiers             = maxTiers
	MaxPer               = maxPer
	MaxRatePerSecond     = maxRatePerSecond
	MaxBurst             = maxBurst
	MaxKeyLen            = keyspace.MaxKeyLen
	DefaultPrefix        = keyspace.DefaultPrefix
	DefaultLapse         = defaultLapse
	DefaultMaxSuspension = defaultMaxSuspension
	Granule              = granule
)

// FlushIndex waits until l has recorded the keys it decided in the index
// of the limiter's keys (done in the background): for tests that count
// Redis commands or connections.
func FlushIndex(l *Limiter) { l.flushIndex(context.Background()) }

// SetKeptConnRenewal sets how long l's kept connection serves lone
// decisions before it goes back to the pool (ownRenew in production).
func SetKeptConnRenewal(l *Limiter, d time.Duration) { l.flight.renew = d }

// AdjustCall settles the cost of the call d admitted, charged so far, as
// Used does.
func AdjustCall(l *Limiter, ctx context.Context, key string, delta int, d Decision, charged int) error {
	return l.adjust(ctx, key, delta, lua.Call{At: d.at, Charged: charged, Generation: d.gen})
}

// Surcharge makes every tier of key take delta more calls' worth as of now,
// of no known call (a refund of none gives nothing back).
func Surcharge(l *Limiter, ctx context.Context, key string, delta int) error {
	return l.adjust(ctx, key, delta, lua.Call{Generation: -1})
}

// CheckOptions is the error NewLimiter panics with for opts.
func CheckOptions(opts ...Option) error { return newOptions(opts).err }

// WithLearnFor and WithDefaultSuspension set durations the library does
// not let its users change.
func WithLearnFor(d time.Duration) Option { return func(o *options) { o.learnFor = d } }
func WithDefaultSuspension(d time.Duration) Option {
	return func(o *options) { o.defaultSuspend = d }
}

// Reserve decides for a caller with an ID as the middleware does without
// its flags: refused, the caller reserves a run time within horizon, on
// whole granules (0: any instant).
func Reserve(l *Limiter, ctx context.Context, key, id string, horizon, granule time.Duration) (Decision, error) {
	return ReserveN(l, ctx, key, id, 1, horizon, granule)
}

// ReserveN is Reserve for a call that costs n.
func ReserveN(l *Limiter, ctx context.Context, key, id string, n int, horizon, granule time.Duration) (Decision, error) {
	return l.decide(ctx, key, variant{horizon: horizon, granule: granule}, id, taskCost{n: n}, "")
}

// TakeWithHeadroom is Take keeping room for d of dispatch jitter, as the
// middleware does.
func TakeWithHeadroom(l *Limiter, ctx context.Context, key string, d time.Duration) (Decision, error) {
	return l.decide(ctx, key, variant{headroom: d}, "", taskCost{n: 1}, "")
}

// Reserved and ReservedAt tell whether d reserved a run time, and which.
func Reserved(d Decision) bool        { return d.reserved }
func ReservedAt(d Decision) time.Time { return d.reservedAt }

// Reservation returns the run time reserved for taskID under key.
func Reservation(l *Limiter, ctx context.Context, key, taskID string) (time.Time, bool, error) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return time.Time{}, false, err
	}
	us, err := l.rdb.ZScore(ctx, keys.Reservations, taskID).Result()
	if err != nil {
		return time.Time{}, false, nil
	}
	return time.UnixMicro(int64(us)), true, nil
}

// Limits returns the limits of key (Inspect's Limits), or ErrNoLimits.
func Limits(l *Limiter, ctx context.Context, key string) ([]Limit, error) {
	st, err := l.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	if st.Limits == nil {
		return nil, ErrNoLimits
	}
	return st.Limits, nil
}

// Extend renews slots in flight on key.
func Extend(l *Limiter, ctx context.Context, key string, slots ...string) (int, error) {
	return l.extend(ctx, key, slots...)
}

// MiddlewareDecide is the decision the middleware takes for task id of
// cost 1: a reservation horizon, the 1 s granule, l's headroom and pacing,
// no lease.
func MiddlewareDecide(l *Limiter, ctx context.Context, key, id string) (Decision, error) {
	v := variant{granule: granule, headroom: l.o.headroom, pace: l.o.pacing, horizon: l.o.horizon}
	return l.decide(ctx, key, v, id, taskCost{n: 1}, "")
}
