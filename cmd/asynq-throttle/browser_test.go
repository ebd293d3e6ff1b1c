package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

var screenshot = flag.String("screenshot", "", "write a PNG of the dashboard to this path (relative to the module root), e.g. docs/dashboard.png")

// chromium returns a browser context on Debian's chromium (headless, no
// network of its own). Without chromium the test is skipped, or fails when
// CI=true (.ci/run installs it).
func chromium(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is required in CI but was not found on PATH; .ci/run installs it (apt-get install chromium)")
		}
		t.Skip("chromium not found on PATH; skipping the browser test (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// serve runs `asynq-throttle serve` in-process on a free port and returns
// its base URL; it stops at the end of the test.
func serve(t *testing.T, redisURL string, flags ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, flags...), func(string) string { return redisURL }, nil, pw, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err, "serve printed nothing")
	go io.Copy(io.Discard, pr) //nolint:errcheck // drain the rest
	m := regexp.MustCompile(`on (http://[^/ ]+/)`).FindStringSubmatch(line)
	require.NotNil(t, m, "serve said %q", line)
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, exitOK, <-done, "serve exit code")
	})
	return m[1]
}

// js evaluates expr in the page.
func js[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err, expr)
	return v
}

// cardText is the text of the element sel inside key's card ("" if none).
func cardText(key, sel string) string {
	k, _ := json.Marshal(fmt.Sprintf("section.card[data-key=%q] %s", key, sel))
	return fmt.Sprintf("(document.querySelector(%s) || {}).textContent || ''", k)
}

// eventually polls expr in the page until ok holds.
func eventually[T any](t *testing.T, ctx context.Context, expr string, ok func(T) bool, msg string) T {
	t.Helper()
	var (
		last    T
		lastErr error
	)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		last, lastErr = chromedp.Run(ctx, chromedp.Evaluate[T](expr))
		if lastErr == nil && ok(last) {
			return last
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: browser gone: %v", msg, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s: not seen within 15s; last value %v (error %v) of %s", msg, last, lastErr, expr)
	return last
}

var reLeft = regexp.MustCompile(`suspended · (\d+) s left`)

// secondsLeft reads the countdown "suspended · 43 s left" (-1 if absent).
func secondsLeft(s string) int {
	m := reLeft.FindStringSubmatch(s)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// The page shows the keys in Redis, a suspension set from the CLI with its
// countdown, and its Suspend button suspends the key in Redis; read-only
// mode (the default) refuses it, in the page and on the server.
func TestBrowserPageShowsKeysAndSuspendsOnlyWhenWritable(t *testing.T) {
	ctx := chromium(t)
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	for _, args := range [][]string{
		{"set", "slack", "5/s:burst=8", "100/m"},
		{"set", "github", "5000/h"},
		{"set", "hubspot", "100/h:window"},
		{"set", "stripe", "3:inflight"},
		{"set", "stripe", "100/h:window", "2:inflight"},
		{"set", "openai", "500/m", "30000/m:tokens", "16:inflight"},
	} {
		r := cli(t, url, args...)
		require.Equal(t, 0, r.code, r.stderr)
	}
	lim := throttle.NewLimiter(srv.Client(t))
	// A task of stripe runs (holds one of its two slots), and 3 calls of
	// hubspot's window were made.
	d, err := lim.Take(context.Background(), "stripe")
	require.NoError(t, err)
	require.NotEmpty(t, d.Slot)
	_, err = lim.Take(context.Background(), "hubspot", throttle.Cost(3))
	require.NoError(t, err)
	suspended := func(key string) time.Duration {
		st, err := lim.Inspect(context.Background(), key)
		require.NoError(t, err)
		return st.SuspendedFor
	}

	// llm: tasks of three tenants (one the default) booked by Enqueue.
	for _, args := range [][]string{{"set", "llm", "30/m"}, {"weights", "llm", "gold=3"}} {
		r := cli(t, url, args...)
		require.Equal(t, 0, r.code, r.stderr)
	}
	client := asynq.NewClientFromRedisClient(srv.Client(t))
	t.Cleanup(func() { client.Close() })
	for range 3 {
		for _, tenant := range []string{"gold", "plain", ""} {
			opts := []asynq.Option{throttle.Key("llm")}
			if tenant != "" {
				opts = append(opts, throttle.Tenant(tenant))
			}
			_, err := lim.Enqueue(context.Background(), client, mustTask(t, "llm:chat", nil, opts...))
			require.NoError(t, err)
		}
	}

	base := serve(t, url, "--read-only=false")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base)))
	limits := eventually(t, ctx, cardText("slack", ".limits"), func(s string) bool { return s != "" }, "the slack card shows its limits")
	assert.Equal(t, "5/s:burst=8  ·  100/m", limits)
	assert.Equal(t, "8.0 / 8", js[string](t, ctx, cardText("slack", ".tier .count")))
	assert.Equal(t, "bucket", js[string](t, ctx, cardText("slack", ".tier .name")))
	assert.Equal(t, "gen 1", js[string](t, ctx, cardText("slack", ".gen")))

	// Each kind with its own gauge: a window's calls left, an in-flight
	// limit's slots held; and the generation of the limits.
	assert.Equal(t, "window", js[string](t, ctx, cardText("hubspot", ".tier .name")))
	assert.Equal(t, "97 of 100 left", js[string](t, ctx, cardText("hubspot", ".tier .count")))
	assert.Equal(t, "100/h:window  ·  2:inflight", js[string](t, ctx, cardText("stripe", ".limits")))
	assert.Equal(t, "in flight", js[string](t, ctx, cardText("stripe", ".tier.kind-inflight .name")))
	assert.Equal(t, "1 of 2 in flight", js[string](t, ctx, cardText("stripe", ".tier.kind-inflight .count")))
	assert.Equal(t, "99 of 100 left", js[string](t, ctx, cardText("stripe", ".tier.kind-window .count")))
	assert.Equal(t, "gen 2", js[string](t, ctx, cardText("stripe", ".gen")))

	// A key with tokens beside requests: each rate limit's row reads in its
	// unit; a key of requests alone names none (above).
	assert.Equal(t, "500/m  ·  30000/m:tokens  ·  16:inflight", js[string](t, ctx, cardText("openai", ".limits")))
	assert.Equal(t, "500.0 / 500 requests", js[string](t, ctx, cardText("openai", `.tier[data-unit="requests"] .count`)))
	assert.Equal(t, "30000.0 / 30000 tokens", js[string](t, ctx, cardText("openai", `.tier[data-unit="tokens"] .count`)))
	assert.Equal(t, "0 of 16 in flight", js[string](t, ctx, cardText("openai", ".tier.kind-inflight .count")))

	// A key's tenants: a table of name, weight, share, backlog, admitted;
	// none for a key without tenants.
	rows := eventually(t, ctx, `Array.from(document.querySelectorAll('section.card[data-key="llm"] table.tenants tbody tr'))
		.map((r) => Array.from(r.cells).map((c) => c.textContent).join(' ')).sort().join('; ')`,
		func(s string) bool { return s != "" }, "the llm card shows its tenants")
	assert.Regexp(t, `^\(default\) 1 20\.0% \d\.\d 0; gold 3 60\.0% \d\.\d 0; plain 1 20\.0% \d\.\d 0$`, rows)
	assert.False(t, js[bool](t, ctx, `document.querySelector('section.card[data-key="llm"] table.tenants').hidden`))
	assert.True(t, js[bool](t, ctx, `document.querySelector('section.card[data-key="slack"] table.tenants').hidden`), "slack has no tenants")

	// The slot given back and another limit set show on the next poll.
	require.NoError(t, lim.Release(context.Background(), "stripe", d.Slot))
	eventually(t, ctx, cardText("stripe", ".tier.kind-inflight .count"), func(s string) bool { return s == "0 of 2 in flight" }, "the released slot")
	d2, err := lim.Take(context.Background(), "stripe")
	require.NoError(t, err)
	d3, err := lim.Take(context.Background(), "stripe")
	require.NoError(t, err)
	eventually(t, ctx, cardText("stripe", ".badge"), func(s string) bool { return s == "slots full" }, "every slot held")
	require.NoError(t, lim.Release(context.Background(), "stripe", d2.Slot, d3.Slot))
	r := cli(t, url, "set", "stripe", "100/h:window", "4:inflight")
	require.Equal(t, 0, r.code, r.stderr)
	eventually(t, ctx, cardText("stripe", ".gen"), func(s string) bool { return s == "gen 3" }, "the new generation")
	assert.Equal(t, "0 of 4 in flight", js[string](t, ctx, cardText("stripe", ".tier.kind-inflight .count")))

	// Limits typed in the page, units and all, reach Redis; a misspelt
	// modifier is refused, not taken for a unit.
	setLimits := func(key, spec string) {
		t.Helper()
		sel, _ := json.Marshal(fmt.Sprintf("section.card[data-key=%q]", key))
		v, _ := json.Marshal(spec)
		js[bool](t, ctx, fmt.Sprintf(`(() => { const c = document.querySelector(%s); const i = c.querySelector('.limits-input');
			i.focus(); i.value = %s; i.dispatchEvent(new Event('input', {bubbles: true})); c.querySelector('button.set-limits').click(); return true; })()`, sel, v))
	}
	setLimits("openai", "500/m 30000/m:windwo")
	eventually(t, ctx, `document.getElementById('toast').textContent`, func(s string) bool { return strings.Contains(s, "did you mean :window?") }, "the typo refused")
	setLimits("openai", "500/m 30000/m:window:tokens 8000/m:output-tokens 16:inflight")
	eventually(t, ctx, cardText("openai", ".limits"), func(s string) bool {
		return s == "500/m  ·  30000/m:window:tokens  ·  8000/m:output-tokens  ·  16:inflight"
	}, "the limits set from the page")
	assert.Equal(t, "30000 of 30000 tokens left", js[string](t, ctx, cardText("openai", `.tier[data-unit="tokens"] .count`)))
	assert.Equal(t, "8000.0 / 8000 output-tokens", js[string](t, ctx, cardText("openai", `.tier[data-unit="output-tokens"] .count`)))
	st, err := lim.Inspect(context.Background(), "openai")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(500).WithBurst(500), throttle.Window(30000, time.Minute).In("tokens"),
		throttle.PerMinute(8000).WithBurst(8000).In("output-tokens"), throttle.InFlight(16)}, st.Limits)

	// A suspension set from the CLI appears, and counts down.
	r = cli(t, url, "suspend", "github", "45s")
	require.Equal(t, 0, r.code, r.stderr)
	first := secondsLeft(eventually(t, ctx, cardText("github", ".suspension"), func(s string) bool { return secondsLeft(s) > 0 }, "the CLI's suspension shows on the github card"))
	assert.LessOrEqual(t, first, 45)
	eventually(t, ctx, cardText("github", ".suspension"), func(s string) bool { n := secondsLeft(s); return n > 0 && n < first }, "the countdown moves")
	assert.Equal(t, "suspended", js[string](t, ctx, cardText("github", ".badge")))

	// The Suspend button (actions on) suspends the key in Redis.
	require.Zero(t, suspended("slack"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`section.card[data-key="slack"] button.suspend`))))
	require.Eventually(t, func() bool { return suspended("slack") > 25*time.Second }, 10*time.Second, 20*time.Millisecond, "Suspend did not reach Redis")
	eventually(t, ctx, cardText("slack", ".suspension"), func(s string) bool { return secondsLeft(s) > 0 }, "the page shows slack suspended")
	r = cli(t, url, "resume", "slack")
	require.Equal(t, 0, r.code, r.stderr)

	// Read-only (serve's default): the button is disabled, and a request
	// made anyway is refused by the server.
	ro := serve(t, url)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(ro)))
	eventually(t, ctx, cardText("slack", ".limits"), func(s string) bool { return s != "" }, "the read-only page shows slack")
	assert.True(t, js[bool](t, ctx, `document.querySelector('section.card[data-key="slack"] button.suspend').disabled`))
	assert.Contains(t, js[string](t, ctx, `document.getElementById('ro-banner').textContent`), "Read-only")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`section.card[data-key="slack"] button.suspend`))))
	status := js[float64](t, ctx, `fetch('api/suspend', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-Asynq-Throttle': '1'},
		body: JSON.stringify({key: 'slack', duration: '30s'})}).then(r => r.status)`)
	assert.Equal(t, 403.0, status)
	assert.Zero(t, suspended("slack"), "read-only mode let a suspension through")
}

// moduleRoot finds the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.mod not found")
		dir = parent
	}
}

// writeScreenshot saves a PNG of the page at -screenshot, when given.
func writeScreenshot(t *testing.T, ctx context.Context) {
	t.Helper()
	if *screenshot == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := *screenshot
	if !filepath.IsAbs(path) {
		path = filepath.Join(moduleRoot(t), path)
	}
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("wrote %s (%d bytes)", path, len(png))
}

// The dashboard in a worker process, with the metrics collector: a fleet
// drains backlogs while the page shows decisions per second, the backlog
// forecast, and a 429's suspension. -screenshot saves it for the README.
func TestDashboardShowsAFleetDraining(t *testing.T) {
	ctx := chromium(t)
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	rdb := srv.Client(t)
	for _, args := range [][]string{
		{"set", "slack", "5/s", "120/m:burst=30"},
		{"set", "github", "20/s"},
		{"set", "crm", "10/s"},
		{"set", "stripe", "2/s:burst=4", "2:inflight"},
		{"set", "hubspot", "60/m:window"},
	} {
		r := cli(t, url, args...)
		require.Equal(t, 0, r.code, r.stderr)
	}
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(slog.DiscardHandler)))

	var rateLimited atomic.Bool
	mux := asynq.NewServeMux()
	mux.Use(lim.Middleware())
	mux.HandleFunc("crm:sync", func(context.Context, *asynq.Task) error {
		if rateLimited.CompareAndSwap(false, true) {
			return throttle.RateLimited(40 * time.Second) // the provider said 429
		}
		return nil
	})
	// stripe's calls take until the end of the test: its two slots stay
	// held and the other tasks are refused by slots.
	slow := make(chan struct{})
	mux.HandleFunc("stripe:charge", func(ctx context.Context, _ *asynq.Task) error {
		select {
		case <-slow:
		case <-ctx.Done():
		}
		return nil
	})
	for _, typ := range []string{"slack:sync", "github:sync", "hubspot:sync"} {
		mux.HandleFunc(typ, func(context.Context, *asynq.Task) error { return nil })
	}
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	for typ, n := range map[string]int{"slack:sync": 120, "github:sync": 400, "crm:sync": 30, "stripe:charge": 30, "hubspot:sync": 90} {
		for range n {
			_, err := client.Enqueue(asynq.NewTask(typ, nil))
			require.NoError(t, err)
		}
	}
	for range 2 {
		w := worker.NewServer(rdb, asynq.Config{Concurrency: 10, Logger: discardAsynqLogger{}, LogLevel: asynq.FatalLevel})
		require.NoError(t, w.Start(mux))
		t.Cleanup(w.Shutdown)
	}
	t.Cleanup(func() { close(slow) }) // before the workers shut down

	web := http.NewServeMux()
	web.Handle("/throttle/", http.StripPrefix("/throttle", dashboard.New(lim, dashboard.WithReadOnly(false))))
	hs := httptest.NewServer(web)
	t.Cleanup(hs.Close)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(hs.URL+"/throttle/")))

	eventually(t, ctx, cardText("slack", ".forecast"), func(s string) bool { return strings.Contains(s, "backlog drains in ~") }, "slack's backlog forecast")
	eventually(t, ctx, cardText("crm", ".suspension"), func(s string) bool { return secondsLeft(s) > 0 }, "crm suspended by the 429")
	eventually(t, ctx, cardText("crm", ".r429"), func(s string) bool { return s == "1" }, "crm's 429 counted")
	eventually(t, ctx, cardText("github", ".rates .o-ran b"), func(s string) bool { f, err := strconv.ParseFloat(s, 64); return err == nil && f > 0 }, "github runs tasks")
	eventually(t, ctx, cardText("stripe", ".tier.kind-inflight .count"), func(s string) bool { return s == "2 of 2 in flight" }, "stripe's slots held")
	eventually(t, ctx, cardText("stripe", ".rates .o-deferred b"), func(s string) bool { f, err := strconv.ParseFloat(s, 64); return err == nil && f > 0 }, "stripe's other tasks refused by slots")
	eventually(t, ctx, cardText("hubspot", ".tier.kind-window .count"), func(s string) bool {
		var left int
		_, err := fmt.Sscanf(s, "%d of 60 left", &left)
		return err == nil && left < 60
	}, "hubspot's window in use")
	history := 4.0
	if *screenshot != "" {
		history = 10 // a picture worth looking at
	}
	eventually(t, ctx, `(document.querySelector('section.card[data-key="slack"] svg.spark polyline[stroke="#2f9e62"]').getAttribute('points') || '').split(' ').length`,
		func(n float64) bool { return n >= history }, "slack's sparkline has a few seconds of history")
	writeScreenshot(t, ctx)
}

// A task of several keys that its second key made wait: the page shows the
// wait on that key's card, naming the limit (tier) that made it wait; the
// first key's card shows none.
func TestBrowserNamesTheKeyAndTierThatMadeATaskWait(t *testing.T) {
	ctx := chromium(t)
	srv := redistest.Start(t)
	lim := throttle.NewLimiter(srv.Client(t), throttle.WithLogger(slog.New(slog.DiscardHandler)))
	bg := context.Background()
	require.NoError(t, lim.SetLimits(bg, "ws", throttle.PerSecond(10)))
	require.NoError(t, lim.SetLimits(bg, "app", throttle.PerSecond(100), throttle.PerHour(1)))
	web := http.NewServeMux()
	web.Handle("/throttle/", http.StripPrefix("/throttle", dashboard.New(lim)))
	hs := httptest.NewServer(web)
	t.Cleanup(hs.Close)
	h := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	task := mustTask(t, "ws:sync", nil, throttle.Key("ws", "app"))
	require.NoError(t, h.ProcessTask(bg, task), "ran")
	_ = h.ProcessTask(bg, task) // deferred by app's 1 an hour (outside a server, by a copy)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(hs.URL+"/throttle/")))
	eventually(t, ctx, cardText("app", ".waits"), func(s string) bool { return s == "tier 2 (1/h) 1" }, "app's card names its limit that made the task wait")
	assert.Equal(t, "none", js[string](t, ctx, cardText("ws", ".waits")), "ws made nothing wait")
}
