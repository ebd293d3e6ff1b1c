package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// serve listens on loopback unless told otherwise: the dashboard has no
// authentication of its own (issue 20, D4: it listened on every interface).
func TestServeListensOnLoopbackByDefault(t *testing.T) {
	f := (&app{}).serveCmd().Flags().Lookup("addr")
	require.NotNil(t, f)
	host, _, err := net.SplitHostPort(f.DefValue)
	require.NoError(t, err, f.DefValue)
	assert.Equal(t, "127.0.0.1", host, "serve's default --addr")
}

// serve's dashboard answers localhost, IP addresses and --allowed-hosts,
// and refuses a rebound host's action; /metrics answers any host, as an
// exporter does.
func TestServeAnswersOnlyAllowedHosts(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	require.Equal(t, exitOK, cli(t, url, "set", "slack", "5/s").code)
	lim := throttle.NewLimiter(srv.Client(t))
	suspended := func() time.Duration {
		st, err := lim.Inspect(context.Background(), "slack")
		require.NoError(t, err)
		return st.SuspendedFor
	}
	base := serve(t, url, "--read-only=false", "--allowed-hosts", "throttle.ops.example,dash.internal")

	send := func(method, path, host, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Host = host
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Asynq-Throttle", "1")
			req.Header.Set("Origin", "http://"+host)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	code, body := send(http.MethodPost, "api/suspend", "attacker.example", `{"key":"slack","duration":"1h"}`)
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.Contains(t, body, "--allowed-hosts")
	assert.Zero(t, suspended(), "a rebound host suspended the key")
	code, body = send(http.MethodGet, "api/keys", "attacker.example", "")
	assert.Equal(t, http.StatusForbidden, code, body)

	for _, host := range []string{"localhost:8080", "127.0.0.1", "throttle.ops.example", "dash.internal:443"} {
		code, body = send(http.MethodGet, "api/keys", host, "")
		assert.Equal(t, http.StatusOK, code, "%s: %s", host, body)
		assert.Contains(t, body, `"slack"`, host)
	}
	code, body = send(http.MethodPost, "api/suspend", "throttle.ops.example", `{"key":"slack","duration":"30s"}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.InDelta(t, 30, suspended().Seconds(), 2)

	code, body = send(http.MethodGet, "metrics", "attacker.example", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "asynq_throttle_")
}
