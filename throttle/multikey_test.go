package throttle_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Tasks of several keys (issue 30): Key with several names, decided all or
// nothing in one decision.

func TestKeyWithSeveralNamesTravelsInHeaders(t *testing.T) {
	task := newTask(t, "slack:post", nil, throttle.Key("slack:T0123:chat.postMessage", "slack:T0123", "slack"))
	assert.Equal(t, map[string]string{
		throttle.HeaderKey: "slack:T0123:chat.postMessage",
		"throttle-key-2":   "slack:T0123",
		"throttle-key-3":   "slack",
	}, task.Headers())
	one := newTask(t, "slack:post", nil, throttle.Key("slack"))
	assert.Equal(t, map[string]string{throttle.HeaderKey: "slack"}, one.Headers(), "one name: as before")
	assert.Equal(t, `throttle.Key("a", "b")`, throttle.Key("a", "b").String())
	assert.Equal(t, "a", throttle.Key("a", "b").Value(), "Value is the task's key, the first")
}

func TestNewTaskRefusesBadKeyNamesNamingTheirPosition(t *testing.T) {
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{"none", nil, "no name given"},
		{"five", []string{"a", "b", "c", "d", "e"}, "5 names: at most 4"},
		{"bad second", []string{"a", "b{x}"}, "name 2: "},
		{"empty third", []string{"a", "b", ""}, "name 3: "},
		{"twice", []string{"a", "b", "a"}, `name 3 "a": the same as name 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := throttle.NewTask("x", nil, throttle.Key(tt.names...))
			require.Error(t, err, "NewTask with Key(%q)", tt.names)
			assert.True(t, errors.Is(err, throttle.ErrInvalidKey), "errors.Is(%v, ErrInvalidKey)", err)
			assert.Contains(t, err.Error(), "throttle.Key: "+tt.want)
		})
	}
	_, err := throttle.NewTask("x", nil, throttle.Key("a{"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `NewTask("x"): Key: throttle: invalid key`, "one bad name: the error as before")
}

// Take with further keys: all or nothing; a refusal names the key and
// its tier.
func TestTakeOfSeveralKeysIsAllOrNothing(t *testing.T) {
	r := newRig(t)
	r.setLimits("ws", throttle.PerSecond(10))
	r.setLimits("app", throttle.PerSecond(100), throttle.PerHour(2))
	for i := range 2 {
		d, err := r.lim.Take(r.ctx, "ws", throttle.Key("app"))
		require.NoError(t, err)
		require.True(t, d.Allowed, "Take %d: %+v", i, d)
		assert.Empty(t, d.Key)
	}
	d, err := r.lim.Take(r.ctx, "ws", throttle.Key("app"))
	require.NoError(t, err)
	require.False(t, d.Allowed, "%+v", d)
	assert.Equal(t, "app", d.Key, "app made it wait")
	assert.Equal(t, throttle.RefusedByTier, d.Reason)
	assert.Equal(t, 2, d.Tier, "app's hourly tier")
	n, _ := r.takeAll("ws", 20)
	assert.Equal(t, 8, n, "ws gave the two admitted calls only")

	_, err = r.lim.Take(r.ctx, "ws", throttle.Key("ws"))
	assert.ErrorIs(t, err, throttle.ErrInvalidKey, "the same key twice")
	_, err = r.lim.Take(r.ctx, "ws", throttle.Key("a", "b", "c", "d"))
	assert.ErrorIs(t, err, throttle.ErrInvalidKey, "five keys")
}

// The slots of a call of several keys are held in each key and given back
// by one Release.
func TestTakeOfSeveralKeysHoldsAndReleasesEverySlot(t *testing.T) {
	r := newRig(t)
	r.setLimits("a", throttle.PerSecond(100), throttle.InFlight(1))
	r.setLimits("b", throttle.PerSecond(100), throttle.InFlight(1))
	d, err := r.lim.Take(r.ctx, "a", throttle.Key("b"))
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	require.NotEmpty(t, d.Slot)
	for _, k := range []string{"a", "b"} {
		got, err := r.lim.Take(r.ctx, k)
		require.NoError(t, err)
		assert.Equal(t, throttle.RefusedBySlots, got.Reason, "%s's slot is held: %+v", k, got)
	}
	require.NoError(t, r.lim.Release(r.ctx, "a", d.Slot))
	for _, k := range []string{"a", "b"} {
		got, err := r.lim.Take(r.ctx, k)
		require.NoError(t, err)
		assert.True(t, got.Allowed, "%s's slot was given back: %+v", k, got)
	}
}

// The middleware decides a task over all its keys: admitted, its Used
// settles in every key; refused, the event names the key and tier that
// made it wait, and no key was charged.
func TestMiddlewareDecidesOverEveryKeyOfATask(t *testing.T) {
	r := newRig(t, throttle.WithHeadroom(0))
	r.setLimits("ws", throttle.PerSecond(10))
	r.setLimits("app", throttle.PerHour(2), throttle.PerHour(1000).In("tokens"))
	var mu sync.Mutex
	var events []throttle.Event
	r.lim.OnEvent(func(e throttle.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	task := newTask(t, "ws:sync", nil, throttle.Key("ws", "app"), throttle.Uses("tokens", 100))
	ran := 0
	h := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		ran++
		return throttle.Used(ctx, "tokens", 400)
	}))
	require.NoError(t, h.ProcessTask(r.ctx, task))
	require.Equal(t, 1, ran)
	st, err := r.lim.Inspect(r.ctx, "app")
	require.NoError(t, err)
	require.Len(t, st.Tokens, 2)
	assert.InDelta(t, 600, st.Tokens[1], 1, "app's tokens tier settled at 400 used")

	require.NoError(t, h.ProcessTask(r.ctx, task))
	require.Equal(t, 2, ran, "%+v", events)
	_ = h.ProcessTask(r.ctx, task) // refused: deferred (outside a server, by a copy that cannot be made)
	assert.Equal(t, 2, ran, "the third run is refused by app's 2 an hour")
	mu.Lock()
	last := events[len(events)-1]
	mu.Unlock()
	assert.Equal(t, throttle.Deferred, last.Outcome, "%+v", last)
	assert.Equal(t, "app", last.Key, "the key that made it wait")
	assert.Equal(t, throttle.RefusedByTier, last.Reason)
	assert.Equal(t, 1, last.Tier, "app's first tier")
	n, _ := r.takeAll("ws", 20)
	assert.Equal(t, 8, n, "ws charged for the two runs only")
}

// A task whose further key headers are broken is the enqueuer's bug:
// rejected, never run.
func TestMiddlewareRejectsATaskWithBrokenKeyHeaders(t *testing.T) {
	r := newRig(t)
	r.setLimits("a", throttle.PerSecond(10))
	for name, h := range map[string]map[string]string{
		"duplicate": {throttle.HeaderKey: "a", "throttle-key-2": "a"},
		"bad name":  {throttle.HeaderKey: "a", "throttle-key-2": "b{"},
		"five":      {throttle.HeaderKey: "a", "throttle-key-2": "b", "throttle-key-3": "c", "throttle-key-4": "d", "throttle-key-5": "e"},
	} {
		t.Run(name, func(t *testing.T) {
			ran := false
			err := r.lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				ran = true
				return nil
			})).ProcessTask(r.ctx, asynq.NewTaskWithHeaders("a:x", nil, h))
			require.Error(t, err)
			assert.True(t, errors.Is(err, asynq.SkipRetry), "archived at once: %v", err)
			assert.True(t, strings.Contains(err.Error(), "throttle-key-"), "names the header: %v", err)
			assert.False(t, ran)
		})
	}
}

// RateLimited suspends a task's first key, the most specific; a handler
// names another with RateLimitedError.Key: that key alone is suspended.
func TestRateLimitedSuspendsTheFirstKeyOrTheOneNamed(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		suspended string
	}{
		{"RateLimited", throttle.RateLimited(10 * time.Second), "ws"},
		{"named app", &throttle.RateLimitedError{RetryAfter: 10 * time.Second, Key: "app"}, "app"},
		{"named another", &throttle.RateLimitedError{RetryAfter: 10 * time.Second, Key: "other"}, "ws"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.setLimits("ws", throttle.PerSecond(10))
			r.setLimits("app", throttle.PerSecond(10))
			task := newTask(t, "ws:sync", nil, throttle.Key("ws", "app"))
			_ = r.lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				return tt.err
			})).ProcessTask(r.ctx, task)
			for _, k := range []string{"ws", "app"} {
				st := r.inspect(k)
				if k == tt.suspended {
					assert.Equal(t, 10*time.Second, st.SuspendedFor, "%s suspended", k)
				} else {
					assert.Zero(t, st.SuspendedFor, "%s not suspended", k)
				}
			}
		})
	}
}

// Limiter.Enqueue books a task of several keys at one run time every key
// admits, held in each key: a backlog on two workspaces under one app key
// is spaced by the app key, the tighter.
func TestEnqueueBooksOneRunTimeAcrossTheTasksKeys(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithHeadroom(0))
	require.NoError(t, lim.SetLimits(ctx, "ws1", throttle.PerSecond(10).WithBurst(1)))
	require.NoError(t, lim.SetLimits(ctx, "ws2", throttle.PerSecond(10).WithBurst(1)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(4).WithBurst(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	var at []time.Time
	for i := range 6 {
		ws := []string{"ws1", "ws2"}[i%2]
		info, err := lim.Enqueue(ctx, client, newTask(t, "sync", nil, throttle.Key(ws, "app")))
		require.NoError(t, err)
		when, reserved, err := throttle.Reservation(lim, ctx, "app", info.ID)
		require.NoError(t, err)
		require.True(t, reserved, "task %d (%s) booked in app", i, ws)
		at = append(at, when)
	}
	for i := 1; i < len(at); i++ {
		assert.InDelta(t, 250*time.Millisecond, at[i].Sub(at[i-1]), float64(5*time.Millisecond), "app's 4/s spaces the bookings: %v", at)
	}
}

// Observe learns into the key whose tier matches the response's quota:
// a quota per second goes to the app key (its tier of 1 s), not to the
// workspace key (a tier of a minute), the task's first.
func TestObserveLearnsIntoTheKeyWhoseTierMatches(t *testing.T) {
	r := newRig(t)
	r.setLimits("api:ws", throttle.PerMinute(100))
	r.setLimits("api", throttle.PerSecond(10))
	task := newTask(t, "api:sync", nil, throttle.Key("api:ws", "api"))
	err := r.lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Observe(ctx, respondWith(map[string]string{"RateLimit-Policy": `"s";q=5;w=1`}))
	})).ProcessTask(r.ctx, task)
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(5).WithBurst(5)}, r.inspect("api").InForce, "learned into app")
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(100).WithBurst(100)}, r.inspect("api:ws").InForce, "the workspace key keeps its limit")
}

// A task of several keys refused only for a slot expected free within a
// granule waits for it in its worker, as a task of one key does, and runs
// without a deferral.
func TestMiddlewareWaitsForASlotOfATaskOfSeveralKeys(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "a", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "b", throttle.PerSecond(100), throttle.InFlight(1)))
	held, err := lim.Take(ctx, "b")
	require.NoError(t, err)
	require.True(t, held.Allowed)
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = lim.Release(ctx, "b", held.Slot)
	}()
	var mu sync.Mutex
	var events []throttle.Event
	lim.OnEvent(func(e throttle.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	ran := false
	err = lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran = true
		return nil
	})).ProcessTask(ctx, newTask(t, "x", nil, throttle.Key("a", "b")))
	require.NoError(t, err)
	assert.True(t, ran, "ran once the slot freed: %+v", events)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 1, "%+v", events)
	assert.Equal(t, throttle.Ran, events[0].Outcome)
}

// On Redis Cluster each key without a family is its own hash slot: a call
// of several such keys is refused with an error that says so (not a
// CROSSSLOT from Redis), and takes nothing. (Keys of one family are
// decided: TestSeveralKeysOfOneFamilyAreDecidedOnACluster.)
func TestSeveralKeysAreRefusedOnACluster(t *testing.T) {
	c := redistest.StartCluster(t)
	ctx := context.Background()
	lim := throttle.NewLimiter(c.Client(t), quietLog)
	require.NoError(t, lim.SetLimits(ctx, "ws", throttle.PerSecond(10)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(10)))
	_, err := lim.Take(ctx, "ws", throttle.Key("app"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "on Redis Cluster the keys of one task must be of one family")
	d, err := lim.Take(ctx, "ws")
	require.NoError(t, err)
	assert.Equal(t, 9, d.Remaining, "ws untouched by the refused call")
}

// Limiter.Enqueue of a task of several keys that asynq refuses (a
// duplicate) gives up what its booking wrote in every key: the booking
// in the key that made it wait, and the hold ("~ID") in the others.
func TestEnqueueOfARefusedTaskOfSeveralKeysLeavesNoHold(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "a", throttle.PerSecond(100)))
	require.NoError(t, lim.SetLimits(ctx, "b", throttle.PerSecond(100)))
	require.NoError(t, lim.Suspend(ctx, "b", time.Minute))
	client := asynq.NewClientFromRedisClient(rdb)
	task := newTask(t, "sync", []byte("x"), throttle.Key("a", "b"))
	_, err := lim.Enqueue(ctx, client, task, asynq.Unique(time.Hour), asynq.TaskID("first"))
	require.NoError(t, err)
	_, err = lim.Enqueue(ctx, client, task, asynq.Unique(time.Hour), asynq.TaskID("dup"))
	require.ErrorIs(t, err, asynq.ErrDuplicateTask)
	held := map[string][]string{}
	for _, k := range []string{"a", "b"} {
		members, err := rdb.ZRange(ctx, redisKey(k, "r"), 0, -1).Result()
		require.NoError(t, err)
		held[k] = members
	}
	assert.Equal(t, map[string][]string{"a": {"~first"}, "b": {"first"}}, held,
		"the first task's booking (b, whose suspension it waits for) and hold (a) stay; the duplicate's are gone")
}

// A task of several keys admitted at an instant ahead (paced: a holder of
// a reservation comes back a moment before it) that cannot wait that long
// in its worker (its deadline is near) is deferred to the instant: the
// deferral names the key whose turn it waits for (here the second), as a
// refusal does, not the task's first key.
func TestDeferralToAPacedInstantNamesTheKeyItWaitsFor(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog, throttle.WithPacing(true))
	require.NoError(t, lim.SetLimits(ctx, "a", throttle.PerSecond(100).WithBurst(5)))
	require.NoError(t, lim.SetLimits(ctx, "b", throttle.PerSecond(1).WithBurst(1)))
	var mu sync.Mutex
	var events []throttle.Event
	lim.OnEvent(func(e throttle.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	h := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Error("the handler ran")
		return nil
	}))
	headers := newTask(t, "sync", nil, throttle.Key("a", "b")).Headers()
	headers["throttle-origin"] = "X" // (the task's ID, outside a server)
	task := asynq.NewTaskWithHeaders("sync", nil, headers)

	d, err := lim.Take(ctx, "b")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	_ = h.ProcessTask(ctx, task) // refused by b: X reserves b's next token, about 1 s ahead
	// Back at once, within its granule: admitted at b's instant, about 1 s
	// ahead, more than half of what its deadline leaves.
	dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	_ = h.ProcessTask(dctx, task)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 2, "%+v", events)
	assert.Equal(t, throttle.Deferred, events[0].Outcome, "%+v", events[0])
	assert.True(t, events[0].Reserved, "%+v", events[0])
	assert.Equal(t, "b", events[0].Key, "refused by b")
	last := events[1]
	assert.Equal(t, throttle.Deferred, last.Outcome, "%+v", last)
	assert.Equal(t, throttle.RefusedByQueue, last.Reason, "deferred to its paced instant: %+v", last)
	assert.Equal(t, "b", last.Key, "b's turn is what it waits for")
	assert.Zero(t, last.Tier)
	assert.Greater(t, last.Delay, time.Duration(0))
}

// A provider's wait for the task alone (TaskOnly) that names one of the
// task's keys is reported on that key: the Deferred event names it.
func TestTaskOnlyWaitNamesTheKeyTheHandlerNamed(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	lim := throttle.NewLimiter(redistest.Start(t).Client(t), quietLog)
	require.NoError(t, lim.SetLimits(ctx, "ws", throttle.PerSecond(10)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(10)))
	var mu sync.Mutex
	var events []throttle.Event
	lim.OnEvent(func(e throttle.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	task := newTask(t, "ws:sync", nil, throttle.Key("ws", "app"))
	_ = lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return &throttle.RateLimitedError{RetryAfter: 10 * time.Second, TaskOnly: true, Key: "app"}
	})).ProcessTask(ctx, task)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 2, "%+v", events)
	assert.Equal(t, throttle.Deferred, events[1].Outcome, "%+v", events[1])
	assert.Equal(t, throttle.RefusedByProvider, events[1].Reason)
	assert.Equal(t, "app", events[1].Key, "the key the handler named")
	for _, k := range []string{"ws", "app"} {
		st, err := lim.Inspect(ctx, k)
		require.NoError(t, err)
		assert.Zero(t, st.SuspendedFor, "%s not suspended: the wait is the task's alone", k)
	}
}
