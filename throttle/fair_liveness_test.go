package throttle_test

// Liveness of fair shares (issue 29, items 1 to 4): work a tenant booked
// that will never run (tasks deleted from asynq, duplicates asynq refused,
// bookings a Resume or SetLimits dropped) must not keep its next tasks, or
// another tenant's, from running on a key with room.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// followUntilAdmitted decides for task id of tenant as the middleware
// would, coming back at each time it is told (rounded up to a whole
// second, as asynq brings a task back), and returns how long from now it
// took to be admitted; the test fails when it was not within limit.
func (r *rig) followUntilAdmitted(key, id, tenant string, limit time.Duration) time.Duration {
	r.t.Helper()
	start := r.now
	for r.now.Sub(start) <= limit {
		d, err := throttle.ReserveAs(r.lim, r.ctx, key, id, tenant, 1, time.Minute, time.Second)
		require.NoError(r.t, err)
		if d.Allowed {
			return r.now.Sub(start)
		}
		wait := d.RetryAfter
		if throttle.Reserved(d) {
			wait = throttle.ReservedAt(d).Sub(r.now)
		}
		back := r.now.Add(max(wait, time.Millisecond))
		if t := back.Truncate(time.Second); t.Before(back) {
			back = t.Add(time.Second)
		}
		r.advance(back.Sub(r.now))
	}
	r.t.Fatalf("task %s of tenant %q not admitted within %v on key %q (epoch+%v)", id, tenant, limit, key, r.since())
	return 0
}

// pending is a task waiting in asynq: it comes back at due.
type pending struct {
	id, tenant string
	due        time.Time
}

// drain brings the waiting tasks back as asynq would (each at its time,
// rounded up to a whole second), deciding each as the middleware does,
// until every one was admitted; it fails the test when they were not all
// admitted within limit, and returns how long they took.
func (r *rig) drain(key string, tasks []pending, limit time.Duration) time.Duration {
	r.t.Helper()
	start := r.now
	for len(tasks) > 0 {
		next := 0
		for i, p := range tasks {
			if p.due.Before(tasks[next].due) {
				next = i
			}
		}
		p := tasks[next]
		if p.due.After(r.now) {
			r.advance(p.due.Sub(r.now))
		}
		if r.now.Sub(start) > limit {
			r.t.Fatalf("%d tasks not admitted within %v on key %q (epoch+%v), next %+v", len(tasks), limit, key, r.since(), p)
		}
		d, err := throttle.ReserveAs(r.lim, r.ctx, key, p.id, p.tenant, 1, time.Minute, time.Second)
		require.NoError(r.t, err)
		if d.Allowed {
			tasks = append(tasks[:next], tasks[next+1:]...)
			continue
		}
		wait := d.RetryAfter
		if throttle.Reserved(d) {
			wait = throttle.ReservedAt(d).Sub(r.now)
		}
		back := r.now.Add(max(wait, time.Millisecond))
		if t := back.Truncate(time.Second); t.Before(back) {
			back = t.Add(time.Second)
		}
		tasks[next].due = back
	}
	return r.now.Sub(start)
}

// arrive returns n new tasks of tenant arriving every gap from now (the
// clock moves with them), each to be decided when it arrives.
func (r *rig) arrive(key, tenant, prefix string, n int, gap time.Duration) []pending {
	r.t.Helper()
	var out []pending
	for i := range n {
		out = append(out, pending{id: fmt.Sprintf("%s-%d", prefix, i), tenant: tenant, due: r.now.Add(time.Duration(i) * gap)})
	}
	return out
}

// Item 1: tasks a tenant booked, then deleted from asynq (they never come
// back), hold its next tasks back for the work they booked and two
// granules of grace at most, not forever: with its next tasks coming back
// often, the fair clock never reached them.
func TestFairWorkThatNeverComesBackDoesNotStarveItsTenant(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	for i := range 40 {
		// The first ten run; the thirty booked after them are deleted from
		// asynq before their time.
		_, err := throttle.ReserveAs(r.lim, r.ctx, "crm", fmt.Sprintf("gone-%d", i), "acme", 1, time.Minute, time.Second)
		require.NoError(t, err)
	}
	r.advance(500 * time.Millisecond)
	took := r.drain("crm", r.arrive("crm", "acme", "next", 21, 100*time.Millisecond), 40*time.Second)
	// 30 tasks booked at 10/s: 3 s of booked work, two granules of grace
	// for the script to learn they are gone, 21 tasks at 10/s, and a
	// granule or two of asynq's rounding.
	assert.LessOrEqual(t, took, 10*time.Second, "the tenant's 21 next tasks waited %v behind work that never came", took)
}

// Item 2: Enqueue's bookings of duplicates asynq refused leave nothing
// behind: the tenant's next task on an idle key runs at once.
func TestFairReleasedDuplicatesLeaveTheTenantsPlace(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	for i := range 30 {
		id := fmt.Sprintf("dup-%d", i)
		d, err := throttle.BookAs(r.lim, r.ctx, "crm", id, "acme", 1)
		require.NoError(t, err)
		require.True(t, throttle.Reserved(d), "booking %d: %+v", i, d)
		throttle.ReleaseBooking(r.lim, r.ctx, "crm", id, "acme", 1)
	}
	assert.Empty(t, mustZ(t, r, "crm", "r"), "reservations left after releasing every booking")
	took := r.drain("crm", r.arrive("crm", "acme", "real", 21, 50*time.Millisecond), 40*time.Second)
	// 21 tasks at 10/s burst 10: the burst, then 11 more over 1.1 s, and a
	// granule of asynq's rounding.
	assert.LessOrEqual(t, took, 3*time.Second, "after 30 released duplicates the tenant's 21 tasks took %v on an idle key", took)
}

func mustZ(t *testing.T, r *rig, key, part string) []string {
	t.Helper()
	m, err := r.mr.ZMembers(redisKey(key, part))
	if err != nil {
		return nil
	}
	return m
}

// Item 3: Resume drops the tenants' places booked during the suspension,
// so the tasks it brings back are not tagged behind their own work.
func TestFairResumeDropsTheTenantsBookedWork(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	r.suspend("crm", 30*time.Second)
	for i := range 30 {
		_, err := throttle.ReserveAs(r.lim, r.ctx, "crm", fmt.Sprintf("t-%d", i), "acme", 1, time.Minute, time.Second)
		require.NoError(t, err)
	}
	r.advance(time.Second)
	n, err := r.lim.Resume(r.ctx, "crm")
	require.NoError(t, err)
	assert.Zero(t, n, "no asynq task to bring back here")
	assert.Empty(t, mustZ(t, r, "crm", "t"), "start tags left after Resume")
	assert.Empty(t, mustZ(t, r, "crm", "a"), "active tenants left after Resume")
	fields, _ := r.rdb.HKeys(r.ctx, bucket("crm")).Result()
	for _, f := range fields {
		assert.NotRegexp(t, `^t:|^G$`, f, "fair state left after Resume")
	}
	// The tasks come back (Resume runs them now) and run at the key's rate,
	// with more of the tenant's arriving.
	var back []pending
	for i := range 30 {
		back = append(back, pending{id: fmt.Sprintf("t-%d", i), tenant: "acme", due: r.now})
	}
	took := r.drain("crm", append(back, r.arrive("crm", "acme", "new", 10, 100*time.Millisecond)...), 40*time.Second)
	assert.LessOrEqual(t, took, 5*time.Second, "40 tasks at 10/s after Resume took %v", took)
}

// Item 4: after SetLimits, SetWeights counts no tenant that is not active:
// a tenant alone on the idle key gets the whole rate.
func TestFairSetWeightsAfterSetLimitsCountsOnlyActiveTenants(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	for i := range 30 {
		_, err := throttle.ReserveAs(r.lim, r.ctx, "crm", fmt.Sprintf("big-%d", i), "big", 1, time.Minute, time.Second)
		require.NoError(t, err)
	}
	r.setLimits("crm", throttle.PerSecond(20))
	require.NoError(t, r.lim.SetWeights(r.ctx, "crm", map[string]int{"big": 9}))
	st := r.inspect("crm")
	for _, ts := range st.Tenants {
		assert.Zero(t, ts.Share, "tenant %q has a share with no work booked: %+v", ts.Name, ts)
	}
	// "small" alone: 40 tasks at 20/s take about 1 s after the burst, not
	// ten times that.
	took := r.drain("crm", r.arrive("crm", "small", "small", 40, 10*time.Millisecond), 40*time.Second)
	assert.LessOrEqual(t, took, 3*time.Second, "a tenant alone on the idle key took %v for 40 tasks at 20/s", took)
}

// A task refused while the key is suspended is told its tenant's turn
// counted from the suspension's end: the fair clock stands still while
// nothing is served. Counted from the refusal, every turn within the
// suspension's length was told the suspension's end, and the whole backlog
// came back at once, was found not due and was deferred again (found while
// reading a failure of the model's soak, whose tasks, all booked during a
// suspension, were all told its end). On PerSecond(10), tenants a and b
// book 20 tasks each during a suspension of 30 s: once it ends they run at
// 5/s each, the last of each at 3.8 s past the end. Fails before the fix
// with both told the end.
func TestFairTurnsBookedDuringASuspensionCountFromItsEnd(t *testing.T) {
	r := newRig(t, quietLog)
	r.setLimits("crm", throttle.PerSecond(10))
	r.suspend("crm", 30*time.Second)
	end := r.now.Add(30 * time.Second)
	last := map[string]time.Time{}
	for i := range 20 {
		for _, tenant := range []string{"a", "b"} {
			d, err := throttle.ReserveAs(r.lim, r.ctx, "crm", fmt.Sprintf("%s-%d", tenant, i), tenant, 1, time.Minute, time.Second)
			require.NoError(t, err)
			require.False(t, d.Allowed, "admitted while suspended")
			require.True(t, throttle.Reserved(d), "task %d of %s not booked", i, tenant)
			at := throttle.ReservedAt(d)
			assert.False(t, at.Before(end), "task %d of %s told %v, before the suspension's end", i, tenant, at.Sub(end))
			last[tenant] = at
		}
	}
	for _, tenant := range []string{"a", "b"} {
		past := last[tenant].Sub(end)
		assert.True(t, past >= 3*time.Second && past <= 5*time.Second,
			"the last of %s's 20 tasks (its turn 3.8 s past the suspension's end at 5/s) told %v past it", tenant, past)
	}
}
