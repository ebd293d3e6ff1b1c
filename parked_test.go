package throttle_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// logCapture keeps every log record's message and attributes.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *logCapture) logger() *slog.Logger { return slog.New(captureHandler{c}) }

// with returns the records whose message contains s.
func (c *logCapture) with(s string) []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []slog.Record
	for _, r := range c.recs {
		if strings.Contains(r.Message, s) {
			out = append(out, r)
		}
	}
	return out
}

type captureHandler struct{ c *logCapture }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.recs = append(h.c.recs, r.Clone())
	return nil
}
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

// attr returns the value of r's attribute k.
func attr(r slog.Record, k string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == k {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// A 429 suspends the key; tasks deferred from the process's cached
// suspension are checked when the cache ends. A suspension that simply ran
// its course moves none of them, and nothing is logged: no "ended early
// (Resume)" nobody called.
func TestE2ENoFalseEarlyEndLogAfterA429(t *testing.T) {
	t.Parallel()
	var (
		logs      logCapture
		once      sync.Once
		limitedAt atomic.Int64
		parked    atomic.Int64
	)
	f := startFleet(t, fleetConfig{
		servers: 1,
		opts:    []throttle.Option{throttle.WithLogger(logs.logger()), throttle.WithReservationHorizon(0)},
		observer: func(ev throttle.Event) {
			if ev.Cached && ev.Outcome == throttle.Deferred {
				parked.Add(1)
			}
		},
		handler: func(ctx context.Context, task *asynq.Task) error {
			var err error
			once.Do(func() {
				limitedAt.Store(time.Now().UnixNano())
				err = throttle.RateLimited(2 * time.Second)
			})
			return err
		},
	})
	f.setLimits("crm", throttle.PerSecond(100))
	f.enqueue("crm", "job", 30)
	f.waitDone(30, 30*time.Second)
	f.audit(30)
	require.Positive(t, parked.Load(), "no task was deferred from the cached suspension: the test proves nothing")
	// The check runs when the cached suspension ends (2 s after the 429).
	checked := time.Unix(0, limitedAt.Load()).Add(2*time.Second + 500*time.Millisecond)
	require.Eventually(t, func() bool { return time.Now().After(checked) }, 10*time.Second, 50*time.Millisecond)
	for _, r := range logs.with("") {
		assert.False(t, attr(r, "tasks").Any() != nil, "a suspension that ran its course logged: %q tasks=%v", r.Message, attr(r, "tasks"))
	}
}

// When the suspension does end before the tasks deferred from the cache
// are due (here its end is deleted from Redis, as a Resume whose own
// bring-back failed would leave it), those tasks are brought back when the
// cache ends, and a line says how many.
func TestE2EParkedTasksBroughtBackAreLogged(t *testing.T) {
	t.Parallel()
	var (
		logs   logCapture
		once   sync.Once
		parked atomic.Int64
	)
	f := startFleet(t, fleetConfig{
		servers: 1,
		opts:    []throttle.Option{throttle.WithLogger(logs.logger()), throttle.WithReservationHorizon(0)},
		observer: func(ev throttle.Event) {
			if ev.Cached && ev.Outcome == throttle.Deferred {
				parked.Add(1)
			}
		},
		handler: func(ctx context.Context, task *asynq.Task) error {
			var err error
			once.Do(func() { err = throttle.RateLimited(time.Minute) })
			return err
		},
	})
	f.setLimits("crm", throttle.PerSecond(100))
	f.enqueue("crm", "job", 20)
	require.Eventually(t, func() bool { return parked.Load() > 0 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, f.rdb.HDel(context.Background(), "throttle:{crm}:b", "s").Err())
	// The cache ends 5 s after the 429 (suspensionCacheMax).
	require.Eventually(t, func() bool { return len(logs.with("run now")) > 0 }, 10*time.Second, 50*time.Millisecond,
		"no line for the tasks brought back")
	require.Eventually(t, func() bool { return f.rec.count() >= int(parked.Load()) }, 10*time.Second, 50*time.Millisecond,
		"the tasks brought back ran (not the minute they were told)")
	// One line per cached suspension that parked tasks (a process may have
	// cached the same suspension twice).
	var brought int64
	for _, l := range logs.with("run now") {
		assert.Equal(t, "crm", attr(l, "key").String())
		assert.Positive(t, attr(l, "tasks").Int64(), "a line for no task brought back")
		brought += attr(l, "tasks").Int64()
	}
	assert.LessOrEqual(t, brought, parked.Load(), "tasks brought back, of those parked")
}
