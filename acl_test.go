package throttle_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// Least privilege with Redis ACLs (Redis 7: FCALL and first-arg rules).
// The notes in /work/wt/notes/acl-readme.md explain the rules below; in
// short:
//
//   - Redis checks every command a script or function runs against the ACL
//     of the user that called it, and declares FCALL's keys read-write. A
//     user that may decide must be allowed HSET on the key's hash, and the
//     limits live in that hash (the L field): whoever holds the worker's
//     password can change limits with a plain HSET. No ACL stops that with
//     the storage layout as it is.
//   - What an ACL can enforce is which functions a user may call: FCALL
//     takes first-arg rules (+fcall|name), and a worker denied EVAL,
//     EVALSHA and FUNCTION LOAD cannot run any other code. So the worker's
//     Limiter is refused SetLimits, Resume, Delete and Keys (and the CLI or
//     dashboard run with the worker's credentials is refused them); it
//     keeps Suspend, which its own 429 path calls.
//   - asynq needs EVAL and EVALSHA for its own scripts, so the worker talks
//     to asynq as another user, whose keys are asynq's only
//     (WithTaskRedis).
//   - A viewer (metrics, a read-only dashboard) is enforceable in full: it
//     calls inspect and has no write command at all.

// aclScriptCommands are the commands the worker's functions run
// (internal/lua/*.lua: decide, inspect, adjust, release, extend, suspend,
// observe).
var aclScriptCommands = []string{"time", "hmget", "hget", "hgetall", "hset", "hdel", "exists", "get",
	"pexpire", "pttl", "zadd", "zrem", "zscore", "zcard", "zcount", "zrange", "zremrangebyscore"}

// aclOperatorScriptCommands are the commands only the operator's functions
// run (setlimits, resume).
var aclOperatorScriptCommands = []string{"del", "hkeys"}

// aclWorkerFunctions are the library's functions a worker calls.
var aclWorkerFunctions = []string{"decide", "inspect", "adjust", "release", "extend", "suspend", "observe"}

// aclAsynqCommands are what asynq v0.26 sends for a worker, a client and an
// inspector (its scripts and its own calls, internal/rdb), on keys asynq:*
// and the channel asynq:cancel.
var aclAsynqCommands = []string{"eval", "evalsha", "info", "ping", "publish", "subscribe",
	"del", "exists", "expire", "expireat", "get", "set", "setex", "setnx", "incr",
	"hset", "hget", "hmget", "hdel", "hvals", "llen", "lpush", "rpush", "lrange", "lrem", "rpoplpush",
	"sadd", "srem", "smembers", "sismember",
	"zadd", "zrem", "zcard", "zscore", "zrange", "zrangebyscore", "zrevrange", "zremrangebyscore", "zremrangebyrank",
	"memory|usage"}

// aclConnection is what go-redis sends when it connects.
var aclConnection = []string{"hello", "auth", "ping", "client|setinfo"}

// functionName is the name a script has in this version's function library.
func functionName(script string) string {
	version := strings.TrimPrefix(lua.LibraryName, "asynq_throttle_")
	return "asynq_throttle_" + script + "_" + version
}

// aclRules are ACL SETUSER rules allowing each command of cmds.
func aclRules(cmds ...[]string) []string {
	var out []string
	for _, list := range cmds {
		for _, c := range list {
			out = append(out, "+"+c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// aclUsers are the three users of a fleet, as ACL SETUSER rules.
func aclUsers() map[string][]string {
	var fcalls []string
	for _, f := range aclWorkerFunctions {
		fcalls = append(fcalls, "fcall|"+functionName(f))
	}
	return map[string][]string{
		// The worker's user for the limiter: its functions, the commands
		// they run, on the limiter's keys; INFO for the eviction check,
		// ZREM and ZSCORE for the enqueue path and Reservation.
		"throttle-worker": append([]string{"reset", "on", ">worker-pw", "~throttle:*", "resetchannels", "-@all"},
			aclRules(aclConnection, fcalls, aclScriptCommands, []string{"info", "zrem", "zscore"})...),
		// The worker's user for asynq: asynq's commands on asynq's keys.
		"asynq-worker": append([]string{"reset", "on", ">asynq-pw", "~asynq:*", "resetchannels", "&asynq:*", "-@all"},
			aclRules(aclConnection, aclAsynqCommands)...),
		// A viewer (metrics scrape, a read-only dashboard, the CLI's list,
		// get and watch): Keys (the index, ZRANGE; SCAN while the index is
		// not complete) and Inspect, and no write command at all.
		"viewer": append([]string{"reset", "on", ">viewer-pw", "~throttle:*", "resetchannels", "-@all"},
			aclRules(aclConnection, []string{"fcall|" + functionName("inspect"),
				"scan", "info", "time", "exists", "hmget", "hget", "hgetall", "get", "zcard", "zcount", "zrange"})...),
		// The operator (CLI, dashboard, a deploy step): every function,
		// loading the library, DEL and SCAN, and asynq's commands for
		// Resume, which brings deferred tasks back.
		"operator": append([]string{"reset", "on", ">operator-pw", "~throttle:*", "~asynq:*", "resetchannels", "&asynq:*", "-@all"},
			aclRules(aclConnection, []string{"fcall", "function|load", "function|list", "scan", "del", "zrem", "zscore", "info"},
				aclScriptCommands, aclOperatorScriptCommands, aclAsynqCommands)...),
	}
}

// aclDenials reads ACL LOG: what was refused since the last ACL LOG RESET.
func aclDenials(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	entries, err := admin.ACLLog(context.Background(), 100).Result()
	require.NoError(t, err, "ACL LOG")
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s: %s %q (%s) x%d", e.Username, e.Reason, e.Object, e.Context, e.Count))
	}
	return out
}

// redisKnows reports whether the server has the command (or command|sub).
func redisKnows(t *testing.T, admin *redis.Client, cmd string) bool {
	t.Helper()
	v, err := admin.Do(context.Background(), "COMMAND", "INFO", cmd).Slice()
	require.NoError(t, err, "COMMAND INFO %s", cmd)
	return len(v) == 1 && v[0] != nil
}

func TestACLGrantsLetEachUserDoItsJob(t *testing.T) {
	t.Parallel()
	// (a Redis that persists, as one holding asynq's tasks must: the
	// Limiter reads INFO persistence, not the save points it may not read)
	srv := redistest.Start(t, "--appendonly", "yes")
	admin := srv.Client(t)
	ctx := context.Background()
	for user, rules := range aclUsers() {
		args := []any{"ACL", "SETUSER", user}
		for _, r := range rules {
			// CLIENT SETINFO came with Redis 7.2 (go-redis ignores its error).
			if r == "+client|setinfo" && !redisKnows(t, admin, "client|setinfo") {
				continue
			}
			args = append(args, r)
		}
		require.NoError(t, admin.Do(ctx, args...).Err(), "ACL SETUSER %s %s", user, strings.Join(rules, " "))
	}
	as := func(user, pw string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: pw, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	opRdb := as("operator", "operator-pw")
	wRdb := as("throttle-worker", "worker-pw")
	aRdb := as("asynq-worker", "asynq-pw")

	// The operator sets limits first, which loads the function library
	// (the worker may not).
	op := throttle.NewLimiter(opRdb, throttle.WithLogger(quiet), throttle.WithTaskRedis(opRdb))
	require.NoError(t, op.SetLimits(ctx, "slack", throttle.PerSecond(20).WithBurst(5), throttle.PerMinute(1000)))
	require.NoError(t, op.SetLimits(ctx, "crm", throttle.PerSecond(100), throttle.InFlight(2)))
	require.NoError(t, admin.ACLLogReset(ctx).Err())

	t.Run("worker decides", func(t *testing.T) {
		w := throttle.NewLimiter(wRdb, throttle.WithLogger(quiet))
		d, err := w.Take(ctx, "slack")
		require.NoError(t, err, "Take")
		assert.True(t, d.Allowed, "Take: %+v", d)
		// What the middleware runs besides: a decision that reserves a run
		// time for a task, Used's settlement, a slot renewed and given
		// back (the scripts as the worker's user).
		keys, err := keyspace.RedisKeys(keyspace.DefaultPrefix, "slack")
		require.NoError(t, err)
		run := lua.NewRunner(wRdb)
		var r lua.DecideReply
		for range 10 {
			r, err = lua.Decide(ctx, run, keys, lua.DecideArgs{TaskID: "task-1", Horizon: time.Minute, Granule: time.Second,
				Lapse: time.Minute, SlotExpiry: 30 * time.Second})
			require.NoError(t, err, "a decision that reserves")
		}
		assert.False(t, r.Reserved.IsZero(), "a reservation after the burst: %+v", r)
		require.NoError(t, lua.Adjust(ctx, run, keys, 1, lua.Call{Generation: -1}, nil), "a settlement (Used)")

		d, err = w.Take(ctx, "crm")
		require.NoError(t, err, "Take on an InFlight key")
		require.NotEmpty(t, d.Slot, "Take on an InFlight key: %+v", d)
		crm, err := keyspace.RedisKeys(keyspace.DefaultPrefix, "crm")
		require.NoError(t, err)
		n, err := lua.Extend(ctx, run, crm, 30*time.Second, d.Slot)
		require.NoError(t, err, "a renewal of a slot in flight")
		assert.Equal(t, int64(1), n, "a renewal of a slot in flight")
		require.NoError(t, w.Release(ctx, "crm", d.Slot), "Release")

		st, err := w.Inspect(ctx, "slack")
		require.NoError(t, err, "Inspect")
		assert.Equal(t, 1, st.Reservations, "Inspect: reservations")
		// A 429 suspends the key fleet-wide from the worker: Suspend is a
		// worker's call too.
		require.NoError(t, w.Suspend(ctx, "crm", time.Minute), "Suspend (the 429 path)")
		assert.Empty(t, aclDenials(t, admin), "ACL denials while the worker decided")
	})

	t.Run("worker runs tasks", func(t *testing.T) {
		require.NoError(t, op.SetLimits(ctx, "tasks", throttle.PerSecond(10).WithBurst(5)))
		require.NoError(t, admin.ACLLogReset(ctx).Err())
		var done, limited atomic.Int32
		cfg := asynq.Config{Concurrency: 10, LogLevel: asynq.FatalLevel, DelayedTaskCheckInterval: time.Second, ShutdownTimeout: 2 * time.Second}
		server := worker.NewServer(aRdb, cfg)
		mux := asynq.NewServeMux()
		var deferred, copied, suspended, failed atomic.Int32
		observe := func(ev throttle.Event) {
			switch {
			case ev.Outcome == throttle.Deferred && ev.Copied:
				copied.Add(1)
			case ev.Outcome == throttle.Deferred:
				deferred.Add(1)
			case ev.Outcome == throttle.Suspended:
				suspended.Add(1)
			case ev.Outcome == throttle.Failed:
				failed.Add(1)
			}
		}
		lim := throttle.NewLimiter(wRdb, throttle.WithLogger(quiet), throttle.WithTaskRedis(aRdb))
		lim.OnEvent(observe)
		mux.Use(lim.Middleware())
		mux.HandleFunc("sync:tasks", func(ctx context.Context, task *asynq.Task) error {
			if string(task.Payload()) == "3" && limited.Add(1) == 1 {
				return throttle.RateLimited(time.Second) // a 429: suspends the key fleet-wide
			}
			done.Add(1)
			return nil
		})
		require.NoError(t, server.Start(mux))
		t.Cleanup(server.Shutdown)
		client := asynq.NewClientFromRedisClient(aRdb)
		const n = 30
		for i := range n {
			// Half on their last attempt: deferred by copy (the asynq
			// client and inspector of WithTaskRedis).
			retry := asynq.MaxRetry(5)
			if i%2 == 1 {
				retry = asynq.MaxRetry(0)
			}
			_, err := client.Enqueue(newTask(t, "sync:tasks", []byte(fmt.Sprint(i)), throttle.Key("tasks"), retry))
			require.NoError(t, err, "Enqueue as the asynq user")
		}
		require.Eventually(t, func() bool { return done.Load() == n }, 60*time.Second, 50*time.Millisecond,
			"tasks done by a worker with least privileges")
		insp := asynq.NewInspectorFromRedisClient(aRdb)
		q, err := insp.GetQueueInfo("default")
		require.NoError(t, err, "GetQueueInfo")
		assert.Zero(t, q.Archived, "archived tasks")
		assert.Empty(t, aclDenials(t, admin), "ACL denials while the fleet ran")
		// Every path ran: deferred on the retry path and by copy, a 429.
		assert.Positive(t, deferred.Load(), "tasks deferred on the retry path")
		assert.Positive(t, copied.Load(), "tasks deferred by copy")
		assert.Equal(t, int32(1), suspended.Load(), "429s that suspended the key")
		assert.Zero(t, failed.Load(), "decisions that failed")
	})

	t.Run("worker cannot change limits, resume or delete", func(t *testing.T) {
		before, err := op.Inspect(ctx, "slack")
		require.NoError(t, err)
		// A fresh Limiter for each refusal: a refused FCALL switches a
		// Runner to EVALSHA for good (see the skipped subtest below).
		refused := map[string]func(*throttle.Limiter) error{
			"SetLimits": func(w *throttle.Limiter) error { return w.SetLimits(ctx, "slack", throttle.PerSecond(1000)) },
			"Resume":    func(w *throttle.Limiter) error { _, err := w.Resume(ctx, "crm"); return err },
			"Delete":    func(w *throttle.Limiter) error { return w.Delete(ctx, "slack") },
			"Keys":      func(w *throttle.Limiter) error { _, err := w.Keys(ctx); return err },
		}
		for name, call := range refused {
			err := call(throttle.NewLimiter(wRdb, throttle.WithLogger(quiet)))
			require.Error(t, err, "%s as the worker", name)
			assert.Contains(t, err.Error(), "NOPERM", "%s as the worker: %v", name, err)
		}
		after, err := op.Inspect(ctx, "slack")
		require.NoError(t, err)
		assert.Equal(t, before.Limits, after.Limits, "limits after the worker's refused calls")
		assert.Equal(t, before.Generation, after.Generation, "generation after the worker's refused calls")
		st, err := op.Inspect(ctx, "crm")
		require.NoError(t, err)
		assert.Positive(t, st.SuspendedFor, "the suspension the worker could not end")

		// Nor can it run code of its own on the limiter's keys, or load any.
		for _, cmd := range [][]any{
			{"fcall", functionName("setlimits"), 2, "throttle:{slack}:b", "throttle:{slack}:r", 604800000, "1000/1000/1000", ""},
			{"fcall", functionName("resume"), 2, "throttle:{crm}:b", "throttle:{crm}:r"},
			{"eval", "return redis.call('HSET', KEYS[1], 'L', '1000/1000/1000')", 1, "throttle:{slack}:b"},
			{"evalsha", "0000000000000000000000000000000000000000", 0},
			{"function", "load", "replace", "#!lua name=x\nredis.register_function('x', function() return 1 end)"},
			{"del", "throttle:{slack}:b"},
			{"scan", 0},
		} {
			err := wRdb.Do(ctx, cmd...).Err()
			require.Error(t, err, "%v as the worker", cmd[:2])
			assert.True(t, strings.HasPrefix(err.Error(), "NOPERM"), "%v as the worker: %v", cmd[:2], err)
		}
		// asynq's user, which has EVAL, cannot reach the limiter's keys.
		err = aRdb.Eval(ctx, "return redis.call('HSET', KEYS[1], 'L', '1000/1000/1000')", []string{"throttle:{slack}:b"}).Err()
		require.Error(t, err, "EVAL on throttle keys as asynq's user")
		assert.Contains(t, err.Error(), "NOPERM", "EVAL on throttle keys as asynq's user")
		err = aRdb.HSet(ctx, "throttle:{slack}:b", "L", "1000/1000/1000").Err()
		assert.ErrorContains(t, err, "NOPERM", "HSET on throttle keys as asynq's user")
	})

	t.Run("viewer reads, writes nothing", func(t *testing.T) {
		vRdb := as("viewer", "viewer-pw")
		v := throttle.NewLimiter(vRdb, throttle.WithLogger(quiet))
		keys, err := v.Keys(ctx)
		require.NoError(t, err, "Keys as the viewer")
		assert.Contains(t, keys, "slack", "Keys as the viewer")
		st, err := v.Inspect(ctx, "slack")
		require.NoError(t, err, "Inspect as the viewer")
		assert.NotEmpty(t, st.Limits, "Inspect as the viewer")
		refused := map[string]func(*throttle.Limiter) error{
			"Take":      func(v *throttle.Limiter) error { _, err := v.Take(ctx, "slack"); return err },
			"SetLimits": func(v *throttle.Limiter) error { return v.SetLimits(ctx, "slack", throttle.PerSecond(1000)) },
			"Suspend":   func(v *throttle.Limiter) error { return v.Suspend(ctx, "slack", time.Minute) },
			"Resume":    func(v *throttle.Limiter) error { _, err := v.Resume(ctx, "crm"); return err },
			"Delete":    func(v *throttle.Limiter) error { return v.Delete(ctx, "slack") },
		}
		for name, call := range refused {
			err := call(throttle.NewLimiter(vRdb, throttle.WithLogger(quiet)))
			assert.ErrorContains(t, err, "NOPERM", "%s as the viewer", name)
		}
		assert.ErrorContains(t, vRdb.HSet(ctx, "throttle:{slack}:b", "L", "1/1000/1").Err(), "NOPERM", "HSET as the viewer")
		after, err := op.Inspect(ctx, "slack")
		require.NoError(t, err)
		assert.Equal(t, st.Generation, after.Generation, "generation after the viewer's refused calls")
	})

	t.Run("operator can", func(t *testing.T) {
		require.NoError(t, op.Suspend(ctx, "slack", time.Minute), "Suspend")
		_, err := op.Resume(ctx, "slack")
		require.NoError(t, err, "Resume")
		_, err = op.Resume(ctx, "crm")
		require.NoError(t, err, "Resume")
		require.NoError(t, op.SetLimits(ctx, "slack", throttle.PerSecond(7)), "SetLimits")
		st, err := op.Inspect(ctx, "slack")
		require.NoError(t, err)
		assert.Equal(t, []throttle.Limit{{N: 7, Per: time.Second, Burst: 7}}, st.Limits)
		keys, err := op.Keys(ctx)
		require.NoError(t, err, "Keys")
		assert.Contains(t, keys, "slack")
		require.NoError(t, op.Delete(ctx, "crm"), "Delete")
		// Loading the library is the operator's: after FUNCTION FLUSH (or a
		// restart without persistence) its next call loads it again.
		require.NoError(t, admin.FunctionFlush(ctx).Err())
		_, err = op.Inspect(ctx, "slack")
		require.NoError(t, err, "Inspect after FUNCTION FLUSH")
		w := throttle.NewLimiter(wRdb, throttle.WithLogger(quiet))
		_, err = w.Take(ctx, "slack")
		require.NoError(t, err, "the worker decides once the operator loaded the library again")
	})

	// What ACLs cannot stop with the limits in the hash the worker writes.
	t.Run("documented limit: the worker's user can write the limits field itself", func(t *testing.T) {
		require.NoError(t, wRdb.HSet(ctx, "throttle:{slack}:b", "L", "1000000/1000/1000000").Err(),
			"HSET L as the worker: allowed, because decide writes T in the same hash")
		st, err := op.Inspect(ctx, "slack")
		require.NoError(t, err)
		assert.Equal(t, []throttle.Limit{{N: 1000000, Per: time.Second, Burst: 1000000}}, st.Limits)
	})

	// Why the limits field cannot be kept from the worker: Redis checks the
	// commands a function runs against the caller's ACL, so a user allowed
	// to call decide but not HSET cannot decide.
	t.Run("functions run with the caller's rights", func(t *testing.T) {
		rules := []any{"ACL", "SETUSER", "no-hset", "reset", "on", ">pw", "~throttle:*", "-@all", "+hello", "+auth",
			"+fcall|" + functionName("decide"), "+hmget", "+time", "+exists"}
		require.NoError(t, admin.Do(ctx, rules...).Err())
		_, err := throttle.NewLimiter(as("no-hset", "pw"), throttle.WithLogger(quiet)).Take(ctx, "slack")
		require.Error(t, err, "Take by a user without HSET")
		assert.Contains(t, err.Error(), "can't run this command", "Take by a user without HSET")
	})

	t.Run("a refused call leaves the worker deciding", func(t *testing.T) {
		w := throttle.NewLimiter(wRdb, throttle.WithLogger(quiet))
		require.Error(t, w.SetLimits(ctx, "slack", throttle.PerSecond(1)))
		_, err := w.Take(ctx, "slack")
		require.NoError(t, err, "Take after a refused SetLimits on the same Limiter")

		// The library lost (FUNCTION FLUSH, a restart without persistence):
		// the worker cannot load it, and fails until the operator has; then
		// the same Limiter decides again.
		require.NoError(t, admin.FunctionFlush(ctx).Err())
		w = throttle.NewLimiter(wRdb, throttle.WithLogger(quiet))
		_, err = w.Take(ctx, "slack")
		require.Error(t, err, "Take before the library is loaded again")
		_, err = op.Inspect(ctx, "slack")
		require.NoError(t, err, "the operator's call loads the library")
		_, err = w.Take(ctx, "slack")
		require.NoError(t, err, "Take by the same Limiter once the library is back")
	})
}
