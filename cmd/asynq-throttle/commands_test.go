package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// The operator's day: set limits, suspend, look, resume, delete, against a
// real redis-server.
func TestOperatorSessionMatchesItsGolden(t *testing.T) {
	srv := redistest.Start(t)
	tr := &transcript{t: t, redisURL: "redis://" + srv.Addr + "/0"}
	tr.run("list")
	tr.run("set", "slack", "5/s:burst=8", "100/m")
	tr.run("set", "github", "5000/h")
	tr.run("set", "crm", "100/1500ms")
	tr.run("set", "stripe", "25/s", "4:inflight")
	tr.run("set", "hubspot", "100/m:window", "2:inflight")
	// Two tasks of hubspot run: each holds a slot and a call of the window.
	lim := throttle.NewLimiter(srv.Client(t))
	for range 2 {
		d, err := lim.Take(context.Background(), "hubspot")
		require.NoError(t, err)
		require.NotEmpty(t, d.Slot, "an in-flight limit gives a slot")
	}
	tr.run("get", "hubspot")
	tr.run("set", "hubspot", "100/m:window", "3:inflight")
	tr.run("suspend", "slack", "30s")
	tr.run("list")
	tr.run("get", "github", "-o", "json")
	tr.run("list", "-o", "json")
	tr.run("resume", "slack")
	tr.run("delete", "crm", "--yes")
	tr.run("list")
	tr.run("set", "slack", "1/s", "1/m", "1/h", "1/d", "2/2s", "3/3s", "4/4s", "5/5s", "6/6s")
	tr.run("set", "slack", "1:inflight", "2:inflight")
	golden(t, "session", normalise(tr.b.String()))

	// What the goldens hide: the suspension really is about 30 s.
	tr.run("suspend", "slack", "30s")
	r := tr.run("get", "slack", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.InDelta(t, 30, v.SuspendedSeconds, 5)
	// And every command changed Redis as it said.
	st, err := lim.Inspect(context.Background(), "slack")
	require.NoError(t, err)
	ls := st.Limits
	assert.Equal(t, []throttle.Limit{{N: 5, Per: time.Second, Burst: 8}, {N: 100, Per: time.Minute, Burst: 100}}, ls)
	st, err = lim.Inspect(context.Background(), "hubspot")
	require.NoError(t, err)
	ls = st.Limits
	assert.Equal(t, []throttle.Limit{throttle.Window(100, time.Minute), throttle.InFlight(3)}, ls)
	keys, err := lim.Keys(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"github", "hubspot", "slack", "stripe"}, keys)
	r = tr.run("get", "hubspot", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	v = keyView{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, int64(2), v.Generation, "set twice")
	require.NotNil(t, v.InFlight)
	assert.Equal(t, limitspec.SlotsView{Held: 2, Max: 3}, *v.InFlight, "the slots taken above are held across the change of limits")
	require.Len(t, v.Limits, 2)
	assert.Equal(t, limitspec.TierView{Kind: "window", Limit: "100/m:window", Unit: "requests", Rate: 100, PeriodSeconds: 60, Burst: 100, Tokens: 98}, v.Limits[0])
	assert.Equal(t, limitspec.TierView{Kind: "inflight", Limit: "3:inflight", Rate: 3, Burst: 3, Tokens: 1}, v.Limits[1])
}

// Tiers in other units than requests: set takes them (the unit last),
// get, list and watch name each tier's unit beside its tokens, and -o json
// carries "unit" per limit.
func TestUnitsAreSetAndShownPerTier(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	tr := &transcript{t: t, redisURL: url}
	tr.run("set", "openai", "500/m", "30000/m:tokens", "16:inflight")
	tr.run("set", "anthropic", "50/m:window", "40000/m:window:input-tokens", "8000/d:fixed:output-tokens")
	tr.run("set", "mistral", "5/s:requests", "2000000/m:burst=500000:tokens")
	// A call that used 1000 input tokens: the windows hold it (they do
	// not refill as buckets do, so the counts below are exact).
	lim := throttle.NewLimiter(srv.Client(t))
	_, err := lim.Take(ctx, "anthropic", throttle.Uses("input-tokens", 1000))
	require.NoError(t, err)
	tr.run("get", "anthropic")
	tr.run("list")
	tr.run("watch", "anthropic", "--count", "1")
	tr.run("get", "anthropic", "-o", "json")
	golden(t, "units", normalise(tr.b.String()))

	st, err := lim.Inspect(ctx, "openai")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(500).WithBurst(500), throttle.PerMinute(30000).WithBurst(30000).In("tokens"), throttle.InFlight(16)}, st.Limits)

	// A bucket of tokens after a call: its tokens refill, so the test reads
	// them by pattern.
	_, err = lim.Take(ctx, "openai", throttle.Uses("tokens", 12000))
	require.NoError(t, err)
	r := cli(t, url, "get", "openai")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^tokens: +(499\.\d|500\.0)/500 requests, \d+\.\d/30000 tokens$`, r.stdout)
	assert.Regexp(t, `(?m)^limits: +500/m 30000/m:tokens 16:inflight$`, r.stdout)
	r = cli(t, url, "get", "openai", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Len(t, v.Limits, 3)
	assert.Equal(t, []string{"requests", "tokens", ""}, []string{v.Limits[0].Unit, v.Limits[1].Unit, v.Limits[2].Unit})
	assert.Equal(t, "30000/m:tokens", v.Limits[1].Limit)
	assert.GreaterOrEqual(t, v.Limits[1].Tokens, 18000.0, "30000 less the 12000 taken, refilling")
}

// --prefix selects another limiter's keys.
func TestPrefixSelectsAnotherLimitersKeys(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	require.Equal(t, 0, cli(t, url, "--prefix", "billing", "set", "stripe", "100/s").code)
	require.Equal(t, 0, cli(t, url, "set", "slack", "1/s").code)
	r := cli(t, url, "--prefix", "billing", "list", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var views []keyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &views))
	require.Len(t, views, 1)
	assert.Equal(t, "stripe", views[0].Key)
}

// On a Cluster (redis+cluster:// URL), list finds the keys of every master.
func TestListFindsTheKeysOfEveryClusterMaster(t *testing.T) {
	c := redistest.StartCluster(t)
	url := "redis+cluster://" + c.Addrs[0] + "?addr=" + c.Addrs[1]
	tr := &transcript{t: t, redisURL: url}
	for i := range 12 {
		r := cli(t, url, "set", fmt.Sprintf("provider-%02d", i), fmt.Sprintf("%d/s", i+1))
		require.Equal(t, 0, r.code, r.stderr)
	}
	tr.run("set", "provider-05", "6/m:window", "2:inflight")
	tr.run("suspend", "provider-03", "1m")
	tr.run("delete", "provider-07", "-y")
	tr.run("list")
	golden(t, "cluster", normalise(tr.b.String()))
}

// watch without a terminal prints logfmt lines per refresh; -o json one
// object per refresh.
func TestWatchWithoutATerminalPrintsALinePerRefresh(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	require.Equal(t, 0, cli(t, url, "set", "slack", "5/s:burst=8", "100/m").code)
	require.Equal(t, 0, cli(t, url, "set", "github", "5000/h").code)
	tr := &transcript{t: t, redisURL: url}
	tr.run("watch", "--count", "2", "--interval", "20ms")
	tr.run("watch", "slack", "nothing-here", "--count", "1")
	golden(t, "watch", normalise(tr.b.String()))

	r := cli(t, url, "watch", "--count", "3", "--interval", "20ms", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 3)
	for _, l := range lines {
		var v struct {
			Time string    `json:"time"`
			Keys []keyView `json:"keys"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &v))
		assert.Len(t, v.Keys, 2)
	}
}

// watch stops cleanly when interrupted.
func TestWatchStopsOnCancel(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &firstWrite{seen: make(chan struct{})}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"watch", "--interval", "10ms"}, func(string) string { return "redis://" + srv.Addr }, nil, out, io.Discard)
	}()
	select {
	case <-out.seen:
	case code := <-done:
		t.Fatalf("watch ended with exit code %d before drawing", code)
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not stop after its context was cancelled")
	}
}

// firstWrite closes seen on its first write and discards everything.
type firstWrite struct {
	once sync.Once
	seen chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.seen) })
	return len(p), nil
}

// One Redis key of the wrong type under the limiter's prefix shows its
// error on its own row of list; every other key is listed, and the
// command succeeds (issue 35, item 9: list exited 1 for all keys).
func TestListShowsABrokenKeysErrorAndTheRest(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	require.Equal(t, exitOK, cli(t, url, "set", "slack", "5/s").code)
	require.Equal(t, exitOK, cli(t, url, "set", "zendesk", "7/s").code)
	require.NoError(t, srv.Client(t).Set(context.Background(), "throttle:{broken}:b", "x", 0).Err())
	r := cli(t, url, "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "WRONGTYPE")
	assert.Regexp(t, `(?m)^slack\s+5/s\s`, r.stdout)
	assert.Regexp(t, `(?m)^zendesk\s+7/s\s`, r.stdout)
	r = cli(t, url, "list", "-o", "json")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"error": "throttle: key \"broken\": inspect: WRONGTYPE`)
}
