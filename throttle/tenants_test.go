package throttle_test

// Fair shares among the tenants of a key (issue 23), on the Go side: the
// Tenant option, SetWeights, Inspect's tenants, the default tenant of a
// key that tenants share (the script's "ask again", -4), Enqueue and the
// middleware with tenants, and leases kept off shared keys. The scripts'
// own arithmetic is tested in internal/lua/fair_test.go; these tests run on
// miniredis with the rig's clock, so every instant is exact.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// tenantHeader is the header Tenant sets (docs/how-it-works.md).
const tenantHeader = "throttle-tenant"

// events records what a Limiter's middleware tells OnEvent.
type events struct {
	mu  sync.Mutex
	all []throttle.Event
}

func recordEvents(l *throttle.Limiter) *events {
	e := &events{}
	l.OnEvent(func(ev throttle.Event) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.all = append(e.all, ev)
	})
	return e
}

// last returns the last event, failing the test when there is none.
func (e *events) last(t *testing.T) throttle.Event {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NotEmpty(t, e.all, "no event")
	return e.all[len(e.all)-1]
}

// reserveAs decides for task id of tenant as the middleware does (a
// minute's horizon, exact instants) and requires a decision.
func (r *rig) reserveAs(key, id, tenant string) throttle.Decision {
	r.t.Helper()
	d, err := throttle.ReserveAs(r.lim, r.ctx, key, id, tenant, 1, time.Minute, 0)
	require.NoError(r.t, err, "ReserveAs(%q, %q, tenant %q) at epoch+%v", key, id, tenant, r.since())
	return d
}

// runThrough runs task through l's middleware with a handler that counts
// its runs.
func runThrough(t *testing.T, l *throttle.Limiter, task *asynq.Task) (ran bool, err error) {
	t.Helper()
	err = l.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran = true
		return nil
	})).ProcessTask(context.Background(), task)
	return ran, err
}

// tenantNamed returns the tenant called name in s, or false.
func tenantNamed(s throttle.Status, name string) (throttle.TenantStatus, bool) {
	for _, ts := range s.Tenants {
		if ts.Name == name {
			return ts, true
		}
	}
	return throttle.TenantStatus{}, false
}

// NewTask stores the Tenant in its header, beside the Key and the Cost.
func TestNewTaskTenantSetsItsHeader(t *testing.T) {
	task := newTask(t, "crm:sync", []byte("p"), throttle.Key("crm"), throttle.Tenant("acme"), throttle.Cost(2), asynq.MaxRetry(3))
	assert.Equal(t, map[string]string{throttle.HeaderKey: "crm", tenantHeader: "acme", "throttle-cost": "2"}, task.Headers())
	assert.Equal(t, "crm:sync", task.Type())
	assert.Equal(t, "throttle.Tenant(\"acme\")", throttle.Tenant("acme").(fmt.Stringer).String())

	plain := newTask(t, "crm:sync", nil, throttle.Key("crm"))
	_, ok := plain.Headers()[tenantHeader]
	assert.False(t, ok, "a task without Tenant has no tenant header (the default tenant)")
}

// A tenant name follows the rules of keys; NewTask refuses a bad one, or a
// second Tenant, naming the option.
func TestNewTaskRefusesABadOrSecondTenant(t *testing.T) {
	bad := map[string]string{
		"empty":          "",
		"open brace":     "acme{1",
		"close brace":    "acme}",
		"too long":       strings.Repeat("t", throttle.MaxKeyLen+1),
		"NUL":            "ac\x00me",
		"newline":        "ac\nme",
		"invalid UTF-8":  "ac\xffme",
		"unprintable CR": "acme\r",
	}
	for name, tenant := range bad {
		t.Run(name, func(t *testing.T) {
			require.Error(t, throttle.ValidateKey(tenant), "ValidateKey accepts it: the case tests nothing")
			task, err := throttle.NewTask("crm:sync", nil, throttle.Key("crm"), throttle.Tenant(tenant))
			require.Error(t, err, "NewTask with Tenant(%q)", tenant)
			assert.Nil(t, task)
			assert.ErrorIs(t, err, throttle.ErrInvalidKey)
			assert.Contains(t, err.Error(), "Tenant", "the error names the option")
			assert.Contains(t, err.Error(), `"crm:sync"`, "the error names the task type")
		})
	}
	t.Run("longest valid", func(t *testing.T) {
		task := newTask(t, "crm:sync", nil, throttle.Tenant(strings.Repeat("t", throttle.MaxKeyLen)))
		assert.Len(t, task.Headers()[tenantHeader], throttle.MaxKeyLen)
	})
	t.Run("second Tenant", func(t *testing.T) {
		task, err := throttle.NewTask("crm:sync", nil, throttle.Tenant("acme"), throttle.Key("crm"), throttle.Tenant("globex"))
		require.Error(t, err)
		assert.Nil(t, task)
		assert.Contains(t, err.Error(), "second Tenant")
		assert.Contains(t, err.Error(), `"acme"`, "the error names the first tenant")
		assert.Contains(t, err.Error(), `"globex"`, "the error names the second one")
	})
}

// SetWeights refuses a weight out of 1..1000000 and a tenant name that is
// not a valid key, naming the key, the tenant and what is wrong; it writes
// nothing then, not even the valid weights beside the bad one.
func TestSetWeightsRefusesBadWeightsAndNames(t *testing.T) {
	r := newRig(t)
	r.setLimits("llm", throttle.PerSecond(10))
	for _, w := range []int{0, -1, 1_000_001} {
		err := r.lim.SetWeights(r.ctx, "llm", map[string]int{"gold": w, "silver": 2})
		require.Error(t, err, "weight %d", w)
		for _, want := range []string{`"llm"`, `"gold"`, "weight", fmt.Sprint(w)} {
			assert.Contains(t, err.Error(), want, "weight %d: the error names the key, the tenant and the field", w)
		}
	}
	for _, name := range []string{"", "go{ld", "go}ld", "go\x00ld", strings.Repeat("g", throttle.MaxKeyLen+1)} {
		err := r.lim.SetWeights(r.ctx, "llm", map[string]int{name: 2, "silver": 2})
		require.Error(t, err, "tenant %q", name)
		assert.ErrorIs(t, err, throttle.ErrInvalidKey, "tenant %q", name)
		assert.Contains(t, err.Error(), `"llm"`, "tenant %q: the error names the key", name)
		assert.Contains(t, err.Error(), "tenant", "tenant %q: the error names the field", name)
		quoted := fmt.Sprintf("%q", name)
		if len(name) > 64 {
			quoted = fmt.Sprintf("%q...", name[:64])
		}
		assert.Contains(t, err.Error(), quoted, "tenant %q: the error names the tenant", name)
	}
	err := r.lim.SetWeights(r.ctx, "ll{m", map[string]int{"gold": 2})
	assert.ErrorIs(t, err, throttle.ErrInvalidKey, "an invalid key")
	assert.Empty(t, r.inspect("llm").Tenants, "a refused SetWeights wrote weights")

	require.NoError(t, r.lim.SetWeights(r.ctx, "llm", map[string]int{"min": 1, "max": 1_000_000}), "the bounds are valid weights")
}

// Weights set are shown by Inspect (a tenant with a weight and no work:
// share 0), replace the ones before, and nil puts every tenant back to 1.
func TestSetWeightsShowInInspectAndNilResetsThem(t *testing.T) {
	r := newRig(t)
	r.setLimits("llm", throttle.PerSecond(10))
	require.NoError(t, r.lim.SetWeights(r.ctx, "llm", map[string]int{"gold": 3, "silver": 2}))
	s := r.inspect("llm")
	require.Len(t, s.Tenants, 2, "%+v", s.Tenants)
	for name, w := range map[string]int{"gold": 3, "silver": 2} {
		ts, ok := tenantNamed(s, name)
		require.True(t, ok, "tenant %q in %+v", name, s.Tenants)
		assert.Equal(t, throttle.TenantStatus{Name: name, Weight: w}, ts, "a tenant with a weight and no work")
	}

	require.NoError(t, r.lim.SetWeights(r.ctx, "llm", map[string]int{"gold": 5}))
	s = r.inspect("llm")
	require.Len(t, s.Tenants, 1, "silver's weight was replaced: %+v", s.Tenants)
	assert.Equal(t, throttle.TenantStatus{Name: "gold", Weight: 5}, s.Tenants[0])

	require.NoError(t, r.lim.SetWeights(r.ctx, "llm", nil))
	assert.Empty(t, r.inspect("llm").Tenants, "nil resets every weight")
	assert.Empty(t, r.mr.HGet(bucket("llm"), "w:gold"), "gold's weight field is gone")
}

// bookAlternately books n tasks each of tenants a and b, alternately, at
// the rig's clock, then for `until` brings each back at its reserved
// instant (in steps of 10 ms, as a fleet would) until it runs, and returns
// how many of each ran in the first second. (A booking is where a task comes back, not when
// it runs: one booked before the other tenant's backlog was all there is
// found not due and booked again.)
func bookAlternately(r *rig, key, a, b string, n int, until time.Duration) (inFirst map[string]int) {
	type task struct {
		id, tenant string
		back       time.Time
		ran        bool
	}
	var tasks []*task
	for i := range n {
		for _, tn := range []string{a, b} {
			tasks = append(tasks, &task{id: fmt.Sprintf("%s-%d", tn, i), tenant: tn, back: epoch()})
		}
	}
	inFirst = map[string]int{}
	for step := 0; step <= int(until/(10*time.Millisecond)); step++ {
		now := epoch().Add(time.Duration(step) * 10 * time.Millisecond)
		r.advance(now.Sub(r.now))
		for _, k := range tasks {
			if k.ran || k.back.After(now) {
				continue
			}
			d := r.reserveAs(key, k.id, k.tenant)
			switch {
			case d.Allowed:
				k.ran = true
				if now.Before(epoch().Add(time.Second)) {
					inFirst[k.tenant]++
				}
			case throttle.Reserved(d):
				k.back = throttle.ReservedAt(d)
			default:
				k.back = now.Add(d.RetryAfter)
			}
		}
	}
	return inFirst
}

// Weights divide the rate while both tenants have work booked: gold (3)
// gets 3 of every 4 runs of the first second, plain (1) the fourth; with
// equal weights, half each.
func TestSetWeightsDivideTheRate(t *testing.T) {
	t.Run("gold 3", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("llm", throttle.PerSecond(40).WithBurst(1))
		require.NoError(t, r.lim.SetWeights(r.ctx, "llm", map[string]int{"gold": 3}))
		n := bookAlternately(r, "llm", "gold", "plain", 40, 990*time.Millisecond)
		share := float64(n["gold"]) / float64(n["gold"]+n["plain"])
		assert.InDelta(t, 0.75, share, 0.05, "gold's share of the first second (%v)", n)
		// (At most the bound; a burst of 1 runs a little below its rate.)
		assert.LessOrEqual(t, n["gold"]+n["plain"], 41, "the key's rate in the first second (%v)", n)
		assert.Greater(t, n["gold"]+n["plain"], 25, "the key's rate in the first second (%v)", n)

		s := r.inspect("llm")
		gold, ok := tenantNamed(s, "gold")
		require.True(t, ok, "%+v", s.Tenants)
		plain, ok := tenantNamed(s, "plain")
		require.True(t, ok, "%+v", s.Tenants)
		assert.Equal(t, 3, gold.Weight)
		assert.Equal(t, 1, plain.Weight)
		assert.InDelta(t, 0.75, gold.Share, 1e-9)
		assert.InDelta(t, 0.25, plain.Share, 1e-9)
	})
	t.Run("equal", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("llm", throttle.PerSecond(40).WithBurst(1))
		n := bookAlternately(r, "llm", "gold", "plain", 40, 990*time.Millisecond)
		share := float64(n["gold"]) / float64(n["gold"]+n["plain"])
		assert.InDelta(t, 0.5, share, 0.05, "gold's share of the first second (%v)", n)
	})
	t.Run("set while both wait", func(t *testing.T) {
		// Tenants with work booked count with their new weight at once.
		r := newRig(t)
		r.setLimits("llm", throttle.PerSecond(40).WithBurst(1))
		bookAlternately(r, "llm", "gold", "plain", 10, 0)
		gold, _ := tenantNamed(r.inspect("llm"), "gold")
		assert.InDelta(t, 0.5, gold.Share, 1e-9, "before SetWeights")
		require.NoError(t, r.lim.SetWeights(r.ctx, "llm", map[string]int{"gold": 3}))
		gold, _ = tenantNamed(r.inspect("llm"), "gold")
		assert.Equal(t, 3, gold.Weight)
		assert.InDelta(t, 0.75, gold.Share, 1e-9, "after SetWeights")
		require.NoError(t, r.lim.SetWeights(r.ctx, "llm", nil))
		gold, _ = tenantNamed(r.inspect("llm"), "gold")
		assert.Equal(t, 1, gold.Weight)
		assert.InDelta(t, 0.5, gold.Share, 1e-9, "after SetWeights(nil)")
	})
}

// enqueueBacklogs enqueues through Limiter.Enqueue a heavy tenant's
// backlog, then a light tenant's few tasks (with tenants "" both: without
// Tenant), on a key whose bucket is empty, and returns the reserved times
// and asynq's run times of each.
func enqueueBacklogs(t *testing.T, r *rig, heavyTenant, lightTenant string) (heavy, light []time.Time, heavyAt, lightAt []time.Time) {
	t.Helper()
	const key = "crm"
	r.setLimits(key, throttle.PerSecond(10).WithBurst(1))
	assertAllowed(t, r.take(key), "Take of the burst")
	client := asynq.NewClientFromRedisClient(r.rdb)
	enqueue := func(tenant string, n int) (reserved, runAt []time.Time) {
		for range n {
			opts := []asynq.Option{throttle.Key(key)}
			if tenant != "" {
				opts = append(opts, throttle.Tenant(tenant))
			}
			info, err := r.lim.Enqueue(r.ctx, client, newTask(t, "crm:sync", nil, opts...))
			require.NoError(t, err)
			// (Scheduled, or pending when due within the current second:
			// paced, its worker waits for the instant itself.)
			require.Contains(t, []asynq.TaskState{asynq.TaskStateScheduled, asynq.TaskStatePending}, info.State, "task %s", info.ID)
			at, ok, err := throttle.Reservation(r.lim, r.ctx, key, info.ID)
			require.NoError(t, err)
			require.True(t, ok, "task %s holds a reservation", info.ID)
			reserved = append(reserved, at)
			runAt = append(runAt, info.NextProcessAt)
		}
		return reserved, runAt
	}
	heavy, heavyAt = enqueue(heavyTenant, 30)
	light, lightAt = enqueue(lightTenant, 3)
	return heavy, light, heavyAt, lightAt
}

// A light tenant's tasks enqueued through Limiter.Enqueue behind a heavy
// tenant's backlog are reserved at its share from now, not behind the
// backlog, and asynq runs them then; without tenants the same tasks queue
// first come first served, behind the backlog.
func TestEnqueueLightTenantIsNotScheduledBehindAHeavyBacklog(t *testing.T) {
	// Redis's clock at the wall clock's (to the microsecond), so that the
	// run times Enqueue gives asynq (from now) match the reserved ones.
	start := time.Now().Truncate(time.Microsecond)

	t.Run("tenants", func(t *testing.T) {
		r := newRig(t, quietLog)
		r.setClock(start)
		heavy, light, heavyAt, lightAt := enqueueBacklogs(t, r, "big", "small")
		last := heavy[len(heavy)-1]
		assert.GreaterOrEqual(t, last.Sub(start), 2900*time.Millisecond, "the heavy backlog at 10/s: %v", heavy)
		for i, at := range light {
			assert.Less(t, at.Sub(start), 1200*time.Millisecond, "light task %d is reserved at its share from now (heavy's last at +%v)", i, last.Sub(start))
		}
		// Then at half the rate, interleaved with the heavy tenant's.
		assert.InDelta(t, 200*time.Millisecond, light[2].Sub(light[1]), float64(30*time.Millisecond), "light's spacing: half of 10/s")
		// asynq runs them at those times (on the whole second before a
		// paced instant), not after the backlog.
		assert.True(t, lightAt[2].Before(heavyAt[len(heavyAt)-1]), "light's last run time %v, heavy's last %v", lightAt[2], heavyAt[len(heavyAt)-1])
		assert.Less(t, lightAt[2].Sub(start), 2*time.Second, "light's last run time")
		s := r.inspect("crm")
		big, ok := tenantNamed(s, "big")
		require.True(t, ok, "%+v", s.Tenants)
		small, ok := tenantNamed(s, "small")
		require.True(t, ok, "%+v", s.Tenants)
		assert.Greater(t, big.Backlog, small.Backlog)
		assert.InDelta(t, 1, big.Share+small.Share, 1e-9)
	})
	t.Run("no tenants: first come, first served", func(t *testing.T) {
		r := newRig(t, quietLog)
		r.setClock(start)
		heavy, light, heavyAt, lightAt := enqueueBacklogs(t, r, "", "")
		last := heavy[len(heavy)-1]
		for i, at := range light {
			assert.True(t, at.After(last), "light task %d reserved at +%v, after the backlog's last (+%v)", i, at.Sub(start), last.Sub(start))
		}
		// (asynq's run times are whole seconds, and these a few
		// microseconds after them.)
		assert.False(t, lightAt[0].Truncate(time.Second).Before(heavyAt[len(heavyAt)-1].Truncate(time.Second)),
			"light's first run time %v, heavy's last %v", lightAt[0], heavyAt[len(heavyAt)-1])
		assert.Empty(t, r.inspect("crm").Tenants)
	})
}

// bookTenant makes tenant a backlog of n tasks on key (its first may be
// admitted), so that tenants share the key from then on.
func bookTenant(r *rig, key, tenant string, n int) {
	r.t.Helper()
	for i := range n {
		r.reserveAs(key, fmt.Sprintf("%s-%d", tenant, i), tenant)
	}
	_, ok := tenantNamed(r.inspect(key), tenant)
	require.True(r.t, ok, "tenant %q has work booked", tenant)
}

// A Take (no tenant) on a key that tenants share is decided as the default
// tenant: no error, it waits for its own turn (not behind the tenants'
// backlog), and is admitted then. The Limiter decides the key fairly from
// then on.
func TestTakeOnASharedKeyIsDecidedAsTheDefaultTenant(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10).WithBurst(1))
	calls := &countHook{}
	otherRdb := redis.NewClient(&redis.Options{Addr: r.mr.Addr()})
	t.Cleanup(func() { _ = otherRdb.Close() })
	otherRdb.AddHook(calls)
	other := throttle.NewLimiter(otherRdb) // a process that did not book
	bookTenant(r, "k", "a", 20)            // 2 s of a's work
	require.False(t, throttle.DecidesFair(other, "k"))

	d, err := other.Take(r.ctx, "k")
	require.NoError(t, err, "Take on a shared key")
	assert.True(t, throttle.DecidesFair(other, "k"), "the key is known to be shared")
	if !d.Allowed {
		assert.Greater(t, d.RetryAfter, time.Duration(0), "%+v", d)
		assert.LessOrEqual(t, d.RetryAfter, 200*time.Millisecond, "the default tenant's turn, not after a's 2 s: %+v", d)
		r.advance(d.RetryAfter)
		d, err = other.Take(r.ctx, "k")
		require.NoError(t, err)
	}
	assertAllowed(t, d, "Take at the default tenant's turn")
	// Known to be shared, the key is decided as the default tenant at
	// once: one call, not a refusal to ask again and a second one.
	throttle.FlushIndex(other)
	before := calls.n.Load()
	_, err = other.Take(r.ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, int64(1), calls.n.Load()-before, "Redis commands of a Take on a key known to be shared")
	def, ok := tenantNamed(r.inspect("k"), "")
	require.True(t, ok, "the default tenant has work booked: %+v", r.inspect("k").Tenants)
	assert.InDelta(t, 0.5, def.Share, 1e-9, "the default tenant's share beside a")

	// TakeN as well, in a process that knows nothing yet.
	r.advance(time.Second)
	third := throttle.NewLimiter(r.rdb)
	d, err = third.Take(r.ctx, "k", throttle.Cost(1))
	require.NoError(t, err, "TakeN on a shared key")
	assert.True(t, throttle.DecidesFair(third, "k"))
	assertAllowed(t, d, "TakeN with the bucket full")
}

// A task without a Tenant, in the middleware, on a key that tenants share,
// runs as the default tenant (no Failed, no error) and its event says
// tenant ""; a tenant's task's event says its tenant.
func TestMiddlewareTaskWithoutTenantOnASharedKeyRunsAsTheDefault(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10).WithBurst(1))
	bookTenant(r, "k", "a", 20)
	r.advance(time.Second) // a token for the next task (a's holders are away)

	lim := throttle.NewLimiter(r.rdb, quietLog, throttle.WithHeadroom(0))
	ev := recordEvents(lim)
	// a's next task is not due: its turn is after the work a booked, even
	// with a token free (the tenant is what the decision is about).
	ran, err := runThrough(t, lim, newTask(t, "k:sync", []byte("a"), throttle.Key("k"), throttle.Tenant("a")))
	require.NoError(t, err, "deferred by a copy outside a server")
	got := ev.last(t)
	assert.False(t, ran, "a's task ran out of its turn: %+v", got)
	assert.Equal(t, throttle.Deferred, got.Outcome, "%+v", got)
	assert.Equal(t, throttle.RefusedByQueue, got.Reason, "%+v", got)
	assert.Greater(t, got.Delay, 500*time.Millisecond, "a's turn is behind its backlog: %+v", got)
	assert.Equal(t, "a", got.Tenant)

	ran, err = runThrough(t, lim, newTask(t, "k:sync", nil, throttle.Key("k")))
	require.NoError(t, err)
	got = ev.last(t)
	assert.True(t, ran, "the handler ran: %+v", got)
	assert.Equal(t, throttle.Ran, got.Outcome, "%+v", got)
	assert.NoError(t, got.Err)
	assert.Equal(t, "", got.Tenant)
	assert.True(t, throttle.DecidesFair(lim, "k"), "the key is known to be shared")

	r.advance(time.Second)
	ran, err = runThrough(t, lim, newTask(t, "k:sync", nil, throttle.Key("k"), throttle.Tenant("b")))
	require.NoError(t, err)
	got = ev.last(t)
	assert.True(t, ran, "b's first task: %+v", got)
	assert.Equal(t, throttle.Ran, got.Outcome)
	assert.Equal(t, "b", got.Tenant)

	// Refused (the bucket is empty now): deferred, not failed, and still
	// the task's tenant in the event.
	ran, err = runThrough(t, lim, newTask(t, "k:sync", []byte("2"), throttle.Key("k"), throttle.Tenant("b")))
	require.NoError(t, err, "deferred by a copy outside a server")
	got = ev.last(t)
	assert.False(t, ran)
	assert.Equal(t, throttle.Deferred, got.Outcome, "%+v", got)
	assert.Equal(t, "b", got.Tenant)
	ran, err = runThrough(t, lim, newTask(t, "k:sync", []byte("3"), throttle.Key("k")))
	require.NoError(t, err)
	got = ev.last(t)
	assert.False(t, ran)
	assert.Equal(t, throttle.Deferred, got.Outcome, "%+v", got)
	assert.Equal(t, "", got.Tenant)
}

// Inspect lists the tenants with work booked, with their weights and
// shares (summing to 1), their backlogs and what they were admitted; a key
// whose tasks have no tenants lists none, even with a backlog.
func TestInspectReportsTheTenants(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(10).WithBurst(1))
	require.NoError(t, r.lim.SetWeights(r.ctx, "k", map[string]int{"b": 3, "idle": 5}))
	bookTenant(r, "k", "a", 6)
	bookTenant(r, "k", "b", 6)

	s := r.inspect("k")
	sum := 0.0
	for _, name := range []string{"a", "b"} {
		ts, ok := tenantNamed(s, name)
		require.True(t, ok, "%+v", s.Tenants)
		assert.Greater(t, ts.Backlog, 0.0, "tenant %q has work booked", name)
		assert.Greater(t, ts.Share, 0.0, "tenant %q", name)
		sum += ts.Share
	}
	assert.InDelta(t, 1, sum, 1e-9, "shares of the active tenants: %+v", s.Tenants)
	a, _ := tenantNamed(s, "a")
	b, _ := tenantNamed(s, "b")
	assert.Equal(t, 1, a.Weight)
	assert.Equal(t, 3, b.Weight)
	assert.InDelta(t, 0.25, a.Share, 1e-9)
	assert.InDelta(t, 0.75, b.Share, 1e-9)
	idle, ok := tenantNamed(s, "idle")
	require.True(t, ok, "a tenant with a weight and no work is listed: %+v", s.Tenants)
	assert.Equal(t, throttle.TenantStatus{Name: "idle", Weight: 5}, idle)
	assert.Len(t, s.Tenants, 3, "%+v", s.Tenants)
	assert.Equal(t, 11, s.Reservations, "a's first task was admitted, the rest reserved")

	keys, err := r.lim.Keys(r.ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"k"}, keys, "the tenants' Redis keys are the key's")

	t.Run("no tenants", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(10).WithBurst(1))
		for i := range 6 {
			r.reserve("k", fmt.Sprint("t", i), time.Minute, 0)
		}
		s := r.inspect("k")
		assert.Equal(t, 5, s.Reservations)
		assert.Empty(t, s.Tenants, "a key without tenants")
	})
}

// Leases are off for a tenant's tasks and on a key tenants share: every
// such task is decided in Redis and takes its own cost, never a lease (a
// lease would run tasks outside their tenants' turns). A task without a
// tenant on a key without tenants still leases.
func TestTenantTasksNeverLease(t *testing.T) {
	r := newRig(t)
	r.setLimits("plain", throttle.PerHour(1000))
	r.setLimits("crm", throttle.PerHour(1000))
	lim := throttle.NewLimiter(r.rdb, quietLog, throttle.WithLease(8, time.Minute))
	ev := recordEvents(lim)
	run := func(task *asynq.Task) throttle.Event {
		t.Helper()
		ran, err := runThrough(t, lim, task)
		require.NoError(t, err)
		require.True(t, ran)
		return ev.last(t)
	}
	tokens := func(key string) float64 { return r.inspect(key).Tokens[0] }

	// The control: a task without tenant leases 7 more tokens, the next
	// one runs on them.
	assert.False(t, run(newTask(t, "plain:sync", nil)).Leased)
	assert.InDelta(t, 992, tokens("plain"), 1e-6, "1 taken and 7 leased")
	assert.True(t, run(newTask(t, "plain:sync", nil)).Leased, "the lease works here: the test can tell")
	// A tenant's task does not run on the tokens leased for the key's
	// other tasks either.
	got := run(newTask(t, "plain:sync", nil, throttle.Tenant("acme")))
	assert.False(t, got.Leased, "a tenant's task on a token leased before")
	assert.InDelta(t, 991, tokens("plain"), 1e-6, "the tenant's task took its own token in Redis")

	for i := range 3 {
		got := run(newTask(t, "crm:sync", nil, throttle.Tenant("acme")))
		assert.False(t, got.Leased, "tenant task %d", i)
		assert.Equal(t, "acme", got.Tenant)
		assert.InDelta(t, float64(999-i), tokens("crm"), 1e-6, "tenant task %d took its cost alone", i)
	}

	t.Run("a shared key", func(t *testing.T) {
		r := newRig(t)
		r.setLimits("k", throttle.PerSecond(100).WithBurst(100))
		lim := throttle.NewLimiter(r.rdb, quietLog, throttle.WithLease(8, time.Minute), throttle.WithHeadroom(0))
		ev := recordEvents(lim)
		// Tenant a waits: a drained bucket, then 5 of a's tasks of cost
		// 100 booked (5 s of work).
		d, err := r.lim.Take(r.ctx, "k", throttle.Cost(100))
		require.NoError(t, err)
		require.True(t, d.Allowed)
		for i := range 5 {
			d, err := throttle.ReserveAs(r.lim, r.ctx, "k", fmt.Sprint("a", i), "a", 100, time.Minute, 0)
			require.NoError(t, err)
			require.True(t, throttle.Reserved(d), "%+v", d)
		}
		// Half the bucket back, before a's first holder is due (at 1 s: a
		// late holder coming back would take the turn, as it should).
		r.advance(500 * time.Millisecond)
		full := r.inspect("k").Tokens[0]
		require.InDelta(t, 50, full, 1e-6)
		for i := range 3 {
			ran, err := runThrough(t, lim, newTask(t, "k:sync", nil))
			require.NoError(t, err)
			got := ev.last(t)
			require.True(t, ran, "task %d without tenant: %+v", i, got)
			assert.False(t, got.Leased, "task %d without tenant on a shared key", i)
			assert.InDelta(t, full-float64(i+1), r.inspect("k").Tokens[0], 1e-6, "task %d took its cost alone, no lease", i)
		}
	})
}

// A task with a Tenant on a key without limits, or without a key, runs
// unthrottled as before, through the middleware and Enqueue alike.
func TestTenantOnAnUnthrottledKeyRunsAsBefore(t *testing.T) {
	r := newRig(t, quietLog)
	lim := r.lim
	ev := recordEvents(lim)
	client := asynq.NewClientFromRedisClient(r.rdb)

	for _, c := range []struct {
		task   *asynq.Task
		tenant string // in its event
	}{
		{newTask(t, "crm:sync", nil, throttle.Key("crm"), throttle.Tenant("acme")), "acme"}, // a key without limits
		{newTask(t, "sync", nil, throttle.Tenant("acme")), ""},                              // no key: no tenant either
	} {
		task := c.task
		ran, err := runThrough(t, lim, task)
		require.NoError(t, err, "task %q", task.Type())
		got := ev.last(t)
		assert.True(t, ran, "task %q: %+v", task.Type(), got)
		assert.Equal(t, throttle.Unthrottled, got.Outcome, "task %q", task.Type())
		assert.Equal(t, c.tenant, got.Tenant, "task %q", task.Type())

		info, err := lim.Enqueue(r.ctx, client, task)
		require.NoError(t, err, "Enqueue of task %q", task.Type())
		assert.Equal(t, asynq.TaskStatePending, info.State, "task %q is enqueued as is", task.Type())
	}
	for _, k := range r.mr.Keys() {
		assert.False(t, strings.HasPrefix(k, throttle.DefaultPrefix+":"), "the limiter wrote %s", k)
	}
}

// A tenant header that is not a valid name (a producer that set it by
// hand) can never be decided: the middleware fails the task for good, and
// Enqueue refuses it, both naming the header.
func TestBadTenantHeaderIsRejected(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	ev := recordEvents(r.lim)
	task := asynq.NewTaskWithHeaders("crm:sync", nil, map[string]string{throttle.HeaderKey: "crm", tenantHeader: "ac{me"})

	ran, err := runThrough(t, r.lim, task)
	assert.False(t, ran)
	require.Error(t, err)
	assert.True(t, errors.Is(err, asynq.SkipRetry), "failed for good: %v", err)
	assert.ErrorIs(t, err, throttle.ErrInvalidKey)
	assert.Contains(t, err.Error(), tenantHeader)
	assert.Equal(t, throttle.Rejected, ev.last(t).Outcome)

	_, err = r.lim.Enqueue(r.ctx, asynq.NewClientFromRedisClient(r.rdb), task)
	require.Error(t, err)
	assert.ErrorIs(t, err, throttle.ErrInvalidKey)
	assert.Contains(t, err.Error(), "Tenant")
	assert.InDelta(t, 10, r.inspect("crm").Tokens[0], 1e-9, "nothing taken for it")
}
