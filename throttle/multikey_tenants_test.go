package throttle_test

// Tenants on tasks of several keys (issue 30): on each key its tenants
// share, a task waits for its tenant's turn there, and a booking whose
// task is dropped gives its turn back.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// noStrayTags checks that every start tag on key's tenants' tags belongs
// to a task that still holds a reservation there.
func noStrayTags(t *testing.T, ctx context.Context, rdb redis.UniversalClient, key string) {
	t.Helper()
	ids, err := rdb.ZRange(ctx, "throttle:{"+key+"}:t", 0, -1).Result()
	require.NoError(t, err)
	for _, id := range ids {
		_, err := rdb.ZScore(ctx, "throttle:{"+key+"}:r", id).Result()
		assert.NoError(t, err, "the start tag of %s on %s belongs to a reservation", id, key)
	}
}

// Two tenants share the app key; each task also carries its workspace's
// key. Through Limiter.Enqueue: the heavy tenant's backlog of 6 s on app is
// booked first, and the light tenant's tasks are booked at its share of
// app (half its rate), not behind the backlog. Duplicates of a unique task
// of the light tenant, refused by asynq after their booking, give their
// turn back in every key: no start tag is left behind, and the light
// tenant's next tasks are not behind work that never comes.
func TestEnqueueOfSeveralKeysKeepsTenantsTurnsAndGivesBackDuplicates(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "ws1", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "ws2", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(10).WithBurst(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	reserved := func(key, id string) time.Time {
		t.Helper()
		at, ok, err := throttle.Reservation(lim, ctx, key, id)
		require.NoError(t, err)
		require.True(t, ok, "%s holds a reservation on %s", id, key)
		return at
	}
	var heavy []time.Time
	for i := range 60 {
		info, err := lim.Enqueue(ctx, client, newTask(t, "sync", []byte(fmt.Sprint("h", i)),
			throttle.Key("ws1", "app"), throttle.Tenant("heavy")))
		require.NoError(t, err)
		heavy = append(heavy, reserved("app", info.ID))
	}
	start := heavy[0]
	require.Greater(t, heavy[59].Sub(start), 5500*time.Millisecond, "heavy alone: its backlog booked at app's whole rate: %v", heavy)

	unique := newTask(t, "sync", []byte("light-unique"), throttle.Key("ws2", "app"), throttle.Tenant("light"))
	// (light's times count from its first Enqueue: the 60 above take a
	// while on a loaded machine, and the tenant's turn starts from now)
	lightStart := time.Now()
	info, err := lim.Enqueue(ctx, client, unique, asynq.Unique(time.Hour))
	require.NoError(t, err)
	light := []time.Time{reserved("app", info.ID)}
	for range 20 {
		_, err := lim.Enqueue(ctx, client, unique, asynq.Unique(time.Hour))
		require.True(t, errors.Is(err, asynq.ErrDuplicateTask), "a duplicate is refused: %v", err)
	}
	noStrayTags(t, ctx, rdb, "app")
	noStrayTags(t, ctx, rdb, "ws2")
	for i := range 3 {
		info, err := lim.Enqueue(ctx, client, newTask(t, "sync", []byte(fmt.Sprint("l", i)),
			throttle.Key("ws2", "app"), throttle.Tenant("light")))
		require.NoError(t, err)
		light = append(light, reserved("app", info.ID))
	}
	// (light's 4 tasks at half of 10/s: within about 0.8 s of its first
	// Enqueue, booked on the whole second after, so under 2 s; behind
	// heavy's backlog they would start 6 s after heavy's first, after its
	// last, behind the duplicates' work 4 s more)
	assert.Less(t, light[3].Sub(lightStart), 2*time.Second, "light's tasks are booked at its share of app: %v", light)
	assert.True(t, light[3].Before(heavy[59]), "light's tasks are booked before heavy's last (%v): %v", heavy[59], light)
}

// The middleware's decision (ReserveKeysAs: reserving, no booking): the
// heavy tenant's backlog reserved first does not hold the light tenant's
// task back beyond its turn on app.
func TestReserveOfSeveralKeysKeepsTenantsTurns(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "ws1", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "ws2", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(10).WithBurst(1)))
	var last time.Time
	for i := range 31 {
		d, err := throttle.ReserveKeysAs(lim, ctx, []string{"ws1", "app"}, fmt.Sprint("h", i), "heavy", time.Minute, time.Second, true)
		require.NoError(t, err)
		if !d.Allowed {
			last = throttle.ReservedAt(d)
		}
	}
	d, err := throttle.ReserveKeysAs(lim, ctx, []string{"ws2", "app"}, "l0", "light", time.Minute, time.Second, true)
	require.NoError(t, err)
	require.False(t, d.Allowed, "app's token went to heavy: %+v", d)
	assert.Equal(t, "app", d.Key)
	at := throttle.ReservedAt(d)
	assert.Less(t, time.Until(at), time.Second, "light's task waits for its turn on app (about 0.2 s), not behind heavy's backlog until %v", last)
}

// Through the middleware: a task of several keys with a Tenant, run while
// the app key's tenants are active (a heavy tenant's backlog booked
// there), is admitted at its tenant's turn and counted in the app key's
// fair state: its tenant becomes active there, its work counted as a task
// of the app key alone would be.
func TestMiddlewareCountsATaskOfSeveralKeysInItsTenantsShare(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "ws1", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "ws2", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(10).WithBurst(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	for i := range 10 {
		_, err := lim.Enqueue(ctx, client, newTask(t, "sync", []byte(fmt.Sprint("h", i)),
			throttle.Key("ws1", "app"), throttle.Tenant("heavy")))
		require.NoError(t, err)
	}
	ran := 0
	h := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran++
		return nil
	}))
	task := newTask(t, "sync", nil, throttle.Key("ws2", "app"), throttle.Tenant("light"))
	require.NoError(t, h.ProcessTask(ctx, task))
	require.Equal(t, 1, ran, "light's task runs at its turn: app's token was not booked by heavy's backlog")
	_, err := rdb.HGet(ctx, "throttle:{app}:b", "t:light").Result()
	assert.NoError(t, err, "light's run is counted in app's fair state")
	_, err = rdb.ZScore(ctx, "throttle:{app}:a", "light").Result()
	assert.NoError(t, err, "light is active on app")
	_, err = rdb.HGet(ctx, "throttle:{ws2}:b", "t:light").Result()
	assert.ErrorIs(t, err, redis.Nil, "ws2 had room and no tenant waiting: nothing to count there (as a task of ws2 alone)")
}
