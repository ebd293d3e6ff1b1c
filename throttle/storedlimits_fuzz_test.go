package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// The limits of a key live in Redis, in the L field of its hash (see
// lua/lib.lua), beside the bucket state (T), the suspension (s), the
// defaults the state was computed under (D) and the reservation schedule
// (a, V). Anyone with write access can put anything there. These tests feed
// hostile values to every one of them and hold the library to this:
//
//   - nothing panics, and no Lua error reaches the caller: an invalid L is a
//     *ConfigError naming the field (limits[1].Burst), exactly the field a
//     reference parser of the grammar names; a valid L decides (Take,
//     Reserve) whatever the other fields hold;
//   - Limits and Inspect read back exactly the limits the reference parser
//     reads, or fail with the same field;
//   - SetLimits repairs any of it, and the key then decides under the new
//     limits.

// storedFields are the hash fields a fuzz input writes, in the order of the
// fuzz arguments.
var storedFields = [...]string{"L", "T", "s", "D", "a", "V"}

// storedInput is one fuzz input: a value for each of storedFields, and a
// bit mask of those present (bit i: storedFields[i]; a field absent is not
// the same as a field holding "").
type storedInput struct {
	vals    [len(storedFields)]string
	present uint8
}

func (in storedInput) has(i int) bool { return in.present&(1<<i) != 0 }

// FuzzStoredLimits writes hostile values into a key's hash, as an operator
// or another tool could with HSET, and holds Take, Reserve, Limits,
// Inspect and SetLimits to the rules above. Each input runs on a real
// redis-server (the scripts as a function library, Redis's own Lua) and
// on miniredis (the EVAL fallback, gopher-lua), unless the input holds a
// number gopher-lua reads differently from Redis (see miniredisAgrees).
// Without redis-server on PATH (and CI unset) it runs on miniredis alone.
//
//	go test -run '^$' -fuzz '^FuzzStoredLimits$' -fuzztime 30s ./throttle/
func FuzzStoredLimits(f *testing.F) {
	// The corpus in testdata/fuzz/FuzzStoredLimits puts the values the
	// issue lists (NaN, Inf, -0, 1e309, empty, spaces, hex, parts missing or
	// extra) in every position of a valid two-tier limit, and garbage state
	// beside valid limits; these seeds are too large for it.
	const all = 1<<len(storedFields) - 1
	valid := "10/1000/10 100/60000/100 #3"
	f.Add(strings.Repeat("9", 1<<20), "", "", "", "", "", uint8(1))
	f.Add(strings.Repeat("1/1000/1 ", 1<<16), "", "", "", "", "", uint8(1))
	long := strings.Repeat("1 ", 1<<14)
	f.Add(valid, long, long, long, long, long, uint8(all))
	f.Add(valid, "1 0 0 "+strings.Repeat("1000:5 ", 1<<14), "", valid, "1", strings.Repeat("1000:1 ", 1<<14), uint8(all))
	backends := storedBackends(f)
	f.Fuzz(func(t *testing.T, L, T, s, D, a, V string, present uint8) {
		in := storedInput{vals: [len(storedFields)]string{L, T, s, D, a, V}, present: present}
		for _, b := range backends {
			if b.name == "miniredis" && !in.miniredisAgrees() {
				continue
			}
			checkStoredLimits(t, b, in)
		}
	})
}

// storedBackend is a Redis to run inputs on, and a limiter on it.
type storedBackend struct {
	name  string
	lim   *throttle.Limiter
	flush func(t testing.TB)
	hset  func(t testing.TB, key string, kv ...string)
}

func storedBackends(tb testing.TB) []storedBackend {
	mr := miniredis.RunT(tb)
	mrdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	tb.Cleanup(func() { _ = mrdb.Close() })
	bs := []storedBackend{{
		name: "miniredis",
		// gopher-lua matches patterns on long fields slowly (seconds for
		// 100 kB on a busy machine): a decision's default timeout of 1 s
		// would make it a timeout, not the answer the check is after.
		lim:   throttle.NewLimiter(mrdb, throttle.WithTimeout(time.Minute)),
		flush: func(testing.TB) { mr.FlushAll() },
		hset: func(_ testing.TB, key string, kv ...string) {
			for i := 0; i < len(kv); i += 2 {
				mr.HSet(key, kv[i], kv[i+1])
			}
		},
	}}
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("CI") == "true" {
		bs = append(bs, realBackend(tb))
	}
	return bs
}

func realBackend(tb testing.TB) storedBackend {
	rdb := redistest.Start(tb).Client(tb)
	ctx := context.Background()
	return storedBackend{
		name:  "redis-server",
		lim:   throttle.NewLimiter(rdb),
		flush: func(t testing.TB) { require.NoError(t, rdb.FlushAll(ctx).Err(), "FLUSHALL") },
		hset: func(t testing.TB, key string, kv ...string) {
			args := make([]any, len(kv))
			for i, v := range kv {
				args[i] = v
			}
			require.NoError(t, rdb.HSet(ctx, key, args...).Err(), "HSET %s", key)
		},
	}
}

// checkStoredLimits writes in into the hash of key "k" on b and checks
// every call that reads it.
func checkStoredLimits(t *testing.T, b storedBackend, in storedInput) {
	t.Helper()
	ctx := context.Background()
	b.flush(t)
	var kv []string
	for i, f := range storedFields {
		if in.has(i) {
			kv = append(kv, f, in.vals[i])
		}
	}
	if len(kv) > 0 {
		b.hset(t, bucket("k"), kv...)
	}
	want := parseStoredLimits(in.vals[0])
	if !in.has(0) {
		want = storedParse{noLimits: true}
	}
	where := fmt.Sprintf("on %s with %s", b.name, in)

	d, err := b.lim.Take(ctx, "k")
	checkStoredDecision(t, want, d, err, "Take "+where)
	d, err = throttle.Reserve(b.lim, ctx, "k", "task-1", time.Minute, time.Second)
	checkStoredDecision(t, want, d, err, "Reserve "+where)

	got, err := throttle.Limits(b.lim, ctx, "k")
	switch {
	case want.noLimits:
		requireErrorIs(t, err, throttle.ErrNoLimits, "Limits "+where)
	case want.field != "":
		requireConfigError(t, err, want.field, "Limits "+where)
	default:
		require.NoError(t, err, "Limits %s", where)
		require.Equal(t, want.limits, got, "Limits %s", where)
	}
	st, err := b.lim.Inspect(ctx, "k")
	switch {
	case want.noLimits:
		require.NoError(t, err, "Inspect %s", where)
		require.Nil(t, st.Limits, "Inspect %s: Limits", where)
	case want.field != "":
		requireConfigError(t, err, want.field, "Inspect "+where)
	default:
		require.NoError(t, err, "Inspect %s", where)
		require.Equal(t, want.limits, st.Limits, "Inspect %s: Limits", where)
		require.Equal(t, want.gen, st.Generation, "Inspect %s: Generation", where)
		require.GreaterOrEqual(t, st.SuspendedFor, time.Duration(0), "Inspect %s: Suspended", where)
		require.LessOrEqual(t, st.SuspendedFor, maxWait, "Inspect %s: Suspended", where)
	}

	// Whatever was there, SetLimits repairs it, and the key decides.
	fixed := []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(100)}
	require.NoError(t, b.lim.SetLimits(ctx, "k", fixed...), "SetLimits %s", where)
	got, err = throttle.Limits(b.lim, ctx, "k")
	require.NoError(t, err, "Limits after SetLimits %s", where)
	require.Equal(t, []throttle.Limit{{N: 5, Per: time.Second, Burst: 5}, {N: 100, Per: time.Minute, Burst: 100}}, got,
		"Limits after SetLimits %s", where)
	d, err = b.lim.Take(ctx, "k")
	checkStoredDecision(t, storedParse{limits: got}, d, err, "Take after SetLimits "+where)
}

// maxWait is the longest wait a script ever reports (MAX_WAIT in lib.lua).
const maxWait = 1e13 * time.Microsecond

func checkStoredDecision(t *testing.T, want storedParse, d throttle.Decision, err error, call string) {
	t.Helper()
	switch {
	case want.noLimits:
		// Without limits a key refuses only while suspended.
		if err == nil {
			require.False(t, d.Allowed, "%s: a key without limits was allowed: %+v", call, d)
			require.Equal(t, throttle.RefusedBySuspension, d.Reason, "%s: %+v", call, d)
			require.Positive(t, d.RetryAfter, "%s: %+v", call, d)
			return
		}
		requireErrorIs(t, err, throttle.ErrNoLimits, call)
	case want.field != "":
		requireConfigError(t, err, want.field, call)
	default:
		require.NoError(t, err, "%s: valid limits %v must decide", call, want.limits)
		if d.Allowed {
			require.Zero(t, d.RetryAfter, "%s: allowed with a RetryAfter: %+v", call, d)
			require.Equal(t, throttle.Reason(0), d.Reason, "%s: %+v", call, d)
			require.GreaterOrEqual(t, d.Remaining, 0, "%s: %+v", call, d)
		} else {
			require.Positive(t, d.RetryAfter, "%s: refused without a RetryAfter: %+v", call, d)
			require.NotEqual(t, throttle.Reason(0), d.Reason, "%s: %+v", call, d)
		}
		require.LessOrEqual(t, d.RetryAfter, maxWait, "%s: %+v", call, d)
	}
}

func requireErrorIs(t *testing.T, err, target error, call string) {
	t.Helper()
	require.ErrorIs(t, err, target, "%s", call)
}

func requireConfigError(t *testing.T, err error, field, call string) {
	t.Helper()
	var ce *throttle.ConfigError
	require.ErrorAs(t, err, &ce, "%s: want a *ConfigError naming %s, got %v", call, field, err)
	require.ErrorIs(t, err, throttle.ErrInvalidLimit, "%s", call)
	require.Equal(t, "k", ce.Key, "%s: ConfigError.Key", call)
	require.Equal(t, field, ce.Field, "%s: ConfigError.Field (reason %q)", call, ce.Reason)
	require.NotEmpty(t, ce.Reason, "%s: ConfigError.Reason", call)
	require.Less(t, len(ce.Error()), 400, "%s: the error quotes a bounded part of the value: %s", call, ce.Error())
}

// String shows an input in failure messages, long values cut.
func (in storedInput) String() string {
	var b strings.Builder
	for i, f := range storedFields {
		if !in.has(i) {
			continue
		}
		v := in.vals[i]
		if len(v) > 80 {
			v = v[:80] + fmt.Sprintf("...(%d bytes)", len(v))
		}
		fmt.Fprintf(&b, " %s=%q", f, v)
	}
	if b.Len() == 0 {
		return "an empty hash"
	}
	return "fields" + b.String()
}

// miniredisAgrees reports whether miniredis runs the input as Redis does.
// It does not when gopher-lua's tonumber reads a number differently from
// Lua 5.1's: a run of 19 digits or more (gopher-lua: nil beyond int64,
// where Lua 5.1 reads a float; the script then compares nil), or an
// exponent ("1e5": nil, where Lua 5.1 reads 100000). Nor when a stored
// suspension lies so far ahead that SetLimits gives the key a TTL of more
// than 292 years: miniredis overflows time.Duration and expires the key at
// once, where Redis keeps it. Those inputs run on real Redis only.
func (in storedInput) miniredisAgrees() bool {
	for _, v := range in.vals {
		run := 0
		for i := 0; i < len(v); i++ {
			if v[i] >= '0' && v[i] <= '9' {
				run++
				if run >= 19 {
					return false
				}
				continue
			}
			if (v[i] == 'e' || v[i] == 'E') && run > 0 {
				return false
			}
			run = 0
		}
	}
	if in.has(2) {
		s := strings.TrimSpace(in.vals[2])
		if n, err := strconv.ParseInt(s, 0, 64); err == nil && n > 5e15 {
			return false
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && f > 5e15 {
			return false
		}
	}
	return true
}

// storedParse is what the reference parser makes of an L field: the
// limits as Limits returns them, or the field a *ConfigError must name.
type storedParse struct {
	noLimits bool
	limits   []throttle.Limit
	gen      int64
	field    string
}

// parseStoredLimits is a reference parser of the L field, written from the
// grammar in lua/lib.lua (parse_limits), independently of it: items
// separated by Lua whitespace; "rate/per_ms/burst" a bucket, "wN/per_ms" a
// window, "xN/per_ms" a fixed window, each maybe ending in "~unit";
// "fN" in flight, "#G" the generation; at most 8 tiers (buckets and
// windows), one in-flight limit, no two tiers of one kind, period and unit
// (nor two buckets of one period whose units hash alike); whole numbers in
// range. The first item in error names the field.
func parseStoredLimits(s string) storedParse {
	const (
		maxTiers   = 8
		maxPerMS   = 30 * 24 * 3600 * 1000
		maxRateSec = 1e6
		maxBurst   = 1e9
		maxRate    = 1e15
		maxLen     = 640
	)
	bad := func(field string) storedParse { return storedParse{field: field} }
	if len(s) > maxLen {
		return bad("limits")
	}
	digits := func(s string) (float64, bool) {
		if s == "" || strings.Trim(s, "0123456789") != "" {
			return 0, false
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, false
		}
		return v, true
	}
	var (
		out      storedParse
		n        int
		inflight float64
		adaptive float64
		periods  = map[string]bool{}
	)
	tokens := strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r'
	})
	for _, tok := range tokens {
		switch tok[0] {
		case '#':
			g, ok := digits(tok[1:])
			if !ok || g > 1e15 {
				g = 0
			}
			out.gen = int64(g)
			continue
		case 'f':
			q, ok := digits(tok[1:])
			if !ok { // not fN: read as a tier
				break
			}
			switch {
			case inflight > 0:
				return bad("limits")
			case q < 1 || q > 1e6:
				return bad("limits.InFlight")
			}
			inflight = q
			continue
		case 'a':
			e, ok := digits(tok[1:])
			if !ok { // not aN: read as a tier
				break
			}
			switch {
			case adaptive > 0:
				return bad("limits")
			case e < 1000 || e > maxPerMS:
				return bad("limits.Adaptive")
			}
			adaptive = e
			continue
		}
		unit := ""
		if i := strings.IndexByte(tok, '~'); i >= 0 && tok[0] != 'a' && tok[0] != 'f' {
			unit, tok = tok[i+1:], tok[:i]
			if !refUnitOK(unit) {
				return bad(fmt.Sprintf("limits[%d].Unit", n))
			}
		}
		n++
		f := fmt.Sprintf("limits[%d]", n-1)
		if n > maxTiers {
			return bad("limits")
		}
		var l throttle.Limit
		var key string
		if tok[0] == 'w' || tok[0] == 'x' {
			q, p, ok := cut2(tok[1:], digits)
			switch {
			case !ok:
				return bad(f)
			case q < 1 || q > maxBurst:
				return bad(f + ".N")
			case p < 1 || p > maxPerMS:
				return bad(f + ".Per")
			case q/p*1000 > maxRateSec:
				return bad(f + ".N")
			}
			l = throttle.Limit{Kind: throttle.KindWindow, N: int(q), Per: time.Duration(p) * time.Millisecond}
			if tok[0] == 'x' {
				l.Kind = throttle.KindFixedWindow
			}
			key = tok[:1] + strconv.FormatFloat(p, 'f', 0, 64)
		} else {
			parts := strings.Split(tok, "/")
			if len(parts) != 3 {
				return bad(f)
			}
			r, ok1 := digits(parts[0])
			p, ok2 := digits(parts[1])
			b, ok3 := digits(parts[2])
			switch {
			case !ok1 || !ok2 || !ok3:
				return bad(f)
			case r < 1 || r > maxRate:
				return bad(f + ".N")
			case p < 1 || p > maxPerMS:
				return bad(f + ".Per")
			case r/p*1000 > maxRateSec:
				return bad(f + ".N")
			case b < 1 || b > maxBurst:
				return bad(f + ".Burst")
			}
			l = throttle.Limit{N: int(r), Per: time.Duration(p) * time.Millisecond, Burst: int(b)}
			key = strconv.FormatFloat(p, 'f', 0, 64)
		}
		l.Unit = unit
		if unit != "" {
			key += "~" + unit
		}
		if periods[key] {
			return bad(f + ".Per")
		}
		periods[key] = true
		if l.Kind == throttle.KindBucket {
			id := fmt.Sprintf("b%d/%d", l.Per.Milliseconds(), refUnitHash(unit))
			if periods[id] {
				return bad(f + ".Unit")
			}
			periods[id] = true
		}
		out.limits = append(out.limits, l)
	}
	if n == 0 && inflight == 0 {
		return bad("limits")
	}
	if adaptive > 0 && n == 0 {
		return bad("limits.Adaptive")
	}
	if inflight > 0 {
		out.limits = append(out.limits, throttle.InFlight(int(inflight)))
	}
	if adaptive > 0 {
		out.limits = append(out.limits, throttle.Adaptive(time.Duration(adaptive)*time.Millisecond))
	}
	return out
}

// refUnitOK is lib.lua's rule for a unit: a lowercase letter, then a-z, 0-9,
// '_' or '-', at most 32 bytes, not "requests" (the default, never written).
func refUnitOK(u string) bool {
	if u == "" || len(u) > 32 || u == "requests" || u[0] < 'a' || u[0] > 'z' {
		return false
	}
	return strings.Trim(u, "abcdefghijklmnopqrstuvwxyz0123456789_-") == ""
}

// refUnitHash is lib.lua's unit_id without its scale: what tells two
// buckets of one period apart.
func refUnitHash(u string) int {
	if u == "" {
		return 0
	}
	h := 0
	for i := 0; i < len(u); i++ {
		h = (h*31 + int(u[i])) % 1048573
	}
	return h + 1
}

// cut2 reads "a/b" as two numbers with read.
func cut2(s string, read func(string) (float64, bool)) (float64, float64, bool) {
	a, b, ok := strings.Cut(s, "/")
	x, ok1 := read(a)
	y, ok2 := read(b)
	return x, y, ok && ok1 && ok2
}
