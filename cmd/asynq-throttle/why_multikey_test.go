package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// why on a task of several keys (issue 30) names the key it waits on: its
// second key here, whose hour is used up, while its first has room.
func TestWhyNamesTheKeyATaskOfSeveralKeysWaitsOn(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, lim.SetLimits(ctx, "slack:T1", throttle.PerMinute(50)))
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerHour(2)))
	for range 2 {
		d, err := lim.Take(ctx, "slack")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	_, err := client.Enqueue(mustTask(t, "slack:post", nil, throttle.Key("slack:T1", "slack")), asynq.TaskID("t-two"), asynq.ProcessIn(time.Minute))
	require.NoError(t, err)
	r := cli(t, "redis://"+srv.Addr, "why", "t-two", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, "slack", v.Key, v.Sentence)
	assert.Equal(t, []string{"slack:T1", "slack"}, v.Keys)
	assert.Equal(t, reasonTier, v.Reason, v.Sentence)
	assert.Equal(t, 1, v.Tier)
	assert.Contains(t, v.Sentence, `(A task of keys "slack:T1" and "slack", decided all or nothing: key "slack" is the one it waits on, its tier 1 (2/h) without room for it now.)`)
}

// A task of several keys that Limiter.Enqueue booked for later, because its
// second key's minute was used up: why names that key and that tier (not
// its second's, out of room for less time), though
// the task's reason is its reserved run time.
func TestWhyNamesTheKeyAndTierAReservedTaskOfSeveralKeysWaitsOn(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, lim.SetLimits(ctx, "slack:T1", throttle.PerMinute(50)))
	// Both of slack's tiers are out of room when why runs, its second for
	// longest: the one the reservation waits out.
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(2).WithBurst(1), throttle.PerMinute(5)))
	for taken := 0; taken < 5; {
		d, err := lim.Take(ctx, "slack")
		require.NoError(t, err)
		if d.Allowed {
			taken++
		} else {
			time.Sleep(d.RetryAfter)
		}
	}
	task := mustTask(t, "slack:post", nil, throttle.Key("slack:T1", "slack"))
	info, err := lim.Enqueue(ctx, client, task, asynq.TaskID("t-booked"))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State, "booked for when slack's minute has room")
	r := cli(t, "redis://"+srv.Addr, "why", "t-booked", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, "slack", v.Key, v.Sentence)
	assert.Equal(t, reasonReserved, v.Reason, v.Sentence)
	assert.Equal(t, 2, v.Tier, v.Sentence)
	assert.Contains(t, v.Sentence, `(A task of keys "slack:T1" and "slack", decided all or nothing: key "slack" is the one it waits on, its tier 2 (5/m) without room for it now.)`)
}
