package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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

// serve's dashboard and /metrics answer localhost, IP addresses and
// --allowed-hosts, and refuse a rebound host: its page could read the
// metrics' key and tenant names (issue 35, item 10).
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
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.NotContains(t, body, "slack")
	for _, host := range []string{"127.0.0.1:9090", "localhost", "throttle.ops.example"} {
		code, body = send(http.MethodGet, "metrics", host, "")
		assert.Equal(t, http.StatusOK, code, host)
		assert.Contains(t, body, `asynq_throttle_limit_rate{key="slack"`, host)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve warns when it allows actions on an address beyond loopback: the
// web view has no authentication of its own (issue 35, item 10).
func TestServeWarnsOfActionsBeyondLoopback(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--addr", "127.0.0.1:0", "--read-only=false"}, false},
		{[]string{"--addr", "0.0.0.0:0"}, false},
		{[]string{"--addr", "0.0.0.0:0", "--read-only=false"}, true},
	} {
		var out, errb syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, append([]string{"serve"}, tc.args...), redisEnv("redis://"+srv.Addr), nil, &out, &errb)
		}()
		require.Eventually(t, func() bool { return strings.Contains(out.String(), "serving") }, 10*time.Second, 10*time.Millisecond, "%v", tc.args)
		cancel()
		require.Equal(t, exitOK, <-done, "%v: %s", tc.args, errb.String())
		if tc.warn {
			assert.Contains(t, errb.String(), "warning: actions are on (--read-only=false) and ", "%v", tc.args)
			assert.Contains(t, errb.String(), "reachable beyond this machine", "%v", tc.args)
		} else {
			assert.NotContains(t, errb.String(), "warning", "%v", tc.args)
		}
	}
}
