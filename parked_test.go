package throttle_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// parking is a one-server fleet draining key "crm" at 100/s whose first
// task reports a rate limit: the key is suspended, and the process defers
// the key's next tasks from its cached suspension (parks them).
type parking struct {
	fleet     *fleet
	logs      *logtest.Recorder
	parked    atomic.Int64 // tasks deferred from the cached suspension
	limitedAt atomic.Int64 // when the first task reported the limit (Unix ns)
}

// startParking starts a parking fleet whose first task asks for a
// suspension of d.
func startParking(t *testing.T, d time.Duration) *parking {
	p := &parking{logs: &logtest.Recorder{}}
	var once sync.Once
	p.fleet = startFleet(t, fleetConfig{
		servers: 1,
		opts:    []throttle.Option{throttle.WithLogger(p.logs.Logger()), throttle.WithReservationHorizon(0)},
		observer: func(ev throttle.Event) {
			if ev.Cached && ev.Outcome == throttle.Deferred {
				p.parked.Add(1)
			}
		},
		handler: func(ctx context.Context, task *asynq.Task) error {
			var err error
			once.Do(func() {
				p.limitedAt.Store(time.Now().UnixNano())
				err = throttle.RateLimited(d)
			})
			return err
		},
	})
	p.fleet.setLimits("crm", throttle.PerSecond(100))
	return p
}

// A 429 suspends the key; tasks deferred from the process's cached
// suspension are checked when the cache ends. A suspension that simply ran
// its course moves none of them, and nothing is logged: no "ended early
// (Resume)" nobody called.
func TestE2ENoFalseEarlyEndLogAfterA429(t *testing.T) {
	t.Parallel()
	p := startParking(t, 2*time.Second)
	f, logs := p.fleet, p.logs
	f.enqueue("crm", "job", 30)
	f.waitDone(30, 30*time.Second)
	f.audit(30)
	require.Positive(t, p.parked.Load(), "no task was deferred from the cached suspension: the test proves nothing")
	// The check runs when the cached suspension ends (2 s after the 429).
	checked := time.Unix(0, p.limitedAt.Load()).Add(2*time.Second + 500*time.Millisecond)
	require.Eventually(t, func() bool { return time.Now().After(checked) }, 10*time.Second, 50*time.Millisecond)
	for _, r := range logs.Find("") {
		assert.False(t, logtest.Attr(r, "tasks").Any() != nil, "a suspension that ran its course logged: %q tasks=%v", r.Message, logtest.Attr(r, "tasks"))
	}
}

// When the suspension does end before the tasks deferred from the cache
// are due (here its end is deleted from Redis, as a Resume whose own
// bring-back failed would leave it), those tasks are brought back when the
// cache ends, and a line says how many.
func TestE2EParkedTasksBroughtBackAreLogged(t *testing.T) {
	t.Parallel()
	p := startParking(t, time.Minute)
	f, logs, parked := p.fleet, p.logs, &p.parked
	f.enqueue("crm", "job", 20)
	require.Eventually(t, func() bool { return parked.Load() > 0 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, f.rdb.HDel(context.Background(), "throttle:{crm}:b", "s").Err())
	// The cache ends 5 s after the 429 (suspensionCacheMax).
	require.Eventually(t, func() bool { return len(logs.Find("run now")) > 0 }, 10*time.Second, 50*time.Millisecond,
		"no line for the tasks brought back")
	require.Eventually(t, func() bool { return f.rec.count() >= int(parked.Load()) }, 10*time.Second, 50*time.Millisecond,
		"the tasks brought back ran (not the minute they were told)")
	// One line per cached suspension that parked tasks (a process may have
	// cached the same suspension twice).
	var brought int64
	for _, l := range logs.Find("run now") {
		assert.Equal(t, "crm", logtest.Attr(l, "key").String())
		assert.Positive(t, logtest.Attr(l, "tasks").Int64(), "a line for no task brought back")
		brought += logtest.Attr(l, "tasks").Int64()
	}
	assert.LessOrEqual(t, brought, parked.Load(), "tasks brought back, of those parked")
}
