package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"
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

func TestTake_BurstThenRefill(t *testing.T) {
	tests := []struct {
		name      string
		limit     throttle.Limit
		burst     int
		interval  time.Duration // time for one token
		remaining []int         // Remaining of each allowed take
	}{
		{"PerSecond(5)", throttle.PerSecond(5), 5, 200 * time.Millisecond, []int{4, 3, 2, 1, 0}},
		{"PerMinute(2).WithBurst(3)", throttle.PerMinute(2).WithBurst(3), 3, 30 * time.Second, []int{2, 1, 0}},
		{"PerHour(1)", throttle.PerHour(1), 1, time.Hour, []int{0}},
		{"Limit{3, 1500ms, 1}", throttle.Limit{N: 3, Per: 1500 * time.Millisecond, Burst: 1}, 1, 500 * time.Millisecond, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.limit)
			for i, want := range tt.remaining {
				d := r.take("k")
				assertAllowed(t, d, fmt.Sprintf("Take #%d", i+1))
				assert.Equal(t, want, d.Remaining, "Take #%d: Remaining", i+1)
			}
			d := r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, tt.interval, "Take after the burst")
			assert.Equal(t, 1, d.Tier, "Take after the burst: Tier")

			r.advance(tt.interval - time.Millisecond)
			d = r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, time.Millisecond, "Take 1ms before the next token")

			r.advance(time.Millisecond)
			assertAllowed(t, r.take("k"), "Take when the next token is due")
			assertRefused(t, r.take("k"), throttle.RefusedByTier, tt.interval, "Take right after")
		})
	}
}

// TestTake_RetryAfterIsEnough: a refusal always asks to wait (RetryAfter >
// 0), and coming back after exactly RetryAfter is admitted, for rates whose
// token interval is not a whole number of microseconds.
func TestTake_RetryAfterIsEnough(t *testing.T) {
	for rate := 1; rate <= 40; rate++ {
		t.Run(fmt.Sprintf("PerSecond(%d)", rate), func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", throttle.PerSecond(rate).WithBurst(1))
			assertAllowed(t, r.take("k"), "first Take")
			for i := 0; i < 3; i++ {
				d := r.take("k")
				require.False(t, d.Allowed, "Take #%d right after a take: %+v", i, d)
				require.Positive(t, d.RetryAfter, "Take #%d: RetryAfter of a refusal (%+v)", i, d)
				r.advance(d.RetryAfter)
				d2 := r.take("k")
				require.True(t, d2.Allowed, "Take #%d again after RetryAfter %v: %+v", i, d.RetryAfter, d2)
			}
		})
	}
}

// TestTake_LongPeriodNotEarly: for long periods a token is not handed out
// before it is due, and Remaining is never negative.
func TestTake_LongPeriodNotEarly(t *testing.T) {
	for _, l := range []throttle.Limit{
		throttle.PerSecond(1),
		throttle.PerMinute(1),
		{N: 1, Per: 1000 * time.Second},
		throttle.PerHour(1),
		{N: 1, Per: throttle.MaxPer},
	} {
		t.Run(l.String(), func(t *testing.T) {
			r := newRig(t, throttle.WithIdleExpiry(2*throttle.MaxPer))
			r.setLimits("k", l)
			assertAllowed(t, r.take("k"), "first Take")
			r.advance(l.Per - time.Microsecond)
			d := r.take("k")
			assertRefused(t, d, throttle.RefusedByTier, time.Microsecond, fmt.Sprintf("Take %v later (1us early)", l.Per-time.Microsecond))
			assert.GreaterOrEqual(t, d.Remaining, 0, "Remaining")
			r.advance(time.Microsecond)
			d = r.take("k")
			assertAllowed(t, d, fmt.Sprintf("Take %v later", l.Per))
			assert.Equal(t, 0, d.Remaining, "Remaining")
		})
	}
}

func TestTake_TiersAllOrNothing(t *testing.T) {
	r := newRig(t)
	// 10/s with burst 10, and 3/min with burst 3: the minute tier runs dry first.
	r.setLimits("k", throttle.PerSecond(10), throttle.PerMinute(3))
	n, d := r.takeAll("k", 100)
	assert.Equal(t, 3, n, "allowed before the minute tier refused")
	assertRefused(t, d, throttle.RefusedByTier, 20*time.Second, "Take #4")
	assert.Equal(t, 2, d.Tier, "Take #4: Tier")

	// The refused take took nothing from tier 1.
	s := r.inspect("k")
	require.Len(t, s.Tokens, 2, "Inspect tokens")
	assert.InDelta(t, 7, s.Tokens[0], 1e-9, "tier 1 tokens after 3 takes and a refusal")
	assert.InDelta(t, 0, s.Tokens[1], 1e-9, "tier 2 tokens after 3 takes")
}

func TestTake_TierWithLongestWaitRefuses(t *testing.T) {
	r := newRig(t)
	// Tier 1: 1/s burst 5. Tier 2: 6/min burst 6 (one token per 10 s).
	r.setLimits("k", throttle.PerSecond(1).WithBurst(5), throttle.PerMinute(6))
	n, d := r.takeAll("k", 10)
	require.Equal(t, 5, n, "allowed from full buckets")
	assertRefused(t, d, throttle.RefusedByTier, time.Second, "Take #6 (tier 1 empty, tier 2 has 1)")
	assert.Equal(t, 1, d.Tier, "Take #6: Tier")

	r.advance(time.Second) // tier 1: 1, tier 2: 1.1
	assertAllowed(t, r.take("k"), "Take at +1s")

	r.advance(500 * time.Millisecond) // tier 1: 0.5 (wait 0.5 s), tier 2: 0.15 (wait 8.5 s)
	d = r.take("k")
	assertRefused(t, d, throttle.RefusedByTier, 8500*time.Millisecond, "Take at +1.5s, both tiers short")
	assert.Equal(t, 2, d.Tier, "Take at +1.5s: Tier is the one with the longest wait")

	r.advance(500 * time.Millisecond) // tier 1: 1, tier 2: 0.2 (wait 8 s)
	d = r.take("k")
	assertRefused(t, d, throttle.RefusedByTier, 8*time.Second, "Take at +2s, only tier 2 short")
	assert.Equal(t, 2, d.Tier, "Take at +2s: Tier")
}

func TestSuspend(t *testing.T) {
	type step struct {
		advance time.Duration
		suspend time.Duration // 0: none
		resume  bool
		// expectation for a Take after the step
		allowed bool
		retry   time.Duration
	}
	tests := []struct {
		name  string
		opts  []throttle.Option
		steps []step
	}{
		{"refuses for d then allows", nil, []step{
			{suspend: 5 * time.Second, retry: 5 * time.Second},
			{advance: 2 * time.Second, retry: 3 * time.Second},
			{advance: 3*time.Second - time.Microsecond, retry: time.Microsecond},
			{advance: time.Microsecond, allowed: true},
		}},
		{"extends, never shortens", nil, []step{
			{suspend: 10 * time.Second, retry: 10 * time.Second},
			{advance: time.Second, suspend: time.Second, retry: 9 * time.Second},
			{suspend: 20 * time.Second, retry: 20 * time.Second},
		}},
		{"resume ends it", nil, []step{
			{suspend: time.Minute, retry: time.Minute},
			{resume: true, allowed: true},
		}},
		{"capped at DefaultMaxSuspension", nil, []step{
			{suspend: 48 * time.Hour, retry: throttle.DefaultMaxSuspension},
		}},
		{"capped by WithMaxSuspension", []throttle.Option{throttle.WithMaxSuspension(time.Minute)}, []step{
			{suspend: time.Hour, retry: time.Minute},
			{advance: 30 * time.Second, suspend: time.Hour, retry: time.Minute},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			r.setLimits("k", throttle.PerSecond(100))
			for i, s := range tt.steps {
				r.advance(s.advance)
				if s.suspend > 0 {
					r.suspend("k", s.suspend)
				}
				if s.resume {
					require.NoError(t, resumed(r.lim.Resume(r.ctx, "k")), "Resume")
				}
				call := fmt.Sprintf("step %d: Take at epoch+%v", i, r.since())
				d := r.take("k")
				if s.allowed {
					assertAllowed(t, d, call)
					continue
				}
				assertRefused(t, d, throttle.RefusedBySuspension, s.retry, call)
				assert.Equal(t, s.retry, r.inspect("k").SuspendedFor, "step %d: Inspect.Suspended", i)
			}
		})
	}
}

func TestSuspend_RetryAfterCoversEmptyBucket(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerMinute(1))
	assertAllowed(t, r.take("k"), "Take")
	r.suspend("k", 5*time.Second)
	// Suspended for 5 s but the bucket needs 60 s: wait for the later.
	assertRefused(t, r.take("k"), throttle.RefusedBySuspension, time.Minute, "Take while suspended with an empty bucket")
}

func TestSuspend_RejectsNonPositive(t *testing.T) {
	r := newRig(t)
	for _, d := range []time.Duration{0, -time.Second} {
		assert.Error(t, r.lim.Suspend(r.ctx, "k", d), "Suspend(k, %v)", d)
	}
	assert.False(t, r.mr.Exists(redisKey("k", "suspend")), "a refused Suspend wrote the suspend key")
}

func TestSetLimits_AtRunTime(t *testing.T) {
	tests := []struct {
		name     string
		before   []throttle.Limit
		taken    int           // takes before the change
		wait     time.Duration // between those takes and the change
		after    []throttle.Limit
		allowed  int           // takes allowed right after the change
		retry    time.Duration // RetryAfter of the first refusal
		tier     int
		wantTkns []float64 // Inspect tokens right after the change
	}{
		{
			name:   "lowering clamps at once",
			before: []throttle.Limit{throttle.PerSecond(10)}, after: []throttle.Limit{throttle.PerSecond(2)},
			allowed: 2, retry: 500 * time.Millisecond, tier: 1, wantTkns: []float64{2},
		},
		{
			name:   "raising grants no new burst",
			before: []throttle.Limit{throttle.PerSecond(2)}, taken: 2, after: []throttle.Limit{throttle.PerSecond(100)},
			allowed: 0, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{0},
		},
		{
			name:   "tokens brought up to date under the old rate",
			before: []throttle.Limit{throttle.PerSecond(1).WithBurst(10)}, taken: 10, wait: 5 * time.Second,
			after:   []throttle.Limit{throttle.PerSecond(100)},
			allowed: 5, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{5},
		},
		{
			name:   "refilled under the old rate, clamped to the new burst",
			before: []throttle.Limit{throttle.PerMinute(60)}, taken: 60, wait: 30 * time.Second,
			after:   []throttle.Limit{throttle.PerSecond(1).WithBurst(10)},
			allowed: 10, retry: time.Second, tier: 1, wantTkns: []float64{10},
		},
		{
			name:   "a new tier starts full, the old one keeps its debt",
			before: []throttle.Limit{throttle.PerSecond(5)}, taken: 5,
			after:   []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(100)},
			allowed: 0, retry: 200 * time.Millisecond, tier: 1, wantTkns: []float64{0, 100},
		},
		{
			name:   "dropping a tier",
			before: []throttle.Limit{throttle.PerSecond(100), throttle.PerMinute(3)}, taken: 3,
			after:   []throttle.Limit{throttle.PerSecond(100)},
			allowed: 97, retry: 10 * time.Millisecond, tier: 1, wantTkns: []float64{97},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.before...)
			for i := 0; i < tt.taken; i++ {
				require.True(t, r.take("k").Allowed, "Take #%d before the change", i+1)
			}
			r.advance(tt.wait)
			r.setLimits("k", tt.after...)

			s := r.inspect("k")
			require.Len(t, s.Tokens, len(tt.wantTkns), "Inspect tokens after SetLimits(%v)", tt.after)
			for i, w := range tt.wantTkns {
				assert.InDelta(t, w, s.Tokens[i], 1e-9, "tier %d tokens after SetLimits(%v)", i+1, tt.after)
			}

			n, d := r.takeAll("k", 1000)
			assert.Equal(t, tt.allowed, n, "takes allowed after SetLimits(%v)", tt.after)
			assertRefused(t, d, throttle.RefusedByTier, tt.retry, "first refusal after SetLimits")
			assert.Equal(t, tt.tier, d.Tier, "first refusal: Tier")
		})
	}
}

// TestSetLimits_KeyOnDefaultLimits: a key that ran on the limiter's default
// limits has a bucket but no config in Redis. SetLimits must still bring its
// tokens up to date under the limits it ran on and clamp them; it must not
// hand out the new limits' full burst.
func TestSetLimits_KeyOnDefaultLimits(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerMinute(1)))
	assertAllowed(t, r.take("k"), "Take on the default 1/min")
	r.advance(30 * time.Second) // half a token under the old limit

	r.setLimits("k", throttle.PerMinute(120))
	// Under the old limit the bucket holds 0.5 token: the first token under
	// the new rate is 250 ms away.
	n, d := r.takeAll("k", 1000)
	assert.Equal(t, 0, n, "takes allowed right after SetLimits(PerMinute(120)) on a key that had 0.5 token")
	assertRefused(t, d, throttle.RefusedByTier, 250*time.Millisecond, "first Take after SetLimits")
}

// A SetLimits from a Limiter that does not know the defaults the workers'
// decisions used still carries their tokens over: the buckets record the
// defaults they were computed under. The expiry follows the new limits.
func TestSetLimits_FromALimiterWithoutTheDefaults(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerMinute(600).WithBurst(10)))
	n, _ := r.takeAll("k", 100)
	require.Equal(t, 10, n, "burst of the default limit")
	operator := throttle.NewLimiter(r.rdb) // no defaults
	require.NoError(t, operator.SetLimits(r.ctx, "k", throttle.PerMinute(10)), "SetLimits from the operator's Limiter")
	assert.Equal(t, throttle.DefaultIdleExpiry, r.mr.TTL(bucket("k")), "key TTL after SetLimits: the idle expiry")

	r.advance(2 * time.Second)
	n, d := r.takeAll("k", 100)
	assert.Equal(t, 0, n, "takes allowed 2 s after lowering an exhausted bucket to 10/min")
	assertRefused(t, d, throttle.RefusedByTier, 4*time.Second, "refusal 2 s after lowering")
	r.advance(4 * time.Second)
	n, _ = r.takeAll("k", 100)
	assert.Equal(t, 1, n, "takes allowed 6 s after lowering: one token of 10/min")
}

// A tier is identified by its period: whatever SetLimits does with the list,
// a tier keeps its tokens. On a used-up 1000/s + 10/h key, reordering the
// tiers, adding one in front or dropping the first admits nothing more.
func TestSetLimits_TierDebtSurvivesEveryChange(t *testing.T) {
	sec, hour := throttle.PerSecond(1000), throttle.PerHour(10)
	tests := []struct {
		name  string
		after []throttle.Limit
		want  int // admitted within 0.2 s after the change
	}{
		{"reordered", []throttle.Limit{hour, sec}, 0},
		{"tier added in front", []throttle.Limit{throttle.PerMinute(100), sec, hour}, 0},
		{"first tier dropped", []throttle.Limit{hour}, 0},
		{"hourly burst lowered", []throttle.Limit{sec, hour.WithBurst(5)}, 0},
		{"hourly rate raised: no sudden burst", []throttle.Limit{sec, throttle.PerHour(20)}, 0},
		{"a new period starts full", []throttle.Limit{throttle.PerMinute(3)}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", sec, hour)
			n, _ := r.takeAll("k", 100)
			require.Equal(t, 10, n, "the hourly tier's burst")
			r.setLimits("k", tt.after...)
			got := 0
			for range 10 {
				r.advance(20 * time.Millisecond)
				for r.take("k").Allowed {
					got++
				}
			}
			assert.Equal(t, tt.want, got, "admitted within 0.2 s after SetLimits(%v)", tt.after)
		})
	}
}

func TestSetLimits_FixesGarbageConfig(t *testing.T) {
	r := newRig(t)
	r.hset(bucket("k"), "L", "abc/1000/1")
	_, err := r.lim.Take(r.ctx, "k")
	require.ErrorIs(t, err, throttle.ErrInvalidLimit, "Take on a garbage config")

	r.setLimits("k", throttle.PerSecond(2))
	n, d := r.takeAll("k", 10)
	assert.Equal(t, 2, n, "takes after SetLimits replaced the garbage")
	assertRefused(t, d, throttle.RefusedByTier, 500*time.Millisecond, "refusal after that")
}

func TestHandWrittenConfig(t *testing.T) {
	t.Run("used on the next call", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(10))
		assertAllowed(t, r.take("k"), "Take under 10/s")
		r.hset(bucket("k"), "L", "2/1000/2")
		// The state is what each tier owes of its burst: one token, which
		// under the hand-written 2/s leaves one (SetLimits would have kept
		// 9 tokens, clamped to 2).
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 1, n, "takes after HSET L 2/1000/2")
		assertRefused(t, d, throttle.RefusedByTier, 500*time.Millisecond, "refusal under the hand-written 2/s")
	})
	t.Run("on a fresh key", func(t *testing.T) {
		r := newRig(t)
		r.hset(bucket("k"), "L", "5/1000/5 3/60000/3")
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 3, n, "takes under the hand-written 5/s + 3/min")
		assertRefused(t, d, throttle.RefusedByTier, 20*time.Second, "refusal")
		assert.Equal(t, 2, d.Tier, "refusal: Tier")
		got, err := throttle.Limits(r.lim, r.ctx, "k")
		require.NoError(t, err, "Limits(k)")
		assert.Equal(t, []throttle.Limit{
			{N: 5, Per: time.Second, Burst: 5}, {N: 3, Per: time.Minute, Burst: 3},
		}, got, "Limits(k) of a hand-written config")
	})
}

// A clock that steps back never refills: the bucket's state is the time it
// will be full again (on the Redis clock), so a step back makes it look
// emptier, never fuller, and when the clock is back the bucket is exactly
// where it was. The retry-after says when the bucket really has a token.
func TestClockStepsBack(t *testing.T) {
	t.Run("no refill, no error, no extra tokens when it returns", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1).WithBurst(5))
		r.advance(10 * time.Second)
		n, _ := r.takeAll("k", 10)
		require.Equal(t, 5, n, "burst")
		stored := r.tierState("k")

		r.setClock(epoch()) // 10 s back
		d := r.take("k")
		assertRefused(t, d, throttle.RefusedByTier, 11*time.Second, "Take 10 s in the past")
		assert.Equal(t, stored, r.tierState("k"), "stored state after a refusal in the past")

		r.setClock(epoch().Add(10 * time.Second)) // back where it was
		assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Second, "Take when the clock is back")
		r.setClock(epoch().Add(11 * time.Second))
		assertAllowed(t, r.take("k"), "Take 1 s after the last real take")
	})
	t.Run("tokens taken in the past stay taken", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1).WithBurst(5))
		r.advance(10 * time.Second)
		for i := range 2 {
			require.True(t, r.take("k").Allowed, "Take #%d", i+1)
		}
		r.setClock(epoch().Add(9 * time.Second)) // 1 s back: 2 of the 3 tokens left show
		n, _ := r.takeAll("k", 10)
		assert.Equal(t, 2, n, "takes allowed 1 s in the past")

		r.setClock(epoch().Add(10 * time.Second))
		n, _ = r.takeAll("k", 10)
		assert.Equal(t, 1, n, "takes allowed when the clock is back: the burst's last token")
	})
	t.Run("a step back beyond an hour empties the bucket, without a freeze", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerHour(10))
		r.advance(2 * time.Hour)
		n, _ := r.takeAll("k", 100)
		require.Equal(t, 10, n, "burst")
		r.setClock(epoch().Add(time.Hour - time.Minute)) // 1 h 1 min back
		n, d := r.takeAll("k", 100)
		assert.Equal(t, 0, n, "takes allowed right after the clock stepped back 1 h 1 min")
		assert.Equal(t, 6*time.Minute, d.RetryAfter, "one token of 10/h from the step on")
	})
}

// After the clock stepped back, a write covers the whole time until the
// bucket is full again, measured from the (earlier) clock: the expiry of a
// bucket on default limits never cuts its debt short.
func TestClockStepsBack_StateOutlivesRefill(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1).WithBurst(10)))
	r.advance(100 * time.Second)
	for i := range 5 {
		require.True(t, r.take("k").Allowed, "Take #%d", i+1)
	}
	r.setClock(epoch().Add(97 * time.Second)) // 3 s back: full at +105, 8 s away
	assertAllowed(t, r.take("k"), "Take 3 s in the past")
	assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), 9*time.Second, "key TTL after a take 3 s in the past (full at +106 s, now +97 s)")
}

func TestLongIdleGivesOneBurst(t *testing.T) {
	tests := []struct {
		name  string
		limit throttle.Limit
		idle  time.Duration
		burst int
	}{
		{"PerSecond(10).WithBurst(3) idle 1000h", throttle.PerSecond(10).WithBurst(3), 1000 * time.Hour, 3},
		{"PerMinute(1).WithBurst(5) idle 30 days", throttle.PerMinute(1).WithBurst(5), 30 * 24 * time.Hour, 5},
		{"Limit{1, 1000s, 2} idle 10 years", throttle.Limit{N: 1, Per: 1000 * time.Second, Burst: 2}, 10 * 365 * 24 * time.Hour, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, throttle.WithDefaultLimits(tt.limit))
			n, _ := r.takeAll("k", 100)
			require.Equal(t, tt.burst, n, "first burst")
			r.setClock(r.now.Add(tt.idle)) // TIME only: the bucket state is still there
			n, _ = r.takeAll("k", 100)
			assert.Equal(t, tt.burst, n, "takes after idle %v with the state kept", tt.idle)

			r.advance(tt.idle) // TIME and expiry: the state is gone
			n, _ = r.takeAll("k", 100)
			assert.Equal(t, tt.burst, n, "takes after idle %v with the state expired", tt.idle)
		})
	}
}

func TestRates_SlowestAndFastest(t *testing.T) {
	t.Run("0.001/s", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.Limit{N: 1, Per: 1000 * time.Second})
		assertAllowed(t, r.take("k"), "first Take")
		assertRefused(t, r.take("k"), throttle.RefusedByTier, 1000*time.Second, "second Take")
		r.advance(999_999 * time.Millisecond)
		assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Millisecond, "Take after 999.999 s")
		r.advance(time.Millisecond)
		assertAllowed(t, r.take("k"), "Take after exactly 1000 s")
	})
	t.Run("1e6/s burst 1", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(throttle.MaxRatePerSecond).WithBurst(1))
		assertAllowed(t, r.take("k"), "first Take")
		allowed := 0
		for us := 1; us <= 1000; us++ {
			r.advance(time.Microsecond)
			d := r.take("k")
			if d.Allowed {
				allowed++
			}
			d = r.take("k")
			if !assert.False(t, d.Allowed, "second Take at +%dus: %+v", us, d) {
				return
			}
			assert.Equal(t, time.Microsecond, d.RetryAfter, "second Take at +%dus: RetryAfter", us)
		}
		assert.Equal(t, 1000, allowed, "takes allowed in 1 ms at one per microsecond")
	})
	t.Run("1e6/s full burst", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(throttle.MaxRatePerSecond))
		s := r.inspect("k")
		require.Len(t, s.Tokens, 1, "Inspect tokens")
		assert.Equal(t, float64(throttle.MaxRatePerSecond), s.Tokens[0], "tokens of a fresh 1e6/s bucket")
		d := r.take("k")
		assertAllowed(t, d, "Take")
		assert.Equal(t, throttle.MaxRatePerSecond-1, d.Remaining, "Remaining")
	})
}

// bucketModel is an exact integer token bucket: tokens are counted in units of
// 1/per_us of a token, so every refill is an integer.
type bucketModel struct {
	rate, perUS, burstU, tokensU, ts int64
}

func (m *bucketModel) take(now int64) bool {
	m.tokensU = min(m.burstU, m.tokensU+(now-m.ts)*m.rate)
	m.ts = now
	if m.tokensU >= m.perUS {
		m.tokensU -= m.perUS
		return true
	}
	return false
}

func TestRates_NoPrecisionDrift(t *testing.T) {
	// miniredis runs a script in about 0.7 ms: 10^4 steps is a few seconds.
	long, short := 10_000, 2_000
	if testing.Short() {
		long, short = 1_000, 500
	}
	tests := []struct {
		name  string
		limit throttle.Limit
		steps int
		at    func(k int64) int64 // time of step k, us after the start
	}{
		{"3/s burst 1, steps of exactly 1/3 s rounded up", throttle.PerSecond(3).WithBurst(1), long,
			func(k int64) int64 { return (k*1_000_000 + 2) / 3 }},
		{"3/s burst 1, steps of 333333us", throttle.PerSecond(3).WithBurst(1), short,
			func(k int64) int64 { return k * 333_333 }},
		{"3/s burst 3, steps of exactly 1/3 s rounded down", throttle.PerSecond(3), short,
			func(k int64) int64 { return k * 1_000_000 / 3 }},
		{"7 per 3 s burst 2, steps of 428571us", throttle.Limit{N: 7, Per: 3 * time.Second, Burst: 2}, short,
			func(k int64) int64 { return k * 428_571 }},
		{"1000/s burst 1, steps of 999us", throttle.PerSecond(1000).WithBurst(1), short,
			func(k int64) int64 { return k * 999 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.setLimits("k", tt.limit)
			burst := tt.limit.Burst
			if burst == 0 {
				burst = tt.limit.N
			}
			m := bucketModel{rate: int64(tt.limit.N), perUS: tt.limit.Per.Microseconds()}
			m.burstU = int64(burst) * m.perUS
			m.tokensU = m.burstU
			var got, want int
			for k := int64(1); k <= int64(tt.steps); k++ {
				at := tt.at(k)
				r.setClock(epoch().Add(time.Duration(at) * time.Microsecond))
				w := m.take(at)
				d := r.take("k")
				if w {
					want++
				}
				if d.Allowed {
					got++
					if !assert.GreaterOrEqual(t, d.Remaining, 0, "step %d: Remaining of an allowed take", k) {
						return
					}
				}
				if !assert.Equal(t, w, d.Allowed, "step %d (t=%dus): Allowed (exact model has %d/%d tokens)", k, at, m.tokensU, m.perUS) {
					return
				}
			}
			assert.Equal(t, want, got, "admitted over %d steps", tt.steps)
		})
	}
}

// garbageCases are limits an operator could leave in Redis (the L field).
// Each is a valid two-tier base with one change; field is the field Take
// must name.
type garbageCase struct {
	name  string
	L     string
	field string
}

func garbageCases() []garbageCase {
	base := [][3]string{{"10", "1000", "10"}, {"100", "60000", "100"}}
	names := [3]string{"N", "Per", "Burst"}
	values := []struct{ name, v string }{
		{"NaN", "NaN"}, {"nan", "nan"}, {"inf", "inf"}, {"-inf", "-inf"}, {"-1", "-1"}, {"0", "0"},
		{"abc", "abc"}, {"empty", ""}, {"1e300", "1e300"}, {"1.5", "1.5"}, {"5abc", "5abc"}, {"1e400", "1e400"},
		{"0x10", "0x10"},
	}
	format := func(tiers [][3]string) string {
		var parts []string
		for _, t := range tiers {
			parts = append(parts, strings.Join(t[:], "/"))
		}
		return strings.Join(parts, " ")
	}
	var cases []garbageCase
	for i := range base {
		for j := range 3 {
			for _, v := range values {
				tiers := [][3]string{base[0], base[1]}
				tiers[i][j] = v.v
				field := fmt.Sprintf("limits[%d]", i)
				if v.v == "0" {
					field += "." + names[j]
				}
				cases = append(cases, garbageCase{name: fmt.Sprintf("limits[%d].%s=%s", i, names[j], v.name), L: format(tiers), field: field})
			}
		}
	}
	cases = append(cases,
		garbageCase{name: "empty", L: "", field: "limits"},
		garbageCase{name: "spaces", L: "   ", field: "limits"},
		garbageCase{name: "five tiers", L: "1/1/1 1/2/1 1/3/1 1/4/1 1/5/1", field: "limits"},
		garbageCase{name: "a tier cut short", L: "10/1000", field: "limits[0]"},
		garbageCase{name: "a tier too long", L: "10/1000/10/5", field: "limits[0]"},
		garbageCase{name: "per above 30 days", L: "1/2592000001/1", field: "limits[0].Per"},
		garbageCase{name: "rate above 1e6/s", L: "1000001/1000/1", field: "limits[0].N"},
		garbageCase{name: "rate 2e6 per 1000ms", L: "2000000/1000/1", field: "limits[0].N"},
		garbageCase{name: "second rate above 1e6/s", L: "10/1000/10 60000001/60000/1", field: "limits[1].N"},
		garbageCase{name: "burst above 1e9", L: "1/1000/1000000001", field: "limits[0].Burst"},
		garbageCase{name: "same period twice", L: "10/1000/10 20/1000/20", field: "limits[1].Per"},
		garbageCase{name: "a megabyte", L: strings.Repeat("9", 1<<20), field: "limits"},
	)
	return cases
}

func TestGarbageConfig_TakeNamesTheField(t *testing.T) {
	r := newRig(t)
	for _, tc := range garbageCases() {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.mr.FlushAll()
			r.hset(bucket("k"), "L", tc.L)
			d, err := r.lim.Take(r.ctx, "k")
			require.Error(t, err, "Take with %s: want an error, got %+v", tc.name, d)
			assert.ErrorIs(t, err, throttle.ErrInvalidLimit, "Take with %s", tc.name)
			var ce *throttle.ConfigError
			if assert.ErrorAs(t, err, &ce, "Take with %s: %v", tc.name, err) {
				assert.Equal(t, tc.field, ce.Field, "Take with %s: ConfigError.Field (reason %q)", tc.name, ce.Reason)
				assert.Equal(t, "k", ce.Key, "Take with %s: ConfigError.Key", tc.name)
				assert.NotEmpty(t, ce.Reason, "Take with %s: ConfigError.Reason", tc.name)
				assert.Less(t, len(ce.Error()), 400, "Take with %s: the error quotes a bounded part of the value", tc.name)
			}
			assert.Empty(t, r.tierState("k"), "Take with %s wrote a bucket", tc.name)

			_, err = r.lim.Inspect(r.ctx, "k")
			assert.ErrorAs(t, err, &ce, "Inspect with %s", tc.name)
		})
	}
}

// TestGarbageConfig_LimitsFailsLikeTake: Limits (and so Inspect) read the
// limits through the script's own validation, so limits Take refuses are
// never reported as valid, and the error names the same field.
func TestGarbageConfig_LimitsFailsLikeTake(t *testing.T) {
	r := newRig(t)
	for _, tc := range garbageCases() {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.mr.FlushAll()
			r.hset(bucket("k"), "L", tc.L)
			got, err := throttle.Limits(r.lim, r.ctx, "k")
			var ce *throttle.ConfigError
			assert.ErrorAs(t, err, &ce, "Limits with %s: want a *ConfigError, got %v, %v", tc.name, got, err)
			assert.ErrorIs(t, err, throttle.ErrInvalidLimit, "Limits with %s", tc.name)
			if ce != nil {
				assert.Equal(t, tc.field, ce.Field, "Limits with %s: ConfigError.Field (reason %q)", tc.name, ce.Reason)
			}
		})
	}
}

func TestNoLimitsAndDefaults(t *testing.T) {
	ten := []throttle.Limit{throttle.PerSecond(10)}
	five := []throttle.Limit{throttle.PerMinute(5)}
	tests := []struct {
		name    string
		opts    []throttle.Option
		stored  []throttle.Limit // SetLimits before, nil for none
		key     string
		want    []throttle.Limit // nil: ErrNoLimits
		allowed int
	}{
		{"no config, no defaults", nil, nil, "slack", nil, 0},
		{"default limits", []throttle.Option{throttle.WithDefaultLimits(ten...)}, nil, "slack", ten, 10},
		{"redis wins over defaults", []throttle.Option{throttle.WithDefaultLimits(ten...)}, five, "slack", []throttle.Limit{throttle.PerMinute(5).WithBurst(5)}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			if tt.stored != nil {
				r.setLimits(tt.key, tt.stored...)
			}
			got, err := throttle.Limits(r.lim, r.ctx, tt.key)
			d, terr := r.lim.Take(r.ctx, tt.key)
			if tt.want == nil {
				assert.ErrorIs(t, err, throttle.ErrNoLimits, "Limits(%q) = %v", tt.key, got)
				assert.ErrorIs(t, terr, throttle.ErrNoLimits, "Take(%q) = %+v", tt.key, d)
				s := r.inspect(tt.key)
				assert.Nil(t, s.Limits, "Inspect(%q).Limits without limits", tt.key)
				return
			}
			require.NoError(t, err, "Limits(%q)", tt.key)
			assert.Equal(t, effective(tt.want), got, "Limits(%q)", tt.key)
			require.NoError(t, terr, "Take(%q)", tt.key)
			n, _ := r.takeAll(tt.key, 100)
			assert.Equal(t, tt.allowed, n+1, "takes allowed under %v", tt.want)
		})
	}
}

// Invalid options are refused at construction, naming the option: a panic
// from NewLimiter and ByProvider (a programming error), an error from
// CheckOptions; never a task stalled at run time.
func TestInvalidOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		opt  throttle.Option
		name string
	}{
		{throttle.WithDefaultLimits(throttle.Limit{N: 0, Per: time.Second}), "WithDefaultLimits"},
		{throttle.WithDefaultLimits(throttle.PerSecond(1), throttle.PerSecond(2)), "WithDefaultLimits"},
		{throttle.WithTimeout(-time.Second), "WithTimeout"},
		{throttle.WithPrefix(""), "WithPrefix"},
		{throttle.WithMaxSuspension(0), "WithMaxSuspension"},
		{throttle.WithReservationHorizon(-time.Second), "WithReservationHorizon"},
		{throttle.WithSlotExpiry(time.Millisecond), "WithSlotExpiry"},
		{throttle.WithHeadroom(2 * time.Second), "WithHeadroom"},
		{throttle.WithFailureDelay(0), "WithFailureDelay"},
		{throttle.WithLease(-1, time.Second), "WithLease"},
		{throttle.WithLogger(nil), "WithLogger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := throttle.CheckOptions(tt.opt)
			require.Error(t, err, "CheckOptions(%s)", tt.name)
			assert.Contains(t, err.Error(), tt.name, "the error names the option")
			assert.PanicsWithError(t, err.Error(), func() { throttle.NewLimiter(rdb, tt.opt) }, "NewLimiter(%s)", tt.name)
			assert.PanicsWithError(t, err.Error(), func() { throttle.ByProvider(rdb, tt.opt) }, "ByProvider(%s)", tt.name)
		})
	}
	assert.NoError(t, throttle.CheckOptions(throttle.WithTimeout(0), throttle.WithLease(0, 0), throttle.WithDefaultLimits(throttle.PerSecond(1))))
}

func TestLimits_RoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		limits []throttle.Limit
	}{
		{"one tier", []throttle.Limit{throttle.PerSecond(10).WithBurst(20)}},
		{"burst 0 means rate", []throttle.Limit{throttle.PerMinute(50)}},
		{"four tiers", []throttle.Limit{throttle.PerSecond(5).WithBurst(1), throttle.PerMinute(100), throttle.PerHour(1000), {N: 5000, Per: 24 * time.Hour, Burst: 10}}},
		{"odd period", []throttle.Limit{{N: 3, Per: 1500 * time.Millisecond, Burst: 2}}},
		{"extremes", []throttle.Limit{throttle.PerSecond(throttle.MaxRatePerSecond).WithBurst(throttle.MaxBurst), {N: 1, Per: throttle.MaxPer, Burst: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", tt.limits...)
			got, err := throttle.Limits(r.lim, r.ctx, "k")
			require.NoError(t, err, "Limits(k) after SetLimits(%v)", tt.limits)
			want := make([]throttle.Limit, len(tt.limits))
			for i, l := range tt.limits {
				if l.Burst == 0 {
					l.Burst = l.N
				}
				want[i] = l
			}
			assert.Equal(t, want, got, "Limits(k) after SetLimits(%v)", tt.limits)
			assert.Equal(t, want, r.inspect("k").Limits, "Inspect(k).Limits")
		})
	}
}

func TestInvalidKeys(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
	for _, key := range []string{"", strings.Repeat("a", throttle.MaxKeyLen+1), "a{b", "a}b", "\x00", "tab\t", "\xff\xfe", "new\nline"} {
		t.Run(fmt.Sprintf("%q", key), func(t *testing.T) {
			calls := map[string]error{
				"ValidateKey": throttle.ValidateKey(key),
				"SetLimits":   r.lim.SetLimits(r.ctx, key, throttle.PerSecond(1)),
				"Suspend":     r.lim.Suspend(r.ctx, key, time.Second),
			}
			_, calls["Resume"] = r.lim.Resume(r.ctx, key)
			_, calls["Take"] = r.lim.Take(r.ctx, key)
			_, calls["Reserve"] = throttle.Reserve(r.lim, r.ctx, key, "id", time.Minute, time.Second)
			_, calls["Limits"] = throttle.Limits(r.lim, r.ctx, key)
			_, calls["Inspect"] = r.lim.Inspect(r.ctx, key)
			for call, err := range calls {
				assert.ErrorIs(t, err, throttle.ErrInvalidKey, "%s(%q)", call, key)
			}
		})
	}
	assert.Empty(t, r.mr.Keys(), "Redis keys written for invalid limiter keys")
}

func TestRedisKeyNames(t *testing.T) {
	tests := []struct {
		name   string
		opts   []throttle.Option
		prefix string
	}{
		{"default prefix", nil, throttle.DefaultPrefix},
		{"WithPrefix", []throttle.Option{throttle.WithPrefix("myapp")}, "myapp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			r.setLimits("slack", throttle.PerSecond(1))
			r.take("slack")
			r.reserve("slack", "task-1", time.Minute, time.Second)
			r.suspend("slack", time.Second)
			want := []string{}
			for _, p := range []string{"b", "r"} {
				want = append(want, tt.prefix+":{slack}:"+p)
			}
			assert.Equal(t, want, r.mr.Keys(), "Redis keys of limiter key slack")
		})
	}
}

func TestReserve_SlotsInDenyOrder(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	const horizon = 10 * time.Second
	assertAllowed(t, r.take("k"), "Take from the full bucket")

	for i, id := range []string{"a", "b", "c"} {
		d := r.reserve("k", id, horizon, 0)
		want := time.Duration(i+1) * time.Second
		assert.True(t, throttle.Reserved(d), "Reserve(%s): Reserved (%+v)", id, d)
		assert.Equal(t, throttle.RefusedByTier, d.Reason, "Reserve(%s) on an empty bucket: Reason", id)
		assert.Equal(t, want, d.RetryAfter, "Reserve(%s): RetryAfter", id)
		assert.Equal(t, epoch().Add(want), throttle.ReservedAt(d), "Reserve(%s): Slot", id)
	}
	assert.Equal(t, 3, r.inspect("k").Reservations, "Inspect.Reservations")

	d := r.reserve("k", "a", horizon, 0)
	assertRefused(t, d, throttle.RefusedReserved, time.Second, "Reserve(a) again before its slot")
	assert.Equal(t, epoch().Add(time.Second), throttle.ReservedAt(d), "Reserve(a) again: Slot")
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 4*time.Second, "Take behind 3 reservations")

	r.advance(time.Second) // one token; a's slot
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 3*time.Second, "Take with a token promised to a")
	d = r.reserve("k", "d", horizon, 0)
	assert.True(t, throttle.Reserved(d), "Reserve(d) with a token promised to a: Reserved (%+v)", d)
	assert.Equal(t, throttle.RefusedByQueue, d.Reason, "Reserve(d): Reason")
	assert.Equal(t, epoch().Add(4*time.Second), throttle.ReservedAt(d), "Reserve(d): Slot")
	assertAllowed(t, r.reserve("k", "a", horizon, 0), "Reserve(a) at its slot")

	r.advance(500 * time.Millisecond)
	assertRefused(t, r.reserve("k", "b", horizon, 0), throttle.RefusedReserved, 500*time.Millisecond, "Reserve(b) 0.5 s early")
	r.advance(500 * time.Millisecond)
	assertAllowed(t, r.reserve("k", "b", horizon, 0), "Reserve(b) at its slot")
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "c", horizon, 0), "Reserve(c) at its slot")
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "d", horizon, 0), "Reserve(d) at its slot")
	assert.Equal(t, 0, r.inspect("k").Reservations, "Inspect.Reservations after all came back")
	assertRefused(t, r.take("k"), throttle.RefusedByTier, time.Second, "Take after the queue drained")
	r.advance(time.Second)
	assertAllowed(t, r.take("k"), "Take a token later")
}

// TestReserve_Schedule: reserved slots are exactly what the buckets can
// admit when the tasks come back. Without a granule, slots are spaced by the
// tightest tier's interval. With one (asynq: 1 s), slots fall on granule
// boundaries and each boundary gets as many tasks as every bucket will hold
// at that instant: a greedy drain, simulated here independently.
func TestReserve_Schedule(t *testing.T) {
	tests := []struct {
		name    string
		limits  []throttle.Limit
		drain   int // tokens taken at the start (all of the tightest tier's burst, or fewer)
		granule time.Duration
		n       int
	}{
		{"continuous, one tier", []throttle.Limit{throttle.PerSecond(2)}, 2, 0, 6},
		{"granule, burst below rate", []throttle.Limit{throttle.PerSecond(10).WithBurst(5)}, 5, time.Second, 20},
		{"granule, burst 1", []throttle.Limit{throttle.PerSecond(10).WithBurst(1)}, 1, time.Second, 5},
		{"granule, rate below burst", []throttle.Limit{throttle.PerSecond(4).WithBurst(20)}, 20, time.Second, 20},
		{"granule, burst = rate", []throttle.Limit{throttle.PerSecond(100)}, 100, time.Second, 350},
		{"two tiers: the slow tier's burst is used", []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(120).WithBurst(30)}, 5, time.Second, 80},
		{"two tiers, slow tier binding", []throttle.Limit{throttle.PerSecond(10), throttle.PerMinute(30)}, 10, time.Second, 25},
		{"continuous, two tiers", []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(120).WithBurst(30)}, 5, 0, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.advance(300 * time.Millisecond) // off a granule boundary
			r.setLimits("k", tt.limits...)
			start := r.now
			for i := range tt.drain {
				require.True(t, r.take("k").Allowed, "drain take %d", i)
			}
			var slots []time.Time
			for i := range tt.n {
				id := fmt.Sprintf("task-%d", i)
				d := r.reserve("k", id, time.Hour, tt.granule)
				require.True(t, throttle.Reserved(d), "Reserve(%s): %+v", id, d)
				assert.Equal(t, throttle.ReservedAt(d).Sub(r.now), d.RetryAfter, "Reserve(%s): RetryAfter = Slot - now", id)
				if len(slots) > 0 {
					require.False(t, throttle.ReservedAt(d).Before(slots[len(slots)-1]), "Reserve(%s): slot %v before the previous %v", id, throttle.ReservedAt(d), slots[len(slots)-1])
				}
				if tt.granule > 0 {
					assert.Zero(t, throttle.ReservedAt(d).UnixMicro()%tt.granule.Microseconds(), "Reserve(%s): slot %v off the granule", id, throttle.ReservedAt(d))
				}
				slots = append(slots, throttle.ReservedAt(d))
			}
			want := greedySchedule(tt.limits, tt.drain, start, tt.granule, tt.n)
			assert.Equal(t, want, slots, "slots of %v with granule %v", tt.limits, tt.granule)
		})
	}
}

// greedySchedule is the reference for TestReserve_Schedule: buckets (full at
// start, minus drain) admit tasks one at a time, as early as they can, at
// granule boundaries when granule > 0 (in microsecond steps otherwise).
func greedySchedule(limits []throttle.Limit, drain int, start time.Time, granule time.Duration, n int) []time.Time {
	tokens := make([]*big.Rat, len(limits))
	for i, l := range effective(limits) {
		tokens[i] = new(big.Rat).SetInt64(int64(l.Burst - drain))
	}
	at := start
	last := start
	var out []time.Time
	for len(out) < n {
		// Refill to at.
		el := at.Sub(last).Microseconds()
		for i, l := range effective(limits) {
			add := new(big.Rat).SetFrac64(el*int64(l.N), l.Per.Microseconds())
			tokens[i].Add(tokens[i], add)
			if b := new(big.Rat).SetInt64(int64(l.Burst)); tokens[i].Cmp(b) > 0 {
				tokens[i] = b
			}
		}
		last = at
		ok := true
		for _, tk := range tokens {
			if tk.Cmp(big.NewRat(1, 1)) < 0 {
				ok = false
			}
		}
		if ok {
			for _, tk := range tokens {
				tk.Sub(tk, big.NewRat(1, 1))
			}
			out = append(out, at)
			continue
		}
		// Jump to the next instant a token can be there.
		var next time.Time
		if granule == 0 {
			var wait time.Duration
			for i, l := range effective(limits) {
				if tokens[i].Cmp(big.NewRat(1, 1)) < 0 {
					need := new(big.Rat).Sub(big.NewRat(1, 1), tokens[i])
					need.Mul(need, new(big.Rat).SetFrac64(l.Per.Microseconds(), int64(l.N)))
					us := new(big.Int).Quo(need.Num(), need.Denom())
					if new(big.Rat).SetInt(us).Cmp(need) < 0 {
						us.Add(us, big.NewInt(1))
					}
					wait = max(wait, time.Duration(us.Int64())*time.Microsecond)
				}
			}
			next = at.Add(wait)
		} else {
			next = at.Truncate(granule).Add(granule)
		}
		at = next
	}
	return out
}

// TestReserve_ComeBackAtSlot: a caller that comes back at exactly
// throttle.ReservedAt(Decision) is admitted, for rates whose interval is not whole
// microseconds.
func TestReserve_ComeBackAtSlot(t *testing.T) {
	for _, rate := range []int{1, 3, 7, 9, 11, 13} {
		t.Run(fmt.Sprintf("PerSecond(%d)", rate), func(t *testing.T) {
			r := newRig(t)
			r.setLimits("k", throttle.PerSecond(rate).WithBurst(1))
			assertAllowed(t, r.take("k"), "Take")
			var slots []time.Time
			for i := 0; i < 4; i++ {
				d := r.reserve("k", fmt.Sprint(i), time.Minute, 0)
				require.True(t, throttle.Reserved(d), "Reserve(%d): %+v", i, d)
				slots = append(slots, throttle.ReservedAt(d))
			}
			for i, s := range slots {
				r.advance(s.Sub(r.now))
				assertAllowed(t, r.reserve("k", fmt.Sprint(i), time.Minute, 0), fmt.Sprintf("Reserve(%d) at throttle.ReservedAt(Decision) %v", i, s.Sub(epoch())))
			}
		})
	}
}

func TestReserve_Horizon(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	const horizon = 2500 * time.Millisecond
	assertAllowed(t, r.take("k"), "Take")
	for i, id := range []string{"a", "b"} {
		d := r.reserve("k", id, horizon, 0)
		assert.True(t, throttle.Reserved(d), "Reserve(%s) within the horizon: %+v", id, d)
		assert.Equal(t, time.Duration(i+1)*time.Second, d.RetryAfter, "Reserve(%s): RetryAfter", id)
	}
	d := r.reserve("k", "c", horizon, 0)
	assert.False(t, throttle.Reserved(d), "Reserve(c) beyond the horizon: %+v", d)
	assert.True(t, throttle.ReservedAt(d).IsZero(), "Reserve(c) beyond the horizon: Slot %v", throttle.ReservedAt(d))
	assert.False(t, d.Allowed, "Reserve(c) beyond the horizon: Allowed")
	// The next free slot is at 3 s: c can reserve it once 3 s is within 2.5 s.
	assert.Equal(t, 500*time.Millisecond, d.RetryAfter, "Reserve(c) beyond the horizon: RetryAfter")
	assert.Equal(t, 2, r.inspect("k").Reservations, "Inspect.Reservations")

	r.advance(d.RetryAfter)
	d = r.reserve("k", "c", horizon, 0)
	assert.True(t, throttle.Reserved(d), "Reserve(c) after RetryAfter: %+v", d)
	assert.Equal(t, epoch().Add(3*time.Second), throttle.ReservedAt(d), "Reserve(c) after RetryAfter: Slot")
}

func TestReserve_Lapse(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	resv := redisKey("k", "r")
	assertAllowed(t, r.take("k"), "Take")
	for _, id := range []string{"a", "b"} { // slots at +1 s and +2 s
		d := r.reserve("k", id, time.Minute, 0)
		require.True(t, throttle.Reserved(d), "Reserve(%s): %+v", id, d)
	}
	members := func() []string {
		t.Helper()
		m, err := r.mr.ZMembers(resv)
		require.NoError(t, err, "ZRANGE %s", resv)
		return m
	}

	// Exactly DefaultLapse after a's slot: a is still kept. z gets a token.
	r.advance(time.Second + throttle.DefaultLapse)
	assertAllowed(t, r.reserve("k", "z", time.Minute, 0), "Reserve(z) 5 min later")
	assert.Equal(t, []string{"a", "b"}, members(), "reservations DefaultLapse after a's slot")
	assert.Equal(t, 2, r.inspect("k").Reservations, "Inspect.Reservations")

	// A second later a has lapsed and b is at its limit. With no queue
	// outstanding, reservations are not even read: they expire with their key.
	r.advance(time.Second)
	assertAllowed(t, r.reserve("k", "y", time.Minute, 0), "Reserve(y) 1 s later")
	assert.Positive(t, r.mr.TTL(resv), "the reservations key expires by itself")

	// a coming back now is a fresh caller.
	d := r.reserve("k", "a", time.Minute, 0)
	assert.Equal(t, throttle.RefusedByTier, d.Reason, "Reserve(a) after its reservation lapsed: %+v", d)
}

func TestReserve_SuspensionAndQueue(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10))
	r.suspend("k", 5*time.Second)
	d := r.reserve("k", "a", time.Minute, 0)
	assert.True(t, throttle.Reserved(d), "Reserve while suspended: %+v", d)
	assert.Equal(t, throttle.RefusedBySuspension, d.Reason, "Reserve while suspended: Reason")
	assert.Equal(t, 5*time.Second, d.RetryAfter, "Reserve while suspended: RetryAfter is the end of the suspension")

	r.advance(5 * time.Second)
	assertRefused(t, r.take("k"), throttle.RefusedByQueue, 100*time.Millisecond, "Take with a's slot due")
	assertAllowed(t, r.reserve("k", "a", time.Minute, 0), "Reserve(a) at its slot after the suspension")
	r.advance(100 * time.Millisecond)
	assertAllowed(t, r.take("k"), "Take after the queue")
}

func TestTTLs(t *testing.T) {
	t.Run("every key written has a TTL", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(1))
		assert.Equal(t, throttle.DefaultIdleExpiry, r.mr.TTL(bucket("k")), "key TTL after SetLimits")
		r.take("k")
		d := r.reserve("k", "a", time.Minute, 0)
		require.True(t, throttle.Reserved(d), "Reserve: %+v", d)
		r.suspend("k", 3*time.Second)
		for _, p := range []string{"b", "r"} {
			assert.Positive(t, r.mr.TTL(redisKey("k", p)), "TTL of %s", redisKey("k", p))
		}
		assert.GreaterOrEqual(t, r.mr.TTL(redisKey("k", "r")), time.Second+throttle.DefaultLapse, "reservations TTL covers slot + lapse")
		assert.Equal(t, []string{bucket("k"), redisKey("k", "r")}, r.mr.Keys(), "keys")
	})
	t.Run("idle expiry refreshed by Take", func(t *testing.T) {
		r := newRig(t, throttle.WithIdleExpiry(time.Hour))
		r.setLimits("k", throttle.PerSecond(1))
		r.advance(30 * time.Minute)
		r.take("k")
		assert.Equal(t, time.Hour, r.mr.TTL(bucket("k")), "key TTL after a Take 30 min later")
		r.advance(59 * time.Minute)
		_, err := throttle.Limits(r.lim, r.ctx, "k")
		assert.NoError(t, err, "Limits 59 min after the last Take")
		r.advance(time.Minute)
		_, err = throttle.Limits(r.lim, r.ctx, "k")
		assert.ErrorIs(t, err, throttle.ErrNoLimits, "Limits an hour after the last Take")
	})
	t.Run("hand-written limits get a TTL", func(t *testing.T) {
		r := newRig(t)
		r.hset(bucket("k"), "L", "1/1000/1")
		require.Zero(t, r.mr.TTL(bucket("k")), "TTL of the hand-written limits")
		r.take("k")
		assert.Equal(t, throttle.DefaultIdleExpiry, r.mr.TTL(bucket("k")), "key TTL after Take")
	})
	t.Run("a suspension keeps the key alive", func(t *testing.T) {
		r := newRig(t)
		r.suspend("k", 3*time.Second)
		assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), 3*time.Second, "TTL of a suspended key without limits")
	})
	t.Run("state outlives its refill", func(t *testing.T) {
		tests := []struct {
			limit throttle.Limit
			takes int
			full  time.Duration // until the bucket is full again
		}{
			{throttle.PerHour(1).WithBurst(10), 10, 10 * time.Hour},
			{throttle.PerSecond(3), 3, time.Second},
			{throttle.Limit{N: 1, Per: throttle.MaxPer, Burst: 3}, 2, 2 * throttle.MaxPer},
		}
		for _, tt := range tests {
			// On default limits: no idle expiry of limits in Redis keeps the
			// key, only what the bucket needs.
			r := newRig(t, throttle.WithDefaultLimits(tt.limit))
			for i := 0; i < tt.takes; i++ {
				require.True(t, r.take("k").Allowed, "%v: Take #%d", tt.limit, i+1)
			}
			assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), tt.full, "%v: key TTL after %d takes", tt.limit, tt.takes)
		}
	})
	t.Run("state outlives the reservation queue", func(t *testing.T) {
		r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
		r.take("k")
		var last throttle.Decision
		for i := 0; i < 30; i++ {
			last = r.reserve("k", fmt.Sprint(i), time.Minute, 0)
			require.True(t, throttle.Reserved(last), "Reserve(%d): %+v", i, last)
		}
		queue := throttle.ReservedAt(last).Sub(r.now)
		assert.GreaterOrEqual(t, r.mr.TTL(bucket("k")), queue, "key TTL with a queue of %v", queue)
		// SetLimits drops the queue (its slots were spaced for the old
		// limits): 3 s later a fresh Take is decided by the buckets alone.
		r.setLimits("k", throttle.PerSecond(1))
		assert.Zero(t, r.mr.Exists(redisKey("k", "r")), "reservations kept after SetLimits")
		r.advance(3 * time.Second)
		d := r.take("k")
		assert.True(t, d.Allowed, "Take 3 s after SetLimits dropped the queue: %+v", d)
	})
}

func TestInspect(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10), throttle.PerMinute(100))
	for i := 0; i < 3; i++ {
		require.True(t, r.take("k").Allowed, "Take #%d", i+1)
	}
	s := r.inspect("k")
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(10).WithBurst(10), throttle.PerMinute(100).WithBurst(100)}, s.Limits, "Limits")
	assert.InDeltaSlice(t, []float64{7, 97}, s.Tokens, 1e-9, "Tokens after 3 takes")
	assert.Zero(t, s.SuspendedFor, "Suspended")
	assert.Zero(t, s.Reservations, "Reservations")
	assert.Zero(t, s.QueuedFor, "QueuedFor")

	r.suspend("k", 5*time.Second)
	d := r.reserve("k", "a", time.Minute, 0)
	require.True(t, throttle.Reserved(d), "Reserve while suspended: %+v", d)
	s = r.inspect("k")
	assert.Equal(t, 5*time.Second, s.SuspendedFor, "Suspended")
	assert.Equal(t, 1, s.Reservations, "Reservations")
	// Spacing is the slowest tier's interval: 60 s / 100 = 600 ms.
	assert.Equal(t, 5600*time.Millisecond, s.QueuedFor, "QueuedFor")

	r.advance(time.Second)
	s = r.inspect("k")
	assert.InDeltaSlice(t, []float64{10, 97 + 100.0/60}, s.Tokens, 1e-9, "Tokens 1 s later")
	assert.Equal(t, 4*time.Second, s.SuspendedFor, "Suspended 1 s later")

	before := r.mr.Dump()
	r.inspect("k")
	assert.Equal(t, before, r.mr.Dump(), "Inspect changed Redis")

	t.Run("defaults", func(t *testing.T) {
		r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(4)))
		s := r.inspect("x")
		assert.Equal(t, effective([]throttle.Limit{throttle.PerSecond(4)}), s.Limits, "Limits from defaults")
		assert.Equal(t, []float64{4}, s.Tokens, "Tokens of a fresh key")
	})
	t.Run("no limits but suspended", func(t *testing.T) {
		r := newRig(t)
		r.suspend("x", time.Minute)
		s := r.inspect("x")
		assert.Nil(t, s.Limits, "Limits")
		assert.Equal(t, time.Minute, s.SuspendedFor, "Suspended")
		d, err := r.lim.Take(r.ctx, "x")
		require.NoError(t, err, "Take on a suspended key without limits")
		assertRefused(t, d, throttle.RefusedBySuspension, time.Minute, "Take on a suspended key without limits")
	})
}

func TestScriptFlush(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(2))
	assertAllowed(t, r.take("k"), "Take before SCRIPT FLUSH")
	steps := []struct {
		name string
		call func() error
	}{
		{"Take", func() error { _, err := r.lim.Take(r.ctx, "k"); return err }},
		{"Reserve", func() error { _, err := throttle.Reserve(r.lim, r.ctx, "k", "a", time.Minute, 0); return err }},
		{"SetLimits", func() error { return r.lim.SetLimits(r.ctx, "k", throttle.PerSecond(3)) }},
		{"Suspend", func() error { return r.lim.Suspend(r.ctx, "k", time.Second) }},
		{"Inspect", func() error { _, err := r.lim.Inspect(r.ctx, "k"); return err }},
	}
	for _, s := range steps {
		require.NoError(t, r.rdb.ScriptFlush(r.ctx).Err(), "SCRIPT FLUSH")
		assert.NoError(t, s.call(), "%s after SCRIPT FLUSH", s.name)
	}
}

func TestDecision_ReasonString(t *testing.T) {
	for reason, want := range map[throttle.Reason]string{
		throttle.Reason(0):           "allowed",
		throttle.RefusedByTier:       "tier",
		throttle.RefusedBySuspension: "suspended",
		throttle.RefusedByQueue:      "queued",
		throttle.RefusedReserved:     "reserved",
		throttle.Reason(42):          "Reason(42)",
	} {
		assert.Equal(t, want, reason.String(), "Reason(%d).String()", int(reason))
	}
}

func TestContextDeadline(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	ctx, cancel := context.WithCancel(r.ctx)
	cancel()
	_, err := r.lim.Take(ctx, "k")
	assert.True(t, errors.Is(err, context.Canceled), "Take with a canceled context: %v", err)
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

// Refused callers with IDs get their own reserved times, in the order they
// were refused; a caller without one waits behind them.
func TestReservationsInTheOrderCallersWereRefused(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
	_, err := r.lim.Take(r.ctx, "slack") // the only token
	require.NoError(t, err)
	for i, id := range []string{"task-a", "task-b", "task-c"} {
		d, err := throttle.Reserve(r.lim, r.ctx, "slack", id, time.Minute, 0)
		require.NoError(t, err)
		assert.True(t, throttle.Reserved(d), "%s reserved", id)
		assert.InDelta(t, float64(i+1), d.RetryAfter.Seconds(), 0.01, "%s's turn", id)
	}
	d, err := r.lim.Take(r.ctx, "slack")
	require.NoError(t, err)
	assert.Equal(t, throttle.RefusedByQueue, d.Reason)
	assert.InDelta(t, 4, d.RetryAfter.Seconds(), 0.01, "behind the reservations")
}
