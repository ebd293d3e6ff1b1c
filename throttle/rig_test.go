package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// epoch is the Redis clock at the start of every test: a fixed instant, so
// that every decision is reproducible.
func epoch() time.Time { return time.Unix(1_700_000_000, 0) }

// rig is one limiter on its own miniredis with a clock the test moves. The
// scripts read Redis TIME, which miniredis serves from SetTime; expiry is
// driven separately by FastForward, so advance moves both, as a real clock
// would.
type rig struct {
	t   testing.TB
	mr  *miniredis.Miniredis
	rdb *redis.Client
	lim *throttle.Limiter
	now time.Time
	ctx context.Context
}

func newRig(t testing.TB, opts ...throttle.Option) *rig {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	r := &rig{t: t, mr: mr, rdb: rdb, lim: throttle.NewLimiter(rdb, opts...), ctx: context.Background()}
	r.setClock(epoch())
	return r
}

// setClock moves Redis TIME only (expiry does not follow), e.g. for a clock
// that steps back.
func (r *rig) setClock(at time.Time) {
	r.now = at
	r.mr.SetTime(at)
}

// advance moves Redis TIME and key expiry forward by d.
func (r *rig) advance(d time.Duration) {
	r.t.Helper()
	require.GreaterOrEqual(r.t, d, time.Duration(0), "advance(%v): use setClock to step back", d)
	r.setClock(r.now.Add(d))
	r.mr.FastForward(d)
}

// since is the rig's clock relative to epoch, for messages.
func (r *rig) since() time.Duration { return r.now.Sub(epoch()) }

func (r *rig) take(key string) throttle.Decision {
	r.t.Helper()
	d, err := r.lim.Take(r.ctx, key)
	require.NoError(r.t, err, "Take(%q) at epoch+%v", key, r.since())
	return d
}

func (r *rig) reserve(key, id string, horizon, granule time.Duration) throttle.Decision {
	r.t.Helper()
	d, err := throttle.Reserve(r.lim, r.ctx, key, id, horizon, granule)
	require.NoError(r.t, err, "Reserve(%q, %q, %v, %v) at epoch+%v", key, id, horizon, granule, r.since())
	return d
}

func (r *rig) setLimits(key string, limits ...throttle.Limit) {
	r.t.Helper()
	require.NoError(r.t, r.lim.SetLimits(r.ctx, key, limits...), "SetLimits(%q, %v)", key, limits)
}

func (r *rig) suspend(key string, d time.Duration) {
	r.t.Helper()
	require.NoError(r.t, r.lim.Suspend(r.ctx, key, d), "Suspend(%q, %v)", key, d)
}

func (r *rig) inspect(key string) throttle.Status {
	r.t.Helper()
	s, err := r.lim.Inspect(r.ctx, key)
	require.NoError(r.t, err, "Inspect(%q) at epoch+%v", key, r.since())
	return s
}

// takeAll takes until the first refusal (at most limit times) and returns
// how many were allowed and the refusal.
func (r *rig) takeAll(key string, limit int) (int, throttle.Decision) {
	r.t.Helper()
	for n := 0; n < limit; n++ {
		d := r.take(key)
		if !d.Allowed {
			return n, d
		}
	}
	r.t.Fatalf("Take(%q) allowed %d times in a row at epoch+%v, expected a refusal", key, limit, r.since())
	return 0, throttle.Decision{}
}

// redisKey is the Redis key of part ("b" the bucket hash, "r" the
// reservations) of a limiter key under the default prefix.
func redisKey(name, part string) string { return "throttle:{" + name + "}:" + part }

// bucket is the Redis key of a limiter key's hash (limits, state, suspension).
func bucket(name string) string { return redisKey(name, "b") }

// hset writes hash fields by hand, as an operator would with redis-cli.
func (r *rig) hset(key string, kv ...string) {
	r.t.Helper()
	require.Zero(r.t, len(kv)%2, "hset(%q, %q): odd field/value list", key, kv)
	for i := 0; i < len(kv); i += 2 {
		r.mr.HSet(key, kv[i], kv[i+1])
	}
}

// tierState is the bucket state stored for a key (the T field: per_ms:tat
// pairs of the tiers that are not full).
func (r *rig) tierState(name string) string {
	return r.mr.HGet(bucket(name), "T")
}

func assertAllowed(t testing.TB, d throttle.Decision, call string) {
	t.Helper()
	assert.True(t, d.Allowed, "%s: want allowed, got %+v", call, d)
	assert.Equal(t, throttle.Reason(0), d.Reason, "%s: Reason", call)
	assert.Zero(t, d.RetryAfter, "%s: RetryAfter of an allowed decision", call)
}

func assertRefused(t testing.TB, d throttle.Decision, reason throttle.Reason, retry time.Duration, call string) {
	t.Helper()
	assert.False(t, d.Allowed, "%s: want refused, got %+v", call, d)
	assert.Equal(t, reason, d.Reason, "%s: Reason (decision %+v)", call, d)
	assert.Equal(t, retry, d.RetryAfter, "%s: RetryAfter (decision %+v)", call, d)
}

// effective spells out Burst 0 as Rate, as Limits and Inspect report it.
func effective(ls []throttle.Limit) []throttle.Limit {
	out := make([]throttle.Limit, len(ls))
	for i, l := range ls {
		if l.Burst == 0 {
			l.Burst = l.N
		}
		out[i] = l
	}
	return out
}
