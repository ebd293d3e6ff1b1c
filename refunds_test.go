package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Refunds reach a booked backlog (issue 29, item 9): tasks enqueued
// through Limiter.Enqueue book 200 tokens each and use 50; the refunds
// their handlers settle with Used bring the latest booked tasks forward
// (asynq's RunTask), so that tasks run well before the times they were
// booked for, each once. 30 tasks on 1,000 tokens a second, a bucket of
// 2,000: booked at their estimates, the last ones wait 4 s.
func TestE2ERefundsBringBookedTasksForward(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{servers: 2, handler: func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Used(ctx, "tokens", 50)
	}})
	f.setLimits("llm", throttle.PerSecond(100), throttle.PerSecond(1000).WithBurst(2000).In("tokens"))
	lim := throttle.NewLimiter(f.rdb, throttle.WithLogger(quiet))
	ctx := context.Background()
	const n = 30
	var mu sync.Mutex
	bookedFor := map[string]time.Time{}
	start := time.Now()
	for i := range n {
		job := fmt.Sprintf("job-%d", i)
		info, err := lim.Enqueue(ctx, f.client, newTask(t, "sync:llm", []byte(job), throttle.Key("llm"), throttle.Uses("tokens", 200)))
		require.NoError(t, err)
		f.jobOfID.Store(info.ID, job)
		mu.Lock()
		bookedFor[job] = info.NextProcessAt
		mu.Unlock()
	}
	f.waitDone(n, 20*time.Second)
	f.audit(n)
	early, last := 0, time.Time{}
	f.rec.mu.Lock()
	for job, runs := range f.rec.runs {
		if runs[0].Before(bookedFor[job].Add(-time.Second)) {
			early++
		}
	}
	f.rec.mu.Unlock()
	for _, at := range bookedFor {
		if at.After(last) {
			last = at
		}
	}
	t.Logf("%d of %d tasks ran over a second before the time they were booked for (the last booked for %v after the first enqueue)", early, n, last.Sub(start).Round(time.Second))
	assert.GreaterOrEqual(t, early, 5, "tasks brought forward by the refunds")
}
