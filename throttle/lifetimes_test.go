package throttle_test

// Lifetimes (issue 34): no path may shorten a lifetime another path set,
// and what an operator configured never expires.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Item 2: on a key limited only by WithDefaultLimits, a 429 suspends it for
// 60 s; another handler's Used then settles on the key, and must not make
// its hash expire with the suspension in it (it rewrote the TTL from the
// bucket alone: 3 s later another process was admitted).
func TestUsedNeverShortensASuspension(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithDefaultLimits(throttle.PerSecond(10)))
	d := r.take("crm")
	require.True(t, d.Allowed)
	r.suspend("crm", time.Minute)
	r.advance(1500 * time.Millisecond)
	require.NoError(t, throttle.AdjustCall(r.lim, r.ctx, "crm", 2, d, 1), "a surcharge (Used above the estimate)")
	require.NoError(t, throttle.AdjustCall(r.lim, r.ctx, "crm", -1, d, 3), "a refund")
	r.advance(3 * time.Second)
	got := r.take("crm")
	assert.False(t, got.Allowed, "admitted 3 s into a 60 s suspension: %+v", got)
	assert.Equal(t, throttle.RefusedBySuspension, got.Reason)
	assert.InDelta(t, float64(55500*time.Millisecond), float64(r.inspect("crm").SuspendedFor), float64(time.Second))
}

// Item 3: a quota Observe learned on a default-limit key stays in force
// for the time it was learned for, however idle the key (it was forgotten
// 2 s after the key went idle, and a burst of 20 was admitted again).
func TestALearnedQuotaOutlivesAnIdleKey(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithDefaultLimits(throttle.PerSecond(20)))
	err := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Observe(ctx, respondWith(map[string]string{"RateLimit-Policy": `"s";q=10;w=1`}))
	})).ProcessTask(r.ctx, newTask(t, "crm:sync", nil, throttle.Key("crm")))
	require.NoError(t, err)
	require.Equal(t, 10, r.inspect("crm").InForce[0].N, "learned")
	r.advance(1500 * time.Millisecond)
	r.take("crm") // a decision after it
	r.advance(5 * time.Second)
	assert.Equal(t, 10, r.inspect("crm").InForce[0].N, "still in force 5 s later, the key idle")
	n, _ := r.takeAll("crm", 100)
	assert.Equal(t, 10, n, "a burst after 5 idle seconds: the learned 10, not the default 20")
}

// Item 3 (weights): weights set on a key on default limits are
// configuration, kept however idle the key.
func TestWeightsOnADefaultLimitKeyOutliveIdleness(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithDefaultLimits(throttle.PerSecond(20)))
	require.NoError(t, r.lim.SetWeights(r.ctx, "crm", map[string]int{"gold": 4}))
	r.take("crm")
	r.advance(24 * time.Hour)
	st := r.inspect("crm")
	require.Len(t, st.Tenants, 1)
	assert.Equal(t, throttle.TenantStatus{Name: "gold", Weight: 4}, st.Tenants[0], "a day later")
}

// Item 5: a process with a shorter WithSlotExpiry (a rolling deploy, or a
// service calling Take beside the workers) must not free the slots of live
// handlers in other processes: it set the whole slot set's TTL to its own
// expiry, and was admitted 1.5 s later beside the live holder.
func TestAShorterSlotExpiryNeverFreesAnotherProcesssSlot(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithSlotExpiry(30*time.Second))
	r.setLimits("gh", throttle.InFlight(1))
	held := r.take("gh")
	require.True(t, held.Allowed)
	require.NotEmpty(t, held.Slot)
	other := throttle.NewLimiter(r.rdb, quietLog, throttle.WithSlotExpiry(time.Second))
	// The holder renews its slot every 10 s (a third of its expiry); the
	// other process asks every 1.5 s.
	for i := range 14 {
		d, err := other.Take(r.ctx, "gh")
		require.NoError(t, err)
		assert.False(t, d.Allowed, "another process admitted beside a live holder at epoch+%v: %+v", r.since(), d)
		r.advance(1500 * time.Millisecond)
		if i%6 == 5 {
			n, err := throttle.Extend(r.lim, r.ctx, "gh", held.Slot)
			require.NoError(t, err)
			require.Equal(t, 1, n, "the live holder renews its slot at epoch+%v", r.since())
		}
	}
}

// Item 1: limits set once, by an operator or a deploy script, stay until
// Delete: running `set` again, get, list or suspend cannot be needed to
// keep them, and an idle week or month changes nothing (20 tasks drew 36
// 429s after the 7-day expiry).
func TestConfiguredLimitsNeverExpire(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("weekly", throttle.PerSecond(2))
	for _, idle := range []time.Duration{8 * 24 * time.Hour, 31 * 24 * time.Hour} {
		r.advance(idle)
		n, d := r.takeAll("weekly", 100)
		assert.Equal(t, 2, n, "after %v idle: the configured burst, not unthrottled", idle)
		assert.Equal(t, throttle.RefusedByTier, d.Reason)
	}
}

// Item 6: a provider's long reset (remaining 0, a reset 29 days away) is a
// suspension an operator's Resume ends, with no debt left in the buckets;
// a near reset's debt (5 s) is cleared by Resume too.
func TestResumeClearsEveryWaitAProviderImposed(t *testing.T) {
	for name, tc := range map[string]struct {
		header    string
		suspended bool
	}{
		"a reset 29 days away": {`"p";r=0;t=2592000`, true},
		"a reset 5 s away":     {`"p";r=0;t=5`, false},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, quietLog)
			r.setLimits("crm", throttle.PerSecond(100))
			err := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				return throttle.Observe(ctx, respondWith(map[string]string{"RateLimit": tc.header}))
			})).ProcessTask(r.ctx, newTask(t, "crm:sync", nil, throttle.Key("crm")))
			require.NoError(t, err)
			st := r.inspect("crm")
			assert.Equal(t, tc.suspended, st.SuspendedFor > 0, "suspended: %+v", st)
			require.False(t, r.take("crm").Allowed, "the provider's wait holds before Resume")
			_, err = r.lim.Resume(r.ctx, "crm")
			require.NoError(t, err)
			st = r.inspect("crm")
			assert.Zero(t, st.SuspendedFor)
			assert.GreaterOrEqual(t, st.Tokens[0], 0.0, "no debt left: %+v", st)
			r.advance(10 * time.Millisecond)
			d := r.take("crm")
			assert.True(t, d.Allowed, "Resume ends the provider's wait: %+v", d)
		})
	}
}

// Item 8: fair shares are settled with what Used reports, as the buckets
// are: two tenants of equal weight, one estimating exactly (100 tokens) and
// one 10x low (10, using 100), each get about half of the tokens used (the
// honest one got 6 %).
func TestFairSharesCountWhatUsedSettled(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("llm", throttle.PerSecond(1000), throttle.PerSecond(1000).In("tokens"))
	type task struct {
		id, tenant, uses string
		est              int
		due              time.Time
	}
	var tasks []*task
	for i := range 200 {
		tasks = append(tasks, &task{id: fmt.Sprintf("h%d", i), tenant: "honest", uses: "tokens=100", est: 100, due: r.now})
		tasks = append(tasks, &task{id: fmt.Sprintf("l%d", i), tenant: "liar", uses: "tokens=10", est: 10, due: r.now})
	}
	used := map[string]int{}
	end := r.now.Add(6 * time.Second)
	for r.now.Before(end) {
		next := -1
		for i, k := range tasks {
			if next < 0 || k.due.Before(tasks[next].due) {
				next = i
			}
		}
		k := tasks[next]
		if k.due.After(r.now) {
			r.advance(k.due.Sub(r.now))
		}
		d, err := throttle.ReserveUses(r.lim, r.ctx, "llm", k.id, k.tenant, k.uses, time.Minute, 0)
		require.NoError(t, err)
		if d.Allowed {
			require.NoError(t, throttle.AdjustUnitAs(r.lim, r.ctx, "llm", k.tenant, "tokens", 100-k.est, d, k.est))
			used[k.tenant] += 100
			tasks = append(tasks[:next], tasks[next+1:]...)
			continue
		}
		k.due = r.now.Add(max(d.RetryAfter, time.Millisecond))
		if throttle.Reserved(d) {
			k.due = throttle.ReservedAt(d)
		}
	}
	share := float64(used["honest"]) / float64(used["honest"]+used["liar"])
	t.Logf("tokens used in 6 s: %v (honest share %.2f)", used, share)
	assert.InDelta(t, 0.5, share, 0.15, "the honest tenant's share of the tokens used: %v", used)
}

// Item 4: a process's memo of what Redis has in force is forgotten when the
// limits change (another process raised them, or SetLimits or Delete in
// this one), so a lower published quota is learned at once: raised from
// 10/s to 20/s while the provider states 15/s, 20/s stayed in force for
// 6.6 s of responses, and would have for up to 2.5 min.
func TestObserveFollowsAChangeOfLimitsAtOnce(t *testing.T) {
	r := newRig(t, quietLog, throttle.WithLease(0, 0)) // (a leased token knows no newer limits)
	r.setLimits("crm", throttle.PerSecond(10))
	observe := func() {
		t.Helper()
		err := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			return throttle.Observe(ctx, respondWith(map[string]string{"RateLimit-Policy": `"s";q=15;w=1`}))
		})).ProcessTask(r.ctx, newTask(t, "crm:sync", nil, throttle.Key("crm")))
		require.NoError(t, err)
	}
	observe() // 15/s: above the 10/s in force, nothing to learn
	require.Equal(t, 10, r.inspect("crm").InForce[0].N)
	operator := throttle.NewLimiter(r.rdb, quietLog)
	require.NoError(t, operator.SetLimits(r.ctx, "crm", throttle.PerSecond(20)), "another process raises the limit")
	r.advance(100 * time.Millisecond)
	observe()
	assert.Equal(t, 15, r.inspect("crm").InForce[0].N, "the provider's 15/s learned at the first response after the raise")
}
