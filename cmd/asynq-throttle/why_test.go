package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// why explains each way a task can wait, for tasks put in place with
// asynq's client and the limiter.
func TestWhy(t *testing.T) {
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
	enqueue(throttle.NewTask("slack:sync", nil, throttle.Key("slack")), asynq.TaskID("t-reserved"), asynq.ProcessIn(90*time.Minute))
	d, err := lim.Reserve(ctx, "slack", "t-reserved", 3*time.Hour, time.Second)
	require.NoError(t, err)
	require.True(t, d.Reserved)
	enqueue(asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{throttle.HeaderKey: "slack", throttle.HeaderOrigin: "t-orig"}),
		asynq.TaskID("t-orig~throttle-1"), asynq.ProcessIn(2*time.Hour), asynq.Queue("critical"))
	d, err = lim.Reserve(ctx, "slack", "t-orig", 3*time.Hour, time.Second)
	require.NoError(t, err)
	require.True(t, d.Reserved)

	// A slot inside a suspension does not hold: the task is deferred again.
	require.NoError(t, lim.SetLimits(ctx, "hubspot", throttle.PerMinute(1)))
	_, err = lim.Take(ctx, "hubspot")
	require.NoError(t, err)
	enqueue(throttle.NewTask("hubspot:sync", nil, throttle.Key("hubspot")), asynq.TaskID("t-slot-in-suspension"), asynq.ProcessIn(time.Minute))
	d, err = lim.Reserve(ctx, "hubspot", "t-slot-in-suspension", 3*time.Hour, time.Second)
	require.NoError(t, err)
	require.True(t, d.Reserved)
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
	enqueue(throttle.NewTask("crm:sync", nil, throttle.Key("crm")), asynq.TaskID("t-tier"), asynq.ProcessIn(10*time.Second))
	enqueue(throttle.NewTask("crm:sync", nil, throttle.Key("crm")), asynq.TaskID("t-pending-tier"))

	// stripe has tokens.
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.PerSecond(10)))
	enqueue(asynq.NewTask("stripe:charge", nil), asynq.TaskID("t-pending"))
	enqueue(asynq.NewTask("stripe:charge", nil), asynq.TaskID("t-scheduled"), asynq.ProcessIn(time.Minute))

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
		{"why", "t-tier", "-o", "json"},
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
	require.NotNil(t, v.Slot)
	slot, ok, err := lim.Reservation(ctx, "slack", "t-reserved")
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, slot.Equal(*v.Slot), "slot %v, want %v", v.Slot, slot)
	r = cli(t, tr.redisURL, "why", "t-tier", "-o", "json")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonTier, v.Reason)
	assert.Equal(t, 1, v.Tier)
}

// why on tasks a real fleet deferred: each holds its reserved slot.
func TestWhyDeferredByWorkers(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "hub", throttle.Limit{Rate: 1, Per: 20 * time.Second}))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	for _, id := range []string{"h1", "h2", "h3"} {
		_, err := client.Enqueue(throttle.NewTask("hub:sync", nil, throttle.Key("hub")), asynq.TaskID(id), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}
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
		return state("h1") == asynq.TaskStateCompleted && state("h2") == asynq.TaskStateRetry && state("h3") == asynq.TaskStateRetry
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
		require.NotNil(t, v.Slot, v.Sentence)
		slots = append(slots, *v.Slot)
		assert.Contains(t, v.Sentence, "waiting for its reserved run slot")
	}
	// One slot per 20 s, plus the middleware's headroom for dispatch jitter.
	assert.Equal(t, 20*time.Second+throttle.DefaultHeadroom, slots[1].Sub(slots[0]), "one slot per 20 s")
	r := cli(t, url, "why", "h1")
	assert.Contains(t, r.stdout, "is not waiting: it has completed")
}

// discardAsynqLogger silences the asynq server in tests.
type discardAsynqLogger struct{}

func (discardAsynqLogger) Debug(...any) {}
func (discardAsynqLogger) Info(...any)  {}
func (discardAsynqLogger) Warn(...any)  {}
func (discardAsynqLogger) Error(...any) {}
func (discardAsynqLogger) Fatal(...any) {}
