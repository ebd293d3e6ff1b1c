package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// A key with nothing in Redis is taken for a typo: get, suspend and resume
// fail with exit code 1, name the closest key and write nothing (issue 20:
// `get doesnotexist` and `suspend nokey 10s` exited 0). --force acts anyway.
func TestUnknownKeyIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	ctx := context.Background()
	require.Equal(t, exitOK, cli(t, url, "set", "slack", "5/s").code)
	require.Equal(t, exitOK, cli(t, url, "set", "github", "5000/h").code)
	lim := throttle.NewLimiter(srv.Client(t))

	tr := &transcript{t: t, redisURL: url}
	for _, args := range [][]string{
		{"get", "doesnotexist"},
		{"get", "slakc", "-o", "json"},
		{"suspend", "nokey", "10s"},
		{"suspend", "gihtub", "10s"},
		{"resume", "slac"},
	} {
		r := tr.run(args...)
		assert.Equal(t, exitFailed, r.code, "%v", args)
		assert.Empty(t, r.stdout, "%v", args)
	}
	golden(t, "unknown", tr.b.String())
	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"github", "slack"}, keys, "a refused command wrote to Redis")

	r := cli(t, url, "suspend", "nokey", "10s", "--force")
	require.Equal(t, exitOK, r.code, r.stderr)
	st, err := lim.Inspect(ctx, "nokey")
	require.NoError(t, err)
	assert.InDelta(t, 10, st.SuspendedFor.Seconds(), 2, "--force suspends a key without limits")
	for _, args := range [][]string{
		{"get", "doesnotexist", "--force"},
		{"resume", "doesnotexist", "--force"},
		{"get", "nokey"}, // only a suspension, but something
	} {
		r := cli(t, url, args...)
		assert.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
	}

	// Limited only by a worker's default limits: state in Redis, no limits.
	worker := throttle.NewLimiter(srv.Client(t), throttle.WithDefaultLimits(throttle.PerMinute(10)))
	d, err := worker.Take(ctx, "zendesk")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// (the worker records the key in the index in the background)
	require.Eventually(t, func() bool {
		keys, err := lim.Keys(ctx)
		return err == nil && slices.Contains(keys, "zendesk")
	}, 5*time.Second, 10*time.Millisecond, "the worker's key never reached the index")
	r = cli(t, url, "suspend", "zendesk", "10s")
	assert.Equal(t, exitOK, r.code, "a key with state from default limits: %s", r.stderr)
	st, err = worker.Inspect(ctx, "zendesk")
	require.NoError(t, err)
	assert.Greater(t, st.SuspendedFor, 5*time.Second)
}

func TestClosestKeyFindsTheKeyATypoMeant(t *testing.T) {
	keys := []string{"github", "hubspot", "slack", "stripe"}
	for _, tc := range []struct{ name, want string }{
		{"slakc", "slack"},   // swapped letters: one edit
		{"Slack", "slack"},   // case
		{"slac", "slack"},    // one missing
		{"gihtub", "github"}, // two swaps
		{"stripes", "stripe"},
		{"doesnotexist", ""},
		{"ab", ""},
		{"s", ""},
	} {
		assert.Equal(t, tc.want, closest(tc.name, keys), "closest(%q)", tc.name)
	}
}
