package lua

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tenants' fair order for a task of several keys (issue 30, multi.lua):
// on each key its tenants share, the task waits for its tenant's turn
// there, and is counted in that key's fair state as a task of that key
// alone would be.

// multiFairArgs is a decision of tenant for task id at cost 1, reserving
// up to a minute ahead, exact instants (as fairArgs).
func multiFairArgs(tenant, id string) DecideArgs {
	return DecideArgs{Tenant: tenant, TaskID: id, Horizon: time.Minute, Lapse: time.Minute}
}

// multiFairTask is one task of a simulated backlog of tasks of several
// keys: its tenant, ID and keys (positions in multiEnv.ks), when it comes
// back, and when it ran.
type multiFairTask struct {
	tenant, id string
	keys       []int
	back       time.Duration
	ranAt      time.Duration
	ran        bool
}

// runMultiFair drives tasks as a fleet would on miniredis's clock: each is
// decided when it arrives (at back) and again when it comes back to its
// reservation (or after the wait it was told), in steps of 5 ms, until
// every task ran or until limit.
func runMultiFair(t *testing.T, e *multiEnv, tasks []*multiFairTask, limit time.Duration) {
	t.Helper()
	for now := time.Duration(0); now <= limit; now += 5 * time.Millisecond {
		e.at(now)
		left := 0
		for _, k := range tasks {
			if k.ran {
				continue
			}
			left++
			if k.back > now {
				continue
			}
			r := e.multi(multiFairArgs(k.tenant, k.id), k.keys...)
			switch r.Status {
			case StatusAllowed:
				k.ran, k.ranAt = true, now+r.Wait
			case StatusDenied:
				switch {
				case !r.Reserved.IsZero():
					k.back = r.Reserved.Sub(testEpoch())
				default:
					k.back = now + r.RetryAfter
				}
				if k.back <= now {
					k.back = now + 5*time.Millisecond
				}
			default:
				t.Fatalf("task %s at %v: %+v", k.id, now, r)
			}
		}
		if left == 0 {
			return
		}
	}
}

// Two tenants share app key c; each task carries its workspace's key too
// ([a c] for the heavy tenant, [b c] for the light one). The heavy one's
// backlog of 3 s on c is booked first; the light tenant's tasks, arriving
// just after, run at their share of c (half its rate), not behind the
// whole backlog.
func TestMultiFairLightTenantIsNotQueuedBehindTheHeavyBacklog(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(100, 1000, 100)) // workspace of "heavy": room to spare
	e.limits(1, bucket(100, 1000, 100)) // workspace of "light"
	e.limits(2, bucket(10, 1000, 1))    // the app: 10/s
	var tasks []*multiFairTask
	for i := range 31 {
		tasks = append(tasks, &multiFairTask{tenant: "heavy", id: fmt.Sprintf("h%d", i), keys: []int{0, 2}})
	}
	for i := range 5 {
		tasks = append(tasks, &multiFairTask{tenant: "light", id: fmt.Sprintf("l%d", i), keys: []int{1, 2}, back: 10 * time.Millisecond})
	}
	runMultiFair(t, e, tasks, 10*time.Second)
	var heavyLast, lightLast time.Duration
	for _, k := range tasks {
		require.True(t, k.ran, "task %s ran", k.id)
		if k.tenant == "light" {
			lightLast = max(lightLast, k.ranAt)
		} else {
			heavyLast = max(heavyLast, k.ranAt)
		}
	}
	// (light's 5 tasks at half of 10/s: about 1 s; behind heavy's backlog
	// they would end after 3.5 s)
	assert.Less(t, lightLast, 1500*time.Millisecond, "light's tasks ran at its share of c, not behind heavy's 3 s backlog")
	assert.Less(t, heavyLast, 4*time.Second, "c drains at its whole rate: 36 tasks at 10/s")
}

// All or nothing with tenants: a task refused by its workspace key takes
// nothing in the app key's fair state (no place booked for its tenant,
// no record), and no token of it.
func TestMultiFairRefusedByAnotherKeyLeavesTheFairStateAlone(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(1, hour, 1))
	e.limits(1, bucket(10, 1000, 1))
	// The app key's tenants are active: "other" waits there.
	for i := range 3 {
		e.multi(multiFairArgs("other", fmt.Sprintf("o%d", i)), 2, 1)
	}
	n, err := e.rdb.ZCard(e.ctx, e.ks[1].Tenants).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "other is active on b")
	// x's workspace key a is spent: x is refused, without a horizon (no
	// reservation), by a.
	e.at(time.Second) // (b has a token again)
	r := e.multi(DecideArgs{Tenant: "x"}, 0, 1)
	require.Equal(t, StatusAllowed, r.Status, "%+v", r)
	r = e.multi(DecideArgs{Tenant: "x"}, 0, 1)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	assert.Equal(t, 0, r.Key, "a refused")
	before, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:x").Result()
	require.NoError(t, err, "x's admission is counted on b's fair state")
	for range 3 {
		r = e.multi(DecideArgs{Tenant: "x"}, 0, 1)
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
	}
	after, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:x").Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "x's record on b (its finish tag) is as it was: refused by a, it took no turn of b")
}

// A task of several keys that books its turn on a key its tenants share
// leaves a start tag there, and Unbook (its enqueue failed) takes the tag
// and the work it added back: the tenant's next task is not behind it.
func TestMultiFairBookingIsUndoneByUnbook(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(100, 1000, 100))
	e.limits(1, bucket(1, 1000, 1))
	// "other" makes b's tenants active.
	e.multi(multiFairArgs("other", "o0"), 2, 1)
	e.multi(multiFairArgs("other", "o1"), 2, 1)
	book := func(id string) DecideReply {
		a := multiFairArgs("t", id)
		a.Book = true
		r := e.multi(a, 0, 1)
		require.Equal(t, StatusDenied, r.Status, "%+v", r)
		require.False(t, r.Reserved.IsZero(), "booked: %+v", r)
		return r.DecideReply
	}
	first := book("t1")
	_, err := e.rdb.ZScore(e.ctx, e.ks[1].Tags, "t1").Result()
	require.NoError(t, err, "t1's start tag on b")
	rec, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:t").Result()
	require.NoError(t, err, "t is active on b")
	for _, i := range []int{0, 1} {
		ok, err := Unbook(e.ctx, e.run, e.ks[i], "t1", "t", "1", nil)
		require.NoError(t, err)
		assert.True(t, ok, "t1's booking on key %d given up", i)
	}
	_, err = e.rdb.ZScore(e.ctx, e.ks[1].Tags, "t1").Result()
	assert.Error(t, err, "no start tag of t1 left on b")
	again, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:t").Result()
	require.NoError(t, err)
	assert.NotEqual(t, rec, again, "t's finish tag moved back")
	second := book("t2")
	assert.Equal(t, first.Reserved, second.Reserved, "t's next task takes the place t1 gave up")
}

// A holder whose one instant lies beyond the horizon now (another key of
// the task suspended longer) gives up its reservations, and on a key its
// tenants share its start tag and the work it added to its tenant's
// finish tag: back later, it is booked as a fresh task at the place it
// left, not behind its own work.
func TestMultiFairBookingDroppedBeyondTheHorizonIsGivenBack(t *testing.T) {
	e := newMultiEnv(t, false)
	e.limits(0, bucket(100, 1000, 100))
	e.limits(1, bucket(1, 1000, 1))
	a := func(id string) DecideArgs {
		x := multiFairArgs("t", id)
		x.Horizon = 10 * time.Second
		return x
	}
	e.multi(a("t0"), 0, 1) // (b's token)
	r := e.multi(a("t1"), 0, 1)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	rec, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:t").Result()
	require.NoError(t, err, "t is active on b")
	r = e.multi(a("t2"), 0, 1)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	require.False(t, r.Reserved.IsZero(), "t2 holds an instant: %+v", r)
	_, err = e.rdb.ZScore(e.ctx, e.ks[1].Tags, "t2").Result()
	require.NoError(t, err, "t2's start tag on b")
	_, err = Suspend(e.ctx, e.run, e.ks[0], time.Minute, time.Hour)
	require.NoError(t, err)
	e.at(r.Reserved.Sub(testEpoch()))
	r = e.multi(a("t2"), 0, 1)
	require.Equal(t, StatusDenied, r.Status, "%+v", r)
	assert.True(t, r.Reserved.IsZero(), "beyond the horizon: no instant held: %+v", r)
	_, err = e.rdb.ZScore(e.ctx, e.ks[1].Tags, "t2").Result()
	assert.Error(t, err, "no start tag of t2 left on b")
	_, err = e.rdb.ZScore(e.ctx, e.ks[1].Reservations, "t2").Result()
	assert.Error(t, err, "no reservation of t2 left on b")
	after, err := e.rdb.HGet(e.ctx, e.ks[1].Bucket, "t:t").Result()
	require.NoError(t, err)
	assert.Equal(t, rec, after, "t's finish tag on b is back where t1 left it")
}
