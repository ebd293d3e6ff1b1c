package throttle_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Keys finds a key by any of its Redis keys (limits, a suspension alone,
// reservations alone), sorted, only under its own prefix; Delete removes
// everything of a key.
func TestKeysFindsAndDeleteRemovesEveryPartOfAKey(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := throttle.NewLimiter(rdb)

	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(1)))
	require.NoError(t, lim.Suspend(ctx, "github", time.Minute))
	// "crm" gets a reservation (and state), then loses its limits.
	require.NoError(t, lim.SetLimits(ctx, "crm", throttle.PerSecond(1)))
	_, err := lim.Take(ctx, "crm")
	require.NoError(t, err)
	d, err := throttle.Reserve(lim, ctx, "crm", "task-1", time.Minute, time.Second)
	require.NoError(t, err)
	require.True(t, throttle.Reserved(d))
	other := throttle.NewLimiter(rdb, throttle.WithPrefix("other"))
	require.NoError(t, other.SetLimits(ctx, "zendesk", throttle.PerSecond(1)))
	require.NoError(t, rdb.Set(ctx, "throttle:not-a-key", "x", 0).Err())

	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"crm", "slack", "github"}, keys, "the keys with limits of their own first")
	keys, err = other.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"zendesk"}, keys)

	slot, ok, err := throttle.Reservation(lim, ctx, "crm", "task-1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, throttle.ReservedAt(d), slot)
	_, ok, err = throttle.Reservation(lim, ctx, "crm", "task-2")
	require.NoError(t, err)
	assert.False(t, ok)

	for _, k := range []string{"crm", "github"} {
		require.NoError(t, lim.Delete(ctx, k))
	}
	require.NoError(t, lim.Delete(ctx, "never-was"))
	keys, err = lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"slack"}, keys)
	st, err := lim.Inspect(ctx, "crm")
	require.NoError(t, err)
	assert.Equal(t, throttle.Status{}, st)
	st, err = lim.Inspect(ctx, "github")
	require.NoError(t, err)
	assert.Zero(t, st.SuspendedFor)

	assert.ErrorIs(t, lim.Delete(ctx, "bad{key}"), throttle.ErrInvalidKey)
	_, _, err = throttle.Reservation(lim, ctx, "", "t")
	assert.ErrorIs(t, err, throttle.ErrInvalidKey)
}

// On a Cluster, Keys walks every master: 40 keys spread over three.
func TestKeysWalksEveryClusterMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.StartCluster(t)
	rdb := c.Client(t)
	lim := throttle.NewLimiter(rdb)
	var want []string
	for i := range 40 {
		k := fmt.Sprintf("k%02d", i)
		want = append(want, k)
		require.NoError(t, lim.SetLimits(ctx, k, throttle.PerSecond(5)))
	}
	// The keys really are on more than one master.
	var masters atomic.Int32
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if n > 0 {
			masters.Add(1)
		}
		return err
	}))
	require.Greater(t, masters.Load(), int32(1))

	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, keys)

	require.NoError(t, lim.Delete(ctx, "k07"))
	keys, err = lim.Keys(ctx)
	require.NoError(t, err)
	assert.NotContains(t, keys, "k07")
	assert.Len(t, keys, 39)
}
