package throttle_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// On a Redis Cluster the keys of one family share a hash slot, so one
// decision covers them all (issue 30, design (a)); keys of different
// families (or none) cannot be, and the error says what to do.
func TestSeveralKeysOfOneFamilyAreDecidedOnACluster(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.StartCluster(t).Client(t)
	lim := throttle.NewLimiter(rdb)
	require.NoError(t, lim.SetLimits(ctx, "{slack}:T1", throttle.PerSecond(2)))
	require.NoError(t, lim.SetLimits(ctx, "{slack}:T2", throttle.PerSecond(2)))
	require.NoError(t, lim.SetLimits(ctx, "{slack}:app", throttle.PerSecond(3)))

	for i := range 2 {
		d, err := lim.Take(ctx, "{slack}:T1", throttle.Key("{slack}:app"))
		require.NoError(t, err, "take %d of T1", i)
		assert.True(t, d.Allowed, "take %d of T1: its burst", i)
	}
	d, err := lim.Take(ctx, "{slack}:T2", throttle.Key("{slack}:app"))
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the app's third token")
	d, err = lim.Take(ctx, "{slack}:T2", throttle.Key("{slack}:app"))
	require.NoError(t, err)
	assert.False(t, d.Allowed, "T2 has a token, the app none")
	assert.Equal(t, "{slack}:app", d.Key, "the app key refused")

	_, err = lim.Take(ctx, "slack:T1", throttle.Key("slack"))
	require.Error(t, err, "keys of no family are in different slots")
	assert.Contains(t, err.Error(), "family")
	_, err = lim.Take(ctx, "{slack}:T1", throttle.Key("{other}:app"))
	require.Error(t, err, "two families are two slots")
}
