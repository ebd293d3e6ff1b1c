package dashboard_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// mount serves the dashboard under /throttle/ beside another handler, as
// beside asynqmon.
func mount(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/throttle/", http.StripPrefix("/throttle", h))
	mux.HandleFunc("/monitoring/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "asynqmon") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// post sends an action as the page does (pageHeader) or not, with extra
// headers as name, value pairs ("Host" sets the request's Host).
func post(t *testing.T, url, body string, pageHeader bool, extra ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if pageHeader {
		req.Header.Set("X-Asynq-Throttle", "1")
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i] == "Host" {
			req.Host = extra[i+1]
			continue
		}
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var v map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return resp.StatusCode, v
}

// The page and its assets are served under the prefix, with nothing
// fetched from elsewhere.
func TestPageIsServedFromTheEmbeddedAssets(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	srv := mount(t, dashboard.New(throttle.NewLimiter(rdb), dashboard.WithTitle("fleet limits")))

	// Asked for without its trailing slash, it redirects relatively, so
	// that any outer prefix works (http.ServeMux redirects first when the
	// pattern ends in '/'; other routers hand the request over).
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/admin/throttle?x=1", nil)
	req.Host = "localhost:8080"
	http.StripPrefix("/admin/throttle", dashboard.New(throttle.NewLimiter(rdb))).ServeHTTP(rec, req)
	assert.Equal(t, http.StatusMovedPermanently, rec.Code)
	assert.Equal(t, "throttle/", rec.Header().Get("Location"))

	code, h, body := get(t, srv.URL+"/throttle/")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, h.Get("Content-Type"), "text/html")
	assert.Contains(t, body, "<title>fleet limits</title>")
	assert.Contains(t, body, `data-read-only="true"`, "read-only by default")
	assert.Contains(t, h.Get("Content-Security-Policy"), "default-src 'self'")

	for _, asset := range []string{"static/app.js", "static/style.css"} {
		code, _, _ := get(t, srv.URL+"/throttle/"+asset)
		assert.Equal(t, http.StatusOK, code, asset)
	}
	code, _, _ = get(t, srv.URL+"/monitoring/")
	assert.Equal(t, http.StatusOK, code, "the neighbour still answers")

	// No URL outside the dashboard in anything it serves (the SVG namespace
	// is a name, not a fetch).
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for _, asset := range []string{"", "static/app.js", "static/style.css"} {
		_, _, body := get(t, srv.URL+"/throttle/"+asset)
		for _, m := range external.FindAllString(body, -1) {
			assert.Equal(t, "http://www.w3.org", m, "external reference in %q", asset)
		}
	}
}

// api/keys shows every key's state and the decisions its Limiter's
// middleware made in this process.
func TestAPIKeysShowsStateAndDecisions(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5).WithBurst(8), throttle.PerMinute(100)))
	require.NoError(t, lim.Suspend(ctx, "zendesk", time.Minute))
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.Window(100, time.Minute), throttle.InFlight(4)))
	require.NoError(t, lim.SetLimits(ctx, "stripe", throttle.Window(100, time.Minute), throttle.InFlight(3)))
	d, err := lim.Take(ctx, "stripe", throttle.Cost(2))
	require.NoError(t, err)
	require.NotEmpty(t, d.Slot)
	srv := mount(t, dashboard.New(lim, dashboard.WithMaxKeys(2)))
	// One task through lim's middleware, whose handler the provider
	// answers 429: a decision (ran) and a suspension.
	task, err := throttle.NewTask("slack:sync", nil, throttle.Key("slack"))
	require.NoError(t, err)
	_ = lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return throttle.RateLimited(time.Second)
	})).ProcessTask(ctx, task)

	code, _, body := get(t, srv.URL+"/throttle/api/keys")
	require.Equal(t, http.StatusOK, code, body)
	type tier struct {
		Kind   string  `json:"kind"`
		Limit  string  `json:"limit"`
		Unit   string  `json:"unit"`
		Burst  int     `json:"burst"`
		Tokens float64 `json:"tokens"`
	}
	var v struct {
		ReadOnly           bool `json:"read_only"`
		DecisionsAvailable bool `json:"decisions_available"`
		Omitted            int  `json:"omitted"`
		Keys               []struct {
			Key              string                   `json:"key"`
			LimitSpec        string                   `json:"limit_spec"`
			SuspendedSeconds float64                  `json:"suspended_seconds"`
			Decisions        map[string]uint64        `json:"decisions"`
			RateLimited      uint64                   `json:"rate_limited"`
			Generation       int64                    `json:"generation"`
			InFlight         *struct{ Held, Max int } `json:"in_flight"`
			Limits           []tier                   `json:"limits"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	assert.True(t, v.ReadOnly)
	assert.True(t, v.DecisionsAvailable)
	assert.Equal(t, 1, v.Omitted, "zendesk is past WithMaxKeys(2)")
	require.Len(t, v.Keys, 2)
	k := v.Keys[0]
	assert.Equal(t, "slack", k.Key)
	assert.Equal(t, "5/s:burst=8 100/m", k.LimitSpec)
	assert.Equal(t, map[string]uint64{"ran": 1, "suspended": 1}, k.Decisions)
	assert.Equal(t, uint64(1), k.RateLimited)
	assert.Equal(t, int64(1), k.Generation)
	assert.Nil(t, k.InFlight, "no in-flight limit")
	require.Len(t, k.Limits, 2)
	assert.Equal(t, tier{Kind: "bucket", Limit: "5/s:burst=8", Unit: "requests", Burst: 8, Tokens: k.Limits[0].Tokens}, k.Limits[0])
	assert.InDelta(t, 7, k.Limits[0].Tokens, 0.2, "8 less the task's call")
	assert.Equal(t, 100, k.Limits[1].Burst)

	k = v.Keys[1]
	assert.Equal(t, "stripe", k.Key)
	assert.Equal(t, "100/m:window 3:inflight", k.LimitSpec)
	assert.Equal(t, int64(2), k.Generation, "limits set twice")
	require.NotNil(t, k.InFlight)
	assert.Equal(t, struct{ Held, Max int }{1, 3}, *k.InFlight)
	assert.Equal(t, []tier{
		{Kind: "window", Limit: "100/m:window", Unit: "requests", Burst: 100, Tokens: 98},
		{Kind: "inflight", Limit: "3:inflight", Burst: 3, Tokens: 2},
	}, k.Limits)
}

// Actions are refused in read-only mode (the default) and without the
// page's header or from another origin; allowed, they change Redis.
func TestActionsNeedWritableModeAndTheSameOrigin(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	suspended := func() time.Duration {
		st, err := lim.Inspect(ctx, "slack")
		require.NoError(t, err)
		return st.SuspendedFor
	}

	ro := mount(t, dashboard.New(lim))
	code, v := post(t, ro.URL+"/throttle/api/suspend", `{"key":"slack","duration":"30s"}`, true)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, v["error"], "read-only")
	assert.Zero(t, suspended())

	rw := mount(t, dashboard.New(lim, dashboard.WithReadOnly(false)))
	base := rw.URL + "/throttle/api/"
	for _, tc := range []struct {
		name, path, body string
		header           bool
		extra            []string
		code             int
		errPart          string
	}{
		{"no page header", "suspend", `{"key":"slack","duration":"30s"}`, false, nil, http.StatusForbidden, "X-Asynq-Throttle"},
		{"other origin", "suspend", `{"key":"slack","duration":"30s"}`, true, []string{"Origin", "https://evil.example"}, http.StatusForbidden, "cross-origin"},
		{"bad duration", "suspend", `{"key":"slack","duration":"soon"}`, true, nil, http.StatusBadRequest, "30s"},
		{"bad key", "suspend", `{"key":"a{b}","duration":"30s"}`, true, nil, http.StatusBadRequest, "invalid key"},
		{"unknown field", "suspend", `{"key":"slack","for":"30s"}`, true, nil, http.StatusBadRequest, "body"},
		{"bad limits", "limits", `{"key":"slack","limits":"10/fortnight"}`, true, nil, http.StatusBadRequest, "10/s:burst=20"},
		{"kind first", "limits", `{"key":"slack","limits":"inflight:4"}`, true, nil, http.StatusBadRequest, "as in 4:inflight"},
		{"two in-flight limits", "limits", `{"key":"slack","limits":"1:inflight 2:inflight"}`, true, nil, http.StatusBadRequest, "a key has one inflight limit"},
		{"limits out of range", "limits", `{"key":"slack","limits":"1/s 2/2s 3/3s 4/4s 5/5s 6/6s 7/7s 8/8s 9/9s"}`, true, nil, http.StatusBadRequest, "at most 8"},
		{"misspelt modifier", "limits", `{"key":"slack","limits":"500/m 30000/m:windwo"}`, true, nil, http.StatusBadRequest, "did you mean :window?"},
		{"unit on in-flight", "limits", `{"key":"slack","limits":"4:inflight:tokens"}`, true, nil, http.StatusBadRequest, "not a unit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, v := post(t, base+tc.path, tc.body, tc.header, tc.extra...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, v["error"], tc.errPart)
			assert.Zero(t, suspended())
		})
	}

	code, v = post(t, base+"suspend", `{"key":"slack","duration":"30s"}`, true, "Origin", rw.URL)
	require.Equal(t, http.StatusOK, code, v)
	assert.InDelta(t, 30, v["suspended_seconds"], 2)
	assert.InDelta(t, 30, suspended().Seconds(), 2)

	code, v = post(t, base+"resume", `{"key":"slack"}`, true)
	require.Equal(t, http.StatusOK, code, v)
	assert.Zero(t, suspended())

	code, v = post(t, base+"limits", `{"key":"slack","limits":"10/s:burst=20 50/m"}`, true)
	require.Equal(t, http.StatusOK, code, v)
	st, err := lim.Inspect(ctx, "slack")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(10).WithBurst(20), throttle.PerMinute(50).WithBurst(50)}, st.Limits)

	code, v = post(t, base+"limits", `{"key":"slack","limits":"4:inflight 5000/h:window"}`, true)
	require.Equal(t, http.StatusOK, code, v)
	assert.Equal(t, "5000/h:window 4:inflight", v["limit_spec"])
	assert.Equal(t, 3.0, v["generation"])
	st, err = lim.Inspect(ctx, "slack")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.Window(5000, time.Hour), throttle.InFlight(4)}, st.Limits)

	// Units, as the CLI writes them: the unit last.
	code, v = post(t, base+"limits", `{"key":"slack","limits":"500/m 30000/m:burst=5000:tokens 100/m:window:input-tokens 16:inflight"}`, true)
	require.Equal(t, http.StatusOK, code, v)
	assert.Equal(t, "500/m 30000/m:burst=5000:tokens 100/m:window:input-tokens 16:inflight", v["limit_spec"])
	var units []any
	for _, l := range v["limits"].([]any) {
		units = append(units, l.(map[string]any)["unit"])
	}
	assert.Equal(t, []any{"requests", "tokens", "input-tokens", nil}, units, "each rate tier's unit; none for the in-flight limit")
	st, err = lim.Inspect(ctx, "slack")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(500).WithBurst(500), throttle.PerMinute(30000).WithBurst(5000).In("tokens"),
		throttle.Window(100, time.Minute).In("input-tokens"), throttle.InFlight(16)}, st.Limits)
}

// TestAPIKeysShowsTheLimitInForce: a key cut by adaptive mode after a 429 shows the
// limit in force beside the configured one, and its burst in force.
func TestAPIKeysShowsTheLimitInForce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(20), throttle.Adaptive(30*time.Second)))
	require.NoError(t, lim.Suspend(ctx, "crm", time.Second))
	srv := mount(t, dashboard.New(lim))
	code, _, body := get(t, srv.URL+"/throttle/api/keys")
	require.Equal(t, http.StatusOK, code, body)
	var v struct {
		Keys []struct {
			Key    string `json:"key"`
			Limits []struct {
				Limit   string `json:"limit"`
				InForce string `json:"in_force"`
				Burst   int    `json:"burst"`
			} `json:"limits"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	require.Len(t, v.Keys, 1, body)
	require.NotEmpty(t, v.Keys[0].Limits, body)
	assert.Equal(t, "20/s", v.Keys[0].Limits[0].Limit, "configured")
	assert.Equal(t, "10/s", v.Keys[0].Limits[0].InForce, "halved by adaptive mode")
	assert.Equal(t, 10, v.Keys[0].Limits[0].Burst, "the burst in force")
}

// A site that rebinds its own name to the dashboard's address (DNS
// rebinding) sends that name as Host and as Origin, so the same-origin
// check passes: the Host check refuses it, for actions and reads alike.
// Issue 20 (D4) observed this POST suspend the key for an hour.
func TestRebindingHostIsRefused(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	suspended := func() time.Duration {
		st, err := lim.Inspect(ctx, "slack")
		require.NoError(t, err)
		return st.SuspendedFor
	}
	srv := mount(t, dashboard.New(lim, dashboard.WithReadOnly(false), dashboard.WithAllowedHosts("ops.example.com")))
	base := srv.URL + "/throttle/"

	code, v := post(t, base+"api/suspend", `{"key":"slack","duration":"1h"}`, true,
		"Host", "attacker.example", "Origin", "http://attacker.example")
	assert.Equal(t, http.StatusForbidden, code, v)
	assert.Contains(t, v["error"], `host "attacker.example" not allowed`)
	assert.Zero(t, suspended(), "the rebinding POST suspended the key")

	for _, path := range []string{"", "api/keys", "static/app.js"} {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Host = "attacker.example:80"
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "GET %s", path)
		assert.NotContains(t, string(b), "slack", "GET %s shows a key to a rebound host", path)
	}

	// Loopback names, IP addresses and the allowed host act as before.
	for _, host := range []string{"localhost", "127.0.0.1", "[::1]", "ops.example.com"} {
		code, v = post(t, base+"api/suspend", `{"key":"slack","duration":"30s"}`, true,
			"Host", host+":8080", "Origin", "http://"+host+":8080")
		require.Equal(t, http.StatusOK, code, "%s: %v", host, v)
		assert.InDelta(t, 30, suspended().Seconds(), 2, host)
		code, v = post(t, base+"api/resume", `{"key":"slack"}`, true, "Host", host+":8080")
		require.Equal(t, http.StatusOK, code, "%s: %v", host, v)
		assert.Zero(t, suspended(), host)
	}
}

// The Host check: localhost and IP addresses by default, the names given
// to WithAllowedHosts besides, compared without case, port or final dot;
// nothing else, not even names under .localhost.
func TestHostCheckAllowsLocalhostIPsAndNamedHosts(t *testing.T) {
	lim := throttle.NewLimiter(redistest.Start(t).Client(t))
	byDefault := dashboard.New(lim)
	withOps := dashboard.New(lim, dashboard.WithAllowedHosts("ops.example.com", "Dash.Internal:8443"))
	for _, tc := range []struct {
		host             string
		byDefault, byOps bool
	}{
		{"localhost", true, true},
		{"localhost:8080", true, true},
		{"LocalHost:8080", true, true},
		{"localhost.:8080", true, true},
		{"127.0.0.1:8080", true, true},
		{"127.0.0.1", true, true},
		{"[::1]:8080", true, true},
		{"[::1]", true, true},
		{"10.0.0.7:8080", true, true},
		{"[fe80::1]:80", true, true},
		{"ops.example.com", false, true},
		{"OPS.Example.com:443", false, true},
		{"ops.example.com.", false, true},
		{"dash.internal", false, true},
		{"attacker.example", false, false},
		{"attacker.example:8080", false, false},
		{"sub.ops.example.com", false, false},
		{"example.com", false, false},
		{"localhost.attacker.example", false, false},
		{"attackerlocalhost", false, false},
		{"x.localhost", false, false},
		{"127.0.0.1.nip.io", false, false},
		{"", false, false},
	} {
		for _, d := range []struct {
			name  string
			h     http.Handler
			allow bool
		}{{"default", byDefault, tc.byDefault}, {"WithAllowedHosts", withOps, tc.byOps}} {
			req := httptest.NewRequest(http.MethodGet, "/static/style.css", nil)
			req.Host = tc.host
			rec := httptest.NewRecorder()
			d.h.ServeHTTP(rec, req)
			want := http.StatusForbidden
			if d.allow {
				want = http.StatusOK
			}
			assert.Equal(t, want, rec.Code, "%s: Host %q", d.name, tc.host)
		}
	}
}

// api/keys shows the tenants of a key (for tasks booked by the library's
// Enqueue for three tenants, one the default): name, weight, share,
// backlog, work admitted; a key without tenants has no tenants field.
func TestAPIKeysShowsTheTenantsOfAKey(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "llm", throttle.PerMinute(30)))
	require.NoError(t, lim.SetWeights(ctx, "llm", map[string]int{"gold": 3, "silver": 2}))
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	for range 4 {
		for _, tenant := range []string{"gold", "plain", ""} {
			opts := []asynq.Option{throttle.Key("llm")}
			if tenant != "" {
				opts = append(opts, throttle.Tenant(tenant))
			}
			task, err := throttle.NewTask("llm:chat", nil, opts...)
			require.NoError(t, err)
			_, err = lim.Enqueue(ctx, client, task)
			require.NoError(t, err)
		}
	}
	srv := mount(t, dashboard.New(lim))
	code, _, body := get(t, srv.URL+"/throttle/api/keys")
	require.Equal(t, http.StatusOK, code, body)
	type tenant struct {
		Name     string  `json:"name"`
		Weight   int     `json:"weight"`
		Share    float64 `json:"share"`
		Backlog  float64 `json:"backlog"`
		Admitted int64   `json:"admitted"`
	}
	var v struct {
		Keys []struct {
			Key     string   `json:"key"`
			Tenants []tenant `json:"tenants"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	require.Len(t, v.Keys, 2, body)
	llm := v.Keys[0]
	require.Equal(t, "llm", llm.Key)
	require.Len(t, llm.Tenants, 4, "three with work booked, then silver with a weight: %s", body)
	byName := map[string]tenant{}
	for _, tn := range llm.Tenants {
		byName[tn.Name] = tn
	}
	for name, want := range map[string]struct {
		weight int
		share  float64
	}{"gold": {3, 0.6}, "plain": {1, 0.2}, "": {1, 0.2}, "silver": {2, 0}} {
		tn, ok := byName[name]
		require.True(t, ok, "tenant %q: %s", name, body)
		assert.Equal(t, want.weight, tn.Weight, name)
		assert.InDelta(t, want.share, tn.Share, 1e-9, name)
		if want.share > 0 {
			assert.Greater(t, tn.Backlog, 0.0, "%q has work booked", name)
			assert.LessOrEqual(t, tn.Backlog, 5.0, "%q: about its 4 tasks", name)
		} else {
			assert.Zero(t, tn.Backlog, name)
		}
		assert.Zero(t, tn.Admitted, "%q: nothing ran", name)
	}
	assert.Equal(t, "silver", llm.Tenants[3].Name, "the tenants with work booked come first")

	assert.Equal(t, "slack", v.Keys[1].Key)
	assert.Nil(t, v.Keys[1].Tenants)
	var raw struct {
		Keys []map[string]json.RawMessage `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	assert.NotContains(t, raw.Keys[1], "tenants", "a key without tenants has no tenants field")
}

// One Redis key of the wrong type under the limiter's prefix shows its
// error on its own row; every other key is listed (issue 35, item 9: the
// whole view answered 502).
func TestAPIKeysShowsABrokenKeysErrorAndTheRest(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	require.NoError(t, lim.SetLimits(ctx, "zendesk", throttle.PerSecond(7)))
	require.NoError(t, rdb.Set(ctx, "throttle:{broken}:b", "x", 0).Err())
	srv := mount(t, dashboard.New(lim))
	code, _, body := get(t, srv.URL+"/throttle/api/keys")
	require.Equal(t, http.StatusOK, code, body)
	var v struct {
		Keys []struct {
			Key    string `json:"key"`
			Error  string `json:"error"`
			Limits []struct {
				Limit string `json:"limit"`
			} `json:"limits"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	byKey := map[string]int{}
	for i, k := range v.Keys {
		byKey[k.Key] = i
	}
	require.Len(t, v.Keys, 3, body)
	assert.Contains(t, v.Keys[byKey["broken"]].Error, "WRONGTYPE")
	assert.Empty(t, v.Keys[byKey["slack"]].Error)
	assert.Equal(t, "5/s", v.Keys[byKey["slack"]].Limits[0].Limit)
	assert.Equal(t, "7/s", v.Keys[byKey["zendesk"]].Limits[0].Limit)
}

// Every response carries the headers a trusted admin tool sends (issue
// 35, item 10): no framing by another site, no referrer to one.
func TestResponsesRefuseFramingAndReferrers(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	srv := mount(t, dashboard.New(throttle.NewLimiter(rdb)))
	for _, p := range []string{"", "api/keys", "static/app.js"} {
		code, h, _ := get(t, srv.URL+"/throttle/"+p)
		require.Equal(t, http.StatusOK, code, p)
		assert.Equal(t, "SAMEORIGIN", h.Get("X-Frame-Options"), p)
		assert.Equal(t, "no-referrer", h.Get("Referrer-Policy"), p)
		assert.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'self'", p)
	}
}

// Every action taken from the page is logged through the Limiter's
// logger: what, on which key, from where, and a refusal too (issue 35,
// item 10).
func TestActionsAreLoggedThroughTheLimitersLogger(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	var logs safeBuffer
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(5)))
	srv := mount(t, dashboard.New(lim, dashboard.WithReadOnly(false)))
	host := strings.TrimPrefix(srv.URL, "http://")
	code, body := post(t, srv.URL+"/throttle/api/suspend", `{"key":"slack","duration":"30s"}`, true, "Origin", srv.URL, "X-Forwarded-For", "203.0.113.7")
	require.Equal(t, http.StatusOK, code, body)
	code, body = post(t, srv.URL+"/throttle/api/limits", `{"key":"slack","limits":"10/s 20/s"}`, true, "Origin", srv.URL)
	require.Equal(t, http.StatusBadRequest, code, body)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "dashboard") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 2, logs.String())
	assert.Contains(t, lines[0], `msg="asynq-throttle dashboard: action taken" action=suspend key=slack duration=30s remote_addr=127.0.0.1:`)
	assert.Contains(t, lines[0], "host="+host)
	assert.Contains(t, lines[0], "forwarded_for=203.0.113.7")
	assert.Contains(t, lines[1], `level=WARN msg="asynq-throttle dashboard: action refused" action=limits key=slack limits="10/s 20/s"`)
}

// safeBuffer is a bytes.Buffer for a logger and a reader.
type safeBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A task of several keys that its second key made wait is shown on that
// key, with the limit that made it wait (its tier); its first key, which
// admitted it, shows no wait.
func TestAPIKeysNamesTheKeyAndTierThatMadeTasksWait(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, lim.SetLimits(ctx, "ws", throttle.PerSecond(10)))
	require.NoError(t, lim.SetLimits(ctx, "app", throttle.PerSecond(100), throttle.PerHour(1)))
	srv := mount(t, dashboard.New(lim))
	task, err := throttle.NewTask("ws:sync", nil, throttle.Key("ws", "app"))
	require.NoError(t, err)
	h := lim.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	require.NoError(t, h.ProcessTask(ctx, task), "ran")
	_ = h.ProcessTask(ctx, task) // deferred: app's 1 an hour (outside a server, by a copy)

	code, _, body := get(t, srv.URL+"/throttle/api/keys")
	require.Equal(t, http.StatusOK, code, body)
	var v struct {
		Keys []struct {
			Key       string            `json:"key"`
			Decisions map[string]uint64 `json:"decisions"`
			Waits     map[string]uint64 `json:"waits"`
			Limits    []struct {
				Limit string `json:"limit"`
			} `json:"limits"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	byKey := map[string]int{}
	for i, k := range v.Keys {
		byKey[k.Key] = i
	}
	require.Contains(t, byKey, "app", body)
	require.Contains(t, byKey, "ws", body)
	app, ws := v.Keys[byKey["app"]], v.Keys[byKey["ws"]]
	assert.Equal(t, map[string]uint64{"tier 2": 1}, app.Waits, "app's second limit made the task wait: %s", body)
	assert.Equal(t, "1/h", app.Limits[1].Limit, "tier 2 as the page names it")
	assert.Equal(t, uint64(1), app.Decisions["deferred"])
	assert.Empty(t, ws.Waits, "ws made nothing wait")
	assert.Equal(t, map[string]uint64{"ran": 1}, ws.Decisions, "the run counts on the task's first key")
}
