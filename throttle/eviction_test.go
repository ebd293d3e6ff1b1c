package throttle_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// useLimiter creates a Limiter on rdb logging to a recorder, uses it as an
// application would (a middleware, decisions), and waits until its eviction
// check has logged its Debug or Warn line.
func useLimiter(t *testing.T, rdb redis.UniversalClient) *logtest.Recorder {
	t.Helper()
	h := &logtest.Recorder{}
	l := throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(h)),
		throttle.WithDefaultLimits(throttle.PerSecond(100)), throttle.WithTimeout(2*time.Second))
	_ = l.Middleware()
	for range 5 {
		_, _ = l.Take(context.Background(), "api")
	}
	require.Eventually(t, func() bool { return len(h.Find("maxmemory")) > 0 },
		5*time.Second, 10*time.Millisecond, "the eviction check logged nothing")
	// The check ends with its one line: nothing more will come.
	require.Len(t, h.Find("maxmemory"), 1, "the eviction check logged more than once")
	return h
}

// A Limiter warns once, at creation, when Redis may evict its keys: under
// allkeys-* any key, under volatile-* any key with a TTL, which all of ours
// have. Under noeviction, and when the policy cannot be read, it says so at
// Debug only.
func TestLimiterWarnsWhenRedisMayEvictItsKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy string
		warn   bool
	}{
		{"noeviction", false},
		{"allkeys-lru", true},
		{"allkeys-lfu", true},
		{"allkeys-random", true},
		{"volatile-lru", true},
		{"volatile-ttl", true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, "--maxmemory-policy", tc.policy)
			h := useLimiter(t, s.Client(t))
			var warns []slog.Record
			for _, w := range h.AtLeast(slog.LevelWarn) {
				if strings.Contains(w.Message, "maxmemory") {
					warns = append(warns, w)
				}
			}
			if !tc.warn {
				assert.Empty(t, warns, "warnings under noeviction")
				return
			}
			require.Len(t, warns, 1, "warnings under %s", tc.policy)
			w := warns[0]
			assert.Contains(t, w.Message, "maxmemory-policy noeviction", "the warning says what to set")
			assert.Contains(t, w.Message, "over-admits", "the warning says what goes wrong")
			assert.Equal(t, tc.policy, logtest.Attr(w, "maxmemory_policy").String())
			assert.Equal(t, s.Addr, logtest.Attr(w, "redis").String())
			t.Logf("WARN %s maxmemory_policy=%s redis=%s", w.Message, logtest.Attr(w, "maxmemory_policy").String(), logtest.Attr(w, "redis").String())
		})
	}

	// miniredis has no INFO memory: one Debug line, no warning, no error.
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		h := useLimiter(t, rdb)
		assert.Empty(t, h.AtLeast(slog.LevelInfo), "a Redis without INFO memory made the limiter noisy")
		require.Len(t, h.Find("cannot read maxmemory-policy"), 1)
	})

	// A Redis that is down when the Limiter is created: Debug only.
	t.Run("down", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		rdb := s.Client(t)
		s.Stop()
		h := &logtest.Recorder{}
		throttle.NewLimiter(rdb, throttle.WithLogger(slog.New(h)))
		require.Eventually(t, func() bool { return len(h.Find("cannot read maxmemory-policy")) == 1 },
			5*time.Second, 10*time.Millisecond)
		assert.Empty(t, h.AtLeast(slog.LevelInfo))
	})

	// On a Cluster every master is asked; one warning names the ones that
	// may evict.
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t)
		node := redis.NewClient(&redis.Options{Addr: c.Addrs[1]})
		t.Cleanup(func() { _ = node.Close() })
		require.NoError(t, node.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err())
		h := useLimiter(t, c.Client(t))
		warns := h.Find("maxmemory-policy noeviction")
		require.Len(t, warns, 1)
		assert.Equal(t, "allkeys-lru", logtest.Attr(warns[0], "maxmemory_policy").String())
		assert.Equal(t, c.Addrs[1], logtest.Attr(warns[0], "redis").String(), "the warning names the master that may evict, only it")
	})

	// A failover client (Sentinel) asks the master it would write to.
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		s := redistest.StartSentinel(t, "--maxmemory-policy", "volatile-lru")
		h := useLimiter(t, s.Client(t))
		warns := h.Find("maxmemory-policy noeviction")
		require.Len(t, warns, 1)
		assert.Equal(t, "volatile-lru", logtest.Attr(warns[0], "maxmemory_policy").String())
		assert.Equal(t, s.Master(t), logtest.Attr(warns[0], "redis").String(), "the warning names the master")
	})
}

// A Limiter warns once when Redis persists nothing (appendonly no and no
// save points: a restart loses asynq's tasks, 26 of 40 in a kill -9 test),
// naming the settings, and not when it keeps an AOF or RDB save points
// (issue 34, item 10).
func TestLimiterWarnsWhenRedisPersistsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		warn bool
	}{
		{"nothing", nil, true},
		{"aof", []string{"--appendonly", "yes"}, false},
		{"rdb", []string{"--save", "3600 1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, tc.args...)
			h := useLimiter(t, s.Client(t))
			warns := h.Find("persists nothing")
			if !tc.warn {
				assert.Empty(t, warns)
				return
			}
			require.Len(t, warns, 1, "one warning")
			assert.Contains(t, warns[0].Message, "appendonly yes", "the warning says what to set")
			assert.Equal(t, s.Addr, logtest.Attr(warns[0], "redis").String())
		})
	}
}
