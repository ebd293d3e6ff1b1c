package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Keys of one family ("{slack}:...") keep every Redis key in one Cluster
// slot, and are keys like any other: they decide, suspend, list, inspect
// and delete on a real 3-master Cluster. A key without a family keeps its
// own slot (and its state where an earlier version wrote it).
func TestFamilyKeysShareOneClusterSlot(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.StartCluster(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	family := []string{"{slack}:T0123:chat.postMessage", "{slack}:T0123", "{slack}:app"}
	for _, k := range append(family, "slack") {
		require.NoError(t, lim.SetLimits(ctx, k, throttle.PerSecond(2)), k)
		d, err := lim.Take(ctx, k)
		require.NoError(t, err, k)
		assert.True(t, d.Allowed, k)
	}
	require.NoError(t, lim.Suspend(ctx, "{slack}:app", time.Minute))

	slotOf := func(k string) int64 {
		s, err := rdb.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err, k)
		return s
	}
	want := slotOf("throttle:{" + family[0] + "}:b")
	for _, k := range family {
		for _, suffix := range []string{"b", "c"} {
			rk := "throttle:{" + k + "}:" + suffix
			n, err := rdb.Exists(ctx, rk).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "%s written", rk)
			assert.Equal(t, want, slotOf(rk), "slot of %s", rk)
		}
	}
	assert.NotEqual(t, want, slotOf("throttle:{slack}:b"), "slack without a family keeps its own slot")

	// The suspension is the key's alone; the others of the family decide.
	d, err := lim.Take(ctx, "{slack}:app")
	require.NoError(t, err)
	assert.Equal(t, throttle.RefusedBySuspension, d.Reason)
	d, err = lim.Take(ctx, "{slack}:T0123")
	require.NoError(t, err)
	assert.True(t, d.Allowed)

	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	for _, k := range append(family, "slack") {
		assert.Contains(t, keys, k)
	}
	st, err := lim.Inspect(ctx, "{slack}:app")
	require.NoError(t, err)
	assert.Positive(t, st.SuspendedFor)
	require.NoError(t, lim.Delete(ctx, "{slack}:T0123"))
	n, err := rdb.Exists(ctx, "throttle:{{slack}:T0123}:b", "throttle:{{slack}:T0123}:c").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Delete of a family key")
}
