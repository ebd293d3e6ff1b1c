package throttle

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// commandCalls reads INFO commandstats: calls by command name (commands
// run inside scripts included).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		out[name] = n
	}
	return out
}

// delta is what ran between two commandstats readings, but INFO itself.
func delta(before, after map[string]int64) (map[string]int64, int64) {
	d, total := map[string]int64{}, int64(0)
	for name, n := range after {
		if n -= before[name]; n > 0 && name != "info" {
			d[name] = n
			total += n
		}
	}
	return d, total
}

// Keys reads the index of the limiter's keys, not the keyspace: beside
// 20,000 keys of asynq's, listing 20 limiter keys is a handful of commands
// and no SCAN, once the first call has walked the keyspace for keys
// written before the index (issue 35, item 8: every scrape and poll
// walked the whole Redis).
func TestKeysReadsTheIndexNotTheKeyspace(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	p := rdb.Pipeline()
	for i := range 20_000 {
		p.Set(ctx, fmt.Sprintf("asynq:{default}:t:%d", i), "x", 0)
	}
	_, err := p.Exec(ctx)
	require.NoError(t, err)

	// Keys written by a version without the index: found by one SCAN.
	old := NewLimiter(rdb)
	var want []string
	for i := range 10 {
		k := fmt.Sprintf("old%02d", i)
		want = append(want, k)
		require.NoError(t, old.SetLimits(ctx, k, PerSecond(10)))
	}
	require.NoError(t, rdb.Del(ctx, keyspace.Index(keyspace.DefaultPrefix)).Err())

	lim := NewLimiter(rdb)
	// Keys a process decides on default limits, and keys set by an operator.
	dflt := NewLimiter(rdb, WithDefaultLimits(PerSecond(5)))
	for i := range 5 {
		k := fmt.Sprintf("new%02d", i)
		_, err := dflt.Take(ctx, k)
		require.NoError(t, err)
		want = append(want, k)
	}
	require.NoError(t, dflt.Close(), "Close records the keys it decided")
	for i := range 5 {
		k := fmt.Sprintf("set%02d", i)
		require.NoError(t, lim.SetLimits(ctx, k, PerSecond(10)))
		want = append(want, k)
	}

	before := commandCalls(t, rdb)
	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	d, _ := delta(before, commandCalls(t, rdb))
	assert.Positive(t, d["scan"], "the first call completes the index with SCAN: %v", d)
	// Limits set by SetLimits first (the old keys once a process records
	// them so), then the others, each by name.
	assert.Equal(t, append(append(append([]string{}, want[15:]...), want[10:15]...), want[:10]...), keys)

	for range 3 {
		before = commandCalls(t, rdb)
		keys2, err := lim.Keys(ctx)
		require.NoError(t, err)
		d, total := delta(before, commandCalls(t, rdb))
		assert.ElementsMatch(t, keys, keys2)
		assert.Zero(t, d["scan"], "no SCAN once the index is complete: %v", d)
		assert.LessOrEqual(t, total, int64(3), "commands to list 20 keys beside 20,000: %v", d)
	}
}

// An entry whose key has nothing in Redis any more is not listed, and is
// dropped from the index once it was recorded longer than the grace ago;
// one a process records again meanwhile stays.
func TestKeysDropsEntriesWhoseKeysAreGone(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	lim := NewLimiter(rdb)
	now := time.Now()
	lim.keys.now = func() time.Time { return now }
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, lim.SetLimits(ctx, k, PerSecond(1)))
	}
	keys, err := lim.Keys(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, keys)
	index := keyspace.Index(keyspace.DefaultPrefix)

	require.NoError(t, lim.Delete(ctx, "a"))
	require.NoError(t, lim.Delete(ctx, "b"))
	keys, err = lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"c"}, keys, "deleted keys are not listed")
	n, err := rdb.ZCard(ctx, index).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(7), n, "kept within the grace: a, b, c, each with its limits ({a}), and the marker")

	now = now.Add(indexGrace + time.Second)
	// b is recorded again (by another process, whose clock says now): it
	// stays, and is listed once its key is back.
	require.NoError(t, rdb.ZAddArgs(ctx, index, redis.ZAddArgs{GT: true, Members: []redis.Z{{Score: float64(now.Unix()), Member: "b"}}}).Err())
	keys, err = lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"c"}, keys)
	members, err := rdb.ZRange(ctx, index, 0, -1).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"", "b", "c", "{c}"}, members, "a and {a}, {b} dropped; b recorded again; c alive, its limits its own")

	other := NewLimiter(rdb)
	require.NoError(t, other.Suspend(ctx, "b", time.Minute))
	keys, err = lim.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"c", "b"}, keys, "b is back, without limits of its own")
}

// A Limiter that may not write the index (a viewer's ACL) still lists
// every key, through SCAN, and leaves the index alone.
func TestKeysWithoutTheRightToWriteTheIndexWalksTheKeyspace(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	op := NewLimiter(admin)
	require.NoError(t, op.SetLimits(ctx, "slack", PerSecond(1)))
	require.NoError(t, admin.Del(ctx, keyspace.Index(keyspace.DefaultPrefix)).Err())
	lib := op.runner
	require.NoError(t, lib.Load(ctx))
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "viewer", "on", ">pw", "~throttle:*", "resetchannels", "-@all",
		"+hello", "+auth", "+ping", "+fcall", "+scan", "+info", "+time", "+exists", "+hmget", "+hget",
		"+hgetall", "+get", "+zcard", "+zcount", "+zrange").Err())
	viewer := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "viewer", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = viewer.Close() })
	lim := NewLimiter(viewer)
	for range 2 {
		keys, err := lim.Keys(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"slack"}, keys)
	}
	n, err := admin.Exists(ctx, keyspace.Index(keyspace.DefaultPrefix)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the viewer wrote nothing")
}

// InspectKeys reads each key as Inspect does, in one script run; a key of
// the wrong type under the prefix is that key's error, and the others are
// read (issue 35, item 9).
func TestInspectKeysReadsEachKeyAsInspect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"redis", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.rdb(t)
			lim := NewLimiter(rdb)
			require.NoError(t, lim.SetLimits(ctx, "slack", PerSecond(5), Window(100, time.Minute)))
			require.NoError(t, lim.SetLimits(ctx, "crm", PerSecond(2), InFlight(3)))
			require.NoError(t, lim.Suspend(ctx, "crm", time.Minute))
			_, err := lim.Take(ctx, "slack")
			require.NoError(t, err)
			require.NoError(t, rdb.Set(ctx, "throttle:{broken}:b", "not a hash", 0).Err())

			got, err := lim.InspectKeys(ctx, []string{"slack", "broken", "crm", "none", "a{b}"})
			require.NoError(t, err)
			require.Len(t, got, 5)
			for _, i := range []int{0, 2, 3} {
				want, err := lim.Inspect(ctx, got[i].Key)
				require.NoError(t, err)
				require.NoError(t, got[i].Err, got[i].Key)
				// (Read a moment apart: the suspension's countdown and the
				// refill move.)
				want.SuspendedFor, got[i].Status.SuspendedFor = want.SuspendedFor.Round(time.Second), got[i].Status.SuspendedFor.Round(time.Second)
				for j := range want.Tokens {
					want.Tokens[j], got[i].Status.Tokens[j] = math.Round(want.Tokens[j]), math.Round(got[i].Status.Tokens[j])
				}
				assert.Equal(t, want, got[i].Status, got[i].Key)
			}
			assert.Equal(t, "broken", got[1].Key)
			assert.ErrorContains(t, got[1].Err, "WRONGTYPE")
			assert.ErrorContains(t, got[1].Err, `key "broken"`)
			assert.ErrorIs(t, got[4].Err, ErrInvalidKey)
			keys, err := lim.Keys(ctx)
			require.NoError(t, err)
			assert.Contains(t, keys, "broken", "listed: it has something in Redis")
		})
	}
}
