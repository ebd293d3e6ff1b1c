package throttle_test

// Regressions of fair shares through Limiter.Enqueue (issue 23).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Enqueue's decision for a task with a Tenant, reserved at the very instant
// of the decision (a paced key with a token free, the common case of an
// idle key), succeeds. (It failed in the script: fair_write computed
// r.fair_need + lapse, and fair_need was set only by a reservation
// strictly after now.)
func TestEnqueueWithTenantReservedNowSucceeds(t *testing.T) {
	for _, real := range []bool{false, true} {
		t.Run(fmt.Sprint("real redis-server ", real), func(t *testing.T) {
			r := newRig(t, quietLog)
			lim, ctx := r.lim, r.ctx
			if real {
				lim = throttle.NewLimiter(redistest.Start(t).Client(t), quietLog)
			}
			require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(10)))
			d, err := throttle.BookAs(lim, ctx, "crm", "a0", "acme", 1)
			require.NoError(t, err, "Enqueue's decision for a tenant's task")
			assert.True(t, throttle.Reserved(d), "%+v", d)
		})
	}
}

// A tenant's tasks enqueued through Limiter.Enqueue are spaced at the
// key's rate. (With the script failing, every Enqueue fell back to
// enqueueing the task as is, after the script left a reservation at now
// behind: nothing was spaced, the hash was never written, and the next
// task found the same idle key.)
func TestEnqueueWithTenantSpacesTheTenantsTasks(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb, quietLog)
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(10).WithBurst(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	var at []time.Time
	for range 10 {
		info, err := lim.Enqueue(ctx, client, newTask(t, "crm:sync", nil, throttle.Key("crm"), throttle.Tenant("acme")))
		require.NoError(t, err)
		ts, ok, err := throttle.Reservation(lim, ctx, "crm", info.ID)
		require.NoError(t, err)
		require.True(t, ok)
		at = append(at, ts)
	}
	assert.GreaterOrEqual(t, at[9].Sub(at[0]), 800*time.Millisecond, "10 tasks at 10/s burst 1 are reserved about 100 ms apart: %v", at)
	fields, err := rdb.HKeys(ctx, "throttle:{crm}:b").Result()
	require.NoError(t, err)
	assert.Contains(t, fields, "G", "the fair clock was written")
}
