package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// -dashboard serves the web view and the metrics, fed by the fleet's
// decisions, while the run lasts.
func TestDashboardFlagServesTheViewAndMetrics(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(context.Background(), "slack", throttle.PerSecond(5)))

	var out bytes.Buffer
	stop, err := serveDashboard("127.0.0.1:0", lim, &out)
	require.NoError(t, err)
	defer stop()
	m := regexp.MustCompile(`dashboard: (http://\S+/)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "the address is printed: %q", out.String())
	assert.Contains(t, out.String(), "-jobs 240 keeps it up about 2 minutes", "how to keep the run up long enough to look")
	// One task through lim's middleware: a decision the view counts.
	task, err := throttle.NewTask("slack:sync", nil, throttle.Key("slack"))
	require.NoError(t, err)
	require.NoError(t, lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })).ProcessTask(context.Background(), task))

	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(m[1] + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s", path)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	assert.Contains(t, get(""), "<html", "the web view")
	metrics := get("metrics")
	assert.Contains(t, metrics, `asynq_throttle_decisions_total{key="slack",outcome="ran"} 1`, "the fleet's decision counted")
	assert.Contains(t, metrics, `asynq_throttle_limit`, "the key's state read from Redis")
}
