package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// why explains each way a task can wait, for tasks put in place with
// asynq's client and the limiter.
func TestWhyExplainsEachWayATaskWaits(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	enqueue := func(task *asynq.Task, opts ...asynq.Option) {
		t.Helper()
		_, err := client.Enqueue(task, opts...)
		require.NoError(t, err)
	}

	// slack: its one token per hour is taken; t-reserved holds the next slot,
	// and a deferred copy holds one under its original's ID.
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerHour(1)))
	_, err := lim.Take(ctx, "slack")
	require.NoError(t, err)
	enqueue(mustTask(t, "slack:sync", nil, throttle.Key("slack")), asynq.TaskID("t-reserved"), asynq.ProcessIn(90*time.Minute))
	reserve(t, rdb, "slack", "t-reserved")
	enqueue(asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{throttle.HeaderKey: "slack", keyspace.Origin: "t-orig"}),
		asynq.TaskID("t-orig~throttle-1"), asynq.ProcessIn(2*time.Hour), asynq.Queue("critical"))
	reserve(t, rdb, "slack", "t-orig")

	// A slot inside a suspension does not hold: the task is deferred again.
	require.NoError(t, lim.SetLimits(ctx, "hubspot", throttle.PerMinute(1)))
	_, err = lim.Take(ctx, "hubspot")
	require.NoError(t, err)
	enqueue(mustTask(t, "hubspot:sync", nil, throttle.Key("hubspot")), asynq.TaskID("t-slot-in-suspension"), asynq.ProcessIn(time.Minute))
	reserve(t, rdb, "hubspot", "t-slot-in-suspension")
	require.NoError(t, lim.Suspend(ctx, "hubspot", 10*time.Minute))

	// github: suspended (a 429, or an operator).
	require.NoError(t, lim.SetLimits(ctx, "github", throttle.PerSecond(10)))
	require.NoError(t, lim.Suspend(ctx, "github", 10*time.Minute))
	enqueue(asynq.NewTask("github:sync", nil), asynq.TaskID("t-suspended"), asynq.ProcessIn(30*time.Second))
	enqueue(asynq.NewTask("github:sync", nil), asynq.TaskID("t-pending-suspended"))

	// crm: both tokens of the hour taken.
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerHour(2), throttle.PerSecond(5)))
	for range 2 {
		_, err := lim.Take(ctx, "crm")
		require.NoError(t, err)
	}
	enqueue(mustTask(t, "crm:sync", nil, throttle.Key("crm")), asynq.TaskID("t-tier"), asynq.ProcessIn(10*time.Second))
	enqueue(mustTask(t, "crm:sync", nil, throttle.Key("crm")), asynq.TaskID("t-pending-tier"))

	// stripe has tokens.
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.PerSecond(10)))
	enqueue(asynq.NewTask("stripe:charge", nil), asynq.TaskID("t-pending"))
	enqueue(asynq.NewTask("stripe:charge", nil), asynq.TaskID("t-scheduled"), asynq.ProcessIn(time.Minute))

	// hubspot-api: its window is used up; stripe: its one slot is held;
	// graph: a task costs 5 and the hour's bucket has 2 left, another costs
	// more than the bucket ever holds (the call that took 8 holds a slot).
	require.NoError(t, lim.SetLimits(ctx, "hubspot-api", throttle.Window(2, time.Hour)))
	_, err = lim.Take(ctx, "hubspot-api", throttle.Cost(2))
	require.NoError(t, err)
	enqueue(mustTask(t, "hubspot-api:sync", nil, throttle.Key("hubspot-api")), asynq.TaskID("t-window"))
	enqueue(mustTask(t, "hubspot-api:sync", nil, throttle.Key("hubspot-api")), asynq.TaskID("t-window-later"), asynq.ProcessIn(time.Minute))
	require.NoError(t, lim.SetLimits(ctx, "stripe-api", throttle.Window(100, time.Hour), throttle.InFlight(1)))
	d, err := lim.Take(ctx, "stripe-api")
	require.NoError(t, err)
	require.NotEmpty(t, d.Slot)
	enqueue(mustTask(t, "stripe-api:charge", nil, throttle.Key("stripe-api")), asynq.TaskID("t-slots-pending"))
	enqueue(mustTask(t, "stripe-api:charge", nil, throttle.Key("stripe-api")), asynq.TaskID("t-slots-later"), asynq.ProcessIn(time.Minute))
	require.NoError(t, lim.SetLimits(ctx, "graph", throttle.Limit{N: 10, Per: time.Hour}, throttle.InFlight(4)))
	_, err = lim.Take(ctx, "graph", throttle.Cost(8))
	require.NoError(t, err)
	enqueue(mustTask(t, "graph:query", nil, throttle.Key("graph"), throttle.Cost(5)), asynq.TaskID("t-cost"))
	enqueue(mustTask(t, "graph:query", nil, throttle.Key("graph"), throttle.Cost(50)), asynq.TaskID("t-cost-too-high"))
	enqueue(mustTask(t, "graph:query", nil, throttle.Key("graph"), throttle.Cost(2)), asynq.TaskID("t-cost-fits"))

	// Not throttled: no key at all, a key without limits, a bad key header.
	enqueue(asynq.NewTask("cleanup", nil), asynq.TaskID("t-plain"))
	enqueue(asynq.NewTask("zendesk:sync", nil), asynq.TaskID("t-nolimits"), asynq.ProcessIn(time.Minute))
	enqueue(asynq.NewTaskWithHeaders("hub:sync", nil, map[string]string{throttle.HeaderKey: "a{b}"}), asynq.TaskID("t-badkey"))

	tr := &transcript{t: t, redisURL: "redis://" + srv.Addr}
	for _, args := range [][]string{
		{"why", "t-reserved"},
		{"why", "t-orig~throttle-1"},
		{"why", "t-slot-in-suspension"},
		{"why", "t-suspended"},
		{"why", "t-pending-suspended"},
		{"why", "t-tier"},
		{"why", "t-pending-tier"},
		{"why", "t-pending"},
		{"why", "t-scheduled"},
		{"why", "t-plain"},
		{"why", "t-nolimits"},
		{"why", "t-badkey"},
		{"why", "t-window"},
		{"why", "t-window-later"},
		{"why", "t-slots-pending"},
		{"why", "t-slots-later"},
		{"why", "t-cost"},
		{"why", "t-cost-too-high"},
		{"why", "t-cost-fits"},
		{"why", "t-tier", "-o", "json"},
		{"why", "t-slots-pending", "-o", "json"},
		{"why", "t-orig~throttle-1", "--queue", "critical"},
		{"why", "t-reserved", "--queue", "critical"},
		{"why", "no-such-task"},
	} {
		tr.run(args...)
	}
	golden(t, "why", normalise(tr.b.String()))

	// What the golden hides: the slot and the tier.
	var v whyView
	r := cli(t, tr.redisURL, "why", "t-reserved", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonReserved, v.Reason)
	require.NotNil(t, v.ReservedAt)
	slot, ok, err := (&app{rdb: rdb, prefix: keyspace.DefaultPrefix}).reservation(ctx, "slack", "t-reserved")
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, slot.Equal(*v.ReservedAt), "slot %v, want %v", v.ReservedAt, slot)
	r = cli(t, tr.redisURL, "why", "t-tier", "-o", "json")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonTier, v.Reason)
	assert.Equal(t, 1, v.Tier)

	for _, tc := range []struct {
		id, reason, limit string
		tier, cost        int
		slots             *limitspec.SlotsView
	}{
		{"t-window", reasonTier, "2/h:window", 1, 1, nil},
		{"t-slots-later", reasonSlots, "1:inflight", 2, 1, &limitspec.SlotsView{Held: 1, Max: 1}},
		{"t-cost", reasonTier, "10/h", 1, 5, &limitspec.SlotsView{Held: 1, Max: 4}},
		{"t-cost-too-high", reasonRejected, "10/h", 1, 50, &limitspec.SlotsView{Held: 1, Max: 4}},
		{"t-cost-fits", reasonPending, "", 0, 2, &limitspec.SlotsView{Held: 1, Max: 4}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			r := cli(t, tr.redisURL, "why", tc.id, "-o", "json")
			require.Equal(t, 0, r.code, r.stderr)
			var v whyView
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
			assert.Equal(t, tc.reason, v.Reason, v.Sentence)
			assert.Equal(t, tc.tier, v.Tier)
			assert.Equal(t, tc.limit, v.Limit)
			assert.Equal(t, tc.cost, v.Cost)
			assert.Equal(t, tc.slots, v.InFlight)
			assert.Equal(t, int64(1), v.Generation)
		})
	}
}

// why names the unit of the tier that refuses a task: what the task uses
// of it (its throttle-uses header) against what the tier has, in that unit.
func TestWhyNamesTheUnitOfTheRefusingTier(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	enqueue := func(id string, opts ...asynq.Option) {
		t.Helper()
		_, err := client.Enqueue(mustTask(t, "llm:chat", nil, opts...), asynq.TaskID(id))
		require.NoError(t, err)
	}
	// openai: 24000 of its 30000 tokens taken (they refill at 500 a second)
	// by a call that holds one of its 16 slots.
	require.NoError(t, lim.SetLimits(ctx, "openai", throttle.PerMinute(500), throttle.PerMinute(30000).In("tokens"), throttle.InFlight(16)))
	_, err := lim.Take(ctx, "openai", throttle.Uses("tokens", 24000))
	require.NoError(t, err)
	enqueue("t-tokens", throttle.Key("openai"), throttle.Uses("tokens", 12000), throttle.Uses("input-tokens", 300))
	enqueue("t-tokens-too-high", throttle.Key("openai"), throttle.Uses("tokens", 40000))
	enqueue("t-requests-only", throttle.Key("openai"))
	// anthropic: a sliding window of input tokens with 1000 left.
	require.NoError(t, lim.SetLimits(ctx, "anthropic", throttle.PerMinute(50), throttle.Window(40000, time.Minute).In("input-tokens")))
	_, err = lim.Take(ctx, "anthropic", throttle.Uses("input-tokens", 39000))
	require.NoError(t, err)
	enqueue("t-window-tokens", throttle.Key("anthropic"), throttle.Uses("input-tokens", 2000))
	_, err = client.Enqueue(asynq.NewTaskWithHeaders("llm:chat", nil, map[string]string{throttle.HeaderKey: "openai", keyspace.Uses: "tokens=lots"}), asynq.TaskID("t-bad-uses"))
	require.NoError(t, err)

	url := "redis://" + srv.Addr
	why := func(id string) whyView {
		t.Helper()
		r := cli(t, url, "why", id, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var v whyView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
		return v
	}

	v := why("t-tokens")
	assert.Equal(t, reasonTier, v.Reason, v.Sentence)
	assert.Equal(t, 2, v.Tier)
	assert.Equal(t, "30000/m:tokens", v.Limit)
	assert.Equal(t, "tokens", v.Unit)
	assert.Equal(t, 1, v.Cost)
	assert.Equal(t, map[string]int{"tokens": 12000, "input-tokens": 300}, v.Uses)
	assert.Regexp(t, `^task t-tokens \(key "openai"\) is pending; a worker that picks it up now defers it, because tier 2 of key "openai" \(30000/m:tokens\) has [6-9]\d\d\d\.\d of 30000 tokens, short of the task's 12000 tokens, and has them in \S+\.$`, v.Sentence)

	v = why("t-tokens-too-high")
	assert.Equal(t, reasonRejected, v.Reason, v.Sentence)
	assert.Equal(t, "tokens", v.Unit)
	assert.Contains(t, v.Sentence, `can never be admitted: it uses 40000 tokens, and tier 2 of key "openai" (30000/m:tokens) holds at most 30000 tokens;`)

	// A task that says nothing of tokens takes none: the tokens tier does
	// not hold it back.
	v = why("t-requests-only")
	assert.Equal(t, reasonPending, v.Reason, v.Sentence)
	assert.Nil(t, v.Uses)
	assert.Regexp(t, `has room \((499\.\d|500\.0)/500 requests, \d+\.\d/30000 tokens; 1 of 16 in flight\)`, v.Sentence)

	v = why("t-window-tokens")
	assert.Equal(t, reasonTier, v.Reason, v.Sentence)
	assert.Equal(t, "input-tokens", v.Unit)
	assert.Contains(t, v.Sentence, `tier 2 of key "anthropic" (40000/m:window:input-tokens) has 1000 of 40000 input-tokens left in its sliding 1m window, short of the task's 2000 input-tokens`)

	v = why("t-bad-uses")
	assert.Equal(t, reasonInvalidKey, v.Reason, v.Sentence)
	assert.Contains(t, v.Sentence, `header throttle-uses = "tokens=lots": want unit=n,...`)

	r := cli(t, url, "why", "t-tokens")
	assert.Contains(t, r.stdout, `(30000/m:tokens) has `)
}

// why on tasks a real fleet deferred, each holding its reserved run time,
// and on one it rejected (a cost no tier can hold), which asynq archived.
func TestWhyExplainsTheTasksARealFleetDeferredOrRejected(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "hub", throttle.Limit{N: 1, Per: 20 * time.Second}))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	for _, id := range []string{"h1", "h2", "h3"} {
		_, err := client.Enqueue(mustTask(t, "hub:sync", nil, throttle.Key("hub")), asynq.TaskID(id), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}
	_, err := client.Enqueue(mustTask(t, "hub:sync", nil, throttle.Key("hub"), throttle.Cost(5)), asynq.TaskID("h-too-costly"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	w := worker.NewServer(rdb, asynq.Config{Concurrency: 1, Logger: discardAsynqLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb, throttle.WithLogger(quiet)))
	mux.HandleFunc("hub:sync", func(context.Context, *asynq.Task) error { return nil })
	require.NoError(t, w.Start(mux))
	t.Cleanup(w.Shutdown)

	insp := asynq.NewInspectorFromRedisClient(rdb)
	state := func(id string) asynq.TaskState {
		info, err := insp.GetTaskInfo("default", id)
		if err != nil {
			return 0
		}
		return info.State
	}
	require.Eventually(t, func() bool {
		return state("h1") == asynq.TaskStateCompleted && state("h2") == asynq.TaskStateRetry && state("h3") == asynq.TaskStateRetry &&
			state("h-too-costly") == asynq.TaskStateArchived
	}, 15*time.Second, 20*time.Millisecond)

	url := "redis://" + srv.Addr
	var slots []time.Time
	for _, id := range []string{"h2", "h3"} {
		r := cli(t, url, "why", id, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var v whyView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
		assert.Equal(t, reasonReserved, v.Reason, v.Sentence)
		assert.Equal(t, "hub", v.Key)
		require.NotNil(t, v.ReservedAt, v.Sentence)
		slots = append(slots, *v.ReservedAt)
		assert.Contains(t, v.Sentence, "waiting for its reserved run time")
	}
	// One slot per 20 s, plus the middleware's headroom for dispatch jitter.
	assert.Equal(t, 20*time.Second+20*time.Millisecond, slots[1].Sub(slots[0]), "one slot per 20 s")
	r := cli(t, url, "why", "h1")
	assert.Contains(t, r.stdout, "is not waiting: it has completed")

	r = cli(t, url, "why", "h-too-costly", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonRejected, v.Reason, v.Sentence)
	assert.Contains(t, v.Sentence, "the middleware rejected it, and asynq archived it, because it can never be throttled")
}

// discardAsynqLogger silences the asynq server in tests.
type discardAsynqLogger struct{}

func (discardAsynqLogger) Debug(...any) {}
func (discardAsynqLogger) Info(...any)  {}
func (discardAsynqLogger) Warn(...any)  {}
func (discardAsynqLogger) Error(...any) {}
func (discardAsynqLogger) Fatal(...any) {}

// why on a task a real worker refused by slots: the key's one slot in
// flight is held by a running task, so the other was deferred.
func TestWhyExplainsATaskRefusedBySlots(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(100), throttle.InFlight(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	_, err := client.Enqueue(mustTask(t, "crm:sync", nil, throttle.Key("crm")), asynq.TaskID("runs"), asynq.Retention(time.Hour))
	require.NoError(t, err)

	release := make(chan struct{})
	started := make(chan struct{}, 2)
	w := worker.NewServer(rdb, asynq.Config{Concurrency: 2, Logger: discardAsynqLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb, throttle.WithLogger(slog.New(slog.DiscardHandler))))
	mux.HandleFunc("crm:sync", func(ctx context.Context, _ *asynq.Task) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	require.NoError(t, w.Start(mux))
	t.Cleanup(w.Shutdown)
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the first task did not start")
	}
	_, err = client.Enqueue(mustTask(t, "crm:sync", nil, throttle.Key("crm")), asynq.TaskID("waits"), asynq.Retention(time.Hour))
	require.NoError(t, err)

	insp := asynq.NewInspectorFromRedisClient(rdb)
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo("default", "waits")
		return err == nil && info.State == asynq.TaskStateRetry
	}, 15*time.Second, 20*time.Millisecond, "the second task is deferred")

	url := "redis://" + srv.Addr
	r := cli(t, url, "why", "waits", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonSlots, v.Reason, v.Sentence)
	assert.Equal(t, "in flight", v.DeferredFor)
	assert.Equal(t, &limitspec.SlotsView{Held: 1, Max: 1}, v.InFlight)
	assert.Equal(t, 2, v.Tier)
	assert.Equal(t, "1:inflight", v.Limit)
	assert.Contains(t, v.Sentence, `was refused by slots: the one in-flight slot of key "crm" is held (1 of 1 in flight), so it was deferred to when one is expected to free; asynq brings it back at `)
	r = cli(t, url, "list")
	assert.Regexp(t, `crm +100/s 1:inflight +\S+ +1/1 `, r.stdout)

	close(release)
	released = true
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo("default", "waits")
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 30*time.Second, 50*time.Millisecond, "the deferred task runs once the slot is free")
	r = cli(t, url, "list")
	assert.Regexp(t, `crm +100/s 1:inflight +\S+ +0/1 `, r.stdout, "every slot given back")
}

// mustTask is throttle.NewTask for options a test knows are valid.
func mustTask(t testing.TB, typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	t.Helper()
	task, err := throttle.NewTask(typename, payload, opts...)
	require.NoError(t, err, "NewTask(%q)", typename)
	return task
}

// reserve reserves a run time within 3 hours for task id under key, as the
// middleware does when it refuses a task (on whole seconds, no pacing).
func reserve(t testing.TB, rdb redis.UniversalClient, key, id string) {
	t.Helper()
	keys, err := keyspace.RedisKeys(keyspace.DefaultPrefix, key)
	require.NoError(t, err)
	r, err := lua.Decide(context.Background(), lua.NewRunner(rdb), keys, lua.DecideArgs{
		TaskID: id, Horizon: 3 * time.Hour, Granule: time.Second, Lapse: 5 * time.Minute, SlotExpiry: 30 * time.Second})
	require.NoError(t, err)
	require.False(t, r.Reserved.IsZero(), "a reservation for %s under %s: %+v", id, key, r)
}

// why shows what a producer wrote (a task's type, its last error) with
// control characters escaped: a producer cannot send escape sequences to
// the operator's terminal (issue 35, item 10).
func TestWhyEscapesControlCharacters(t *testing.T) {
	srv := redistest.Start(t)
	client := asynq.NewClientFromRedisClient(srv.Client(t))
	t.Cleanup(func() { client.Close() })
	hostile := "stripe.\x1b]0;pwned\x07\x1b[2J\rcharge\u202e" // no "provider:" prefix: named in the sentence
	_, err := client.Enqueue(asynq.NewTask(hostile, nil), asynq.TaskID("t-hostile"))
	require.NoError(t, err)
	r := cli(t, "redis://"+srv.Addr, "why", "t-hostile")
	require.Equal(t, exitOK, r.code, r.stderr)
	for _, c := range []string{"\x1b", "\x07", "\r", "\u202e"} {
		assert.NotContains(t, r.stdout, c, "a control character reached the terminal: %q", r.stdout)
	}
	assert.Contains(t, r.stdout, `stripe.\x1b]0;pwned\a\x1b[2J\rcharge\u202e`)
	assert.Equal(t, "plain task (stripe:charge)", printable("plain task (stripe:charge)"))
	assert.Equal(t, `\xff`, printable("\xff"))
}
