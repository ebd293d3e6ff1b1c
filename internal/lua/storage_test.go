package lua

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The storage spec at the top of lib.lua lists every field of a key's hash:
// a field a script reads or writes that the spec does not name fails here.
func TestStorageSpecNamesEveryField(t *testing.T) {
	lib, err := os.ReadFile("lib.lua")
	require.NoError(t, err)
	spec := string(lib)
	spec = spec[strings.Index(spec, "-- Storage"):strings.Index(spec, "-- A tier is identified")]
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^--     ([A-Za-z]+)(?:, ([A-Za-z]+))?(?:<per_ms>)? `).FindAllStringSubmatch(spec, -1) {
		named[m[1]] = true
		if m[2] != "" {
			named[m[2]] = true
		}
	}
	require.NotEmpty(t, named, "the spec's field list")

	scripts, err := filepath.Glob("*.lua")
	require.NoError(t, err)
	// Lines that name hash fields: the hash commands, and the field lists
	// the scripts build for them.
	uses := regexp.MustCompile(`'(HMGET|HGET|HSET|HDEL)'|fields\[#fields \+ 1\] = '|local drop = \{`)
	field := regexp.MustCompile(`'([A-Za-z]{1,2})'`)
	found := map[string][]string{}
	for _, name := range scripts {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			if !uses.MatchString(line) {
				continue
			}
			for _, m := range field.FindAllStringSubmatch(line, -1) {
				if m[1] == "W" && strings.Contains(line, "'W' ..") {
					m[1] = "Ww" // 'W' .. t.key: a window's field
				}
				found[m[1]] = append(found[m[1]], name+":"+strconv.Itoa(i+1))
			}
		}
	}
	for _, f := range []string{"L", "T", "s", "O", "D", "V", "R", "FL", "Ww"} {
		assert.Contains(t, found, f, "the scripts use field %s: the search above misses it", f)
	}
	for f, where := range found {
		assert.True(t, named[f], "field %q (%s) is not in lib.lua's storage spec", f, strings.Join(where, ", "))
	}
}

// A key whose limits come from the caller's defaults (none in Redis) lives
// until its buckets are full again: with thousands of tenant keys on
// default limits, idle ones leave nothing behind. A key with limits in
// Redis keeps them, in its configuration, until Delete; its hash lives
// with its state.
func TestAKeyOnDefaultLimitsExpiresOnceItsBucketsAreFull(t *testing.T) {
	e := newEnv(t)
	defaults := []Tier{{Rate: 1, PerMS: 1000, Burst: 10}}
	for range 5 {
		require.Equal(t, StatusAllowed, e.decide(DecideArgs{Defaults: defaults}).Status)
	}
	ttl := e.mr.TTL(e.k.Bucket)
	assert.GreaterOrEqual(t, ttl, 5*time.Second, "5 tokens owed at 1/s: full in 5 s")
	assert.LessOrEqual(t, ttl, 10*time.Second, "a key on default limits outlived twice its refill")

	e.setLimits(Tier{Rate: 1, PerMS: 1000, Burst: 10})
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{}).Status)
	assert.LessOrEqual(t, e.mr.TTL(e.k.Bucket), 20*time.Second, "a key with limits in Redis: its hash lives with its state")
	assert.Zero(t, e.mr.TTL(e.k.Config), "its configuration has no expiry")
	e.mr.FastForward(time.Hour)
	e.at(time.Hour)
	assert.Equal(t, []string{e.k.Config}, e.mr.Keys(), "idle: only the configuration")
	r := e.decide(DecideArgs{})
	require.Equal(t, StatusAllowed, r.Status)
	assert.Equal(t, int64(9), r.Remaining, "decided under the limits kept: 10 - 1")
}

// decodeT reads the T field: its doubles (ts, x, q, then per and owed of
// each bucket that owes).
func decodeT(t *testing.T, T string) []float64 {
	t.Helper()
	require.Zero(t, len(T)%8, "T is whole doubles: %q", T)
	var out []float64
	for i := 0; i < len(T); i += 8 {
		out = append(out, math.Float64frombits(binary.LittleEndian.Uint64([]byte(T[i:i+8]))))
	}
	return out
}

// encodeT writes a T field of the given doubles.
func encodeT(vals ...float64) string {
	b := make([]byte, 0, 8*len(vals))
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// Whatever bytes are found in T, a decision is made without a script
// error, a refusal asks for a positive wait, and the admin scripts work; a
// field of the wrong shape reads as a fresh bucket.
func TestGarbageInTheBinaryStateDecidesLikeAFreshBucket(t *testing.T) {
	tier := Tier{Rate: 10, PerMS: 1000, Burst: 10}
	now := float64(testEpoch().UnixMicro())
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name  string
		value string
		fresh bool // a take leaves 9 of 10 tokens: the bucket read as full
	}{
		{"text", "1700000000000000 0 0 1000:5000000", true},
		{"one byte short", encodeT(now, 0, 0, 1000, 5e6)[:39], true},
		{"ts NaN", encodeT(nan, 0, 0, 1000, 5e6), true},
		{"ts negative", encodeT(-1, 0, 0, 1000, 5e6), true},
		{"ts a fraction", encodeT(now+0.5, 0, 0, 1000, 5e6), true},
		{"ts beyond 2^53", encodeT(1e300, 0, 0, 1000, 5e6), true},
		{"owed NaN", encodeT(now, 0, 0, 1000, nan), true},
		{"owed infinite", encodeT(now, 0, 0, 1000, inf), true},
		{"owed negative", encodeT(now, 0, 0, 1000, -5e6), true},
		{"owed huge", encodeT(now, 0, 0, 1000, 1e300), false},
		{"x and q garbage", encodeT(now, nan, inf, 1000, 5e6), false},
		{"q far future", encodeT(now, 0, 1e300, 1000, 5e6), false},
		{"another period only", encodeT(now, 0, 0, 60000, 5e6), true},
		{"per NaN", encodeT(now, 0, 0, nan, 5e6), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(tier)
			e.mr.HSet(e.k.Bucket, "T", tt.value)
			r, err := Decide(e.ctx, e.run, e.k, DecideArgs{})
			require.NoError(t, err, "Decide with T %s", tt.name)
			require.Contains(t, []int{StatusAllowed, StatusDenied}, r.Status, "%+v", r)
			if r.Status == StatusDenied {
				assert.Positive(t, r.RetryAfter, "RetryAfter of a refusal (%+v)", r)
			}
			if tt.fresh {
				assert.Equal(t, int64(9), r.Remaining, "T %s: the bucket reads as full", tt.name)
			}
			r, err = Decide(e.ctx, e.run, e.k, DecideArgs{TaskID: "a", Horizon: time.Minute, Lapse: time.Minute})
			require.NoError(t, err, "a reserving Decide with T %s", tt.name)
			_, err = Inspect(e.ctx, e.run, e.k, nil, 0)
			assert.NoError(t, err, "Inspect with T %s", tt.name)
			_, err = Suspend(e.ctx, e.run, e.k, time.Second, time.Hour)
			assert.NoError(t, err, "Suspend with T %s", tt.name)
			_, err = Resume(e.ctx, e.run, e.k, nil)
			assert.NoError(t, err, "Resume with T %s", tt.name)
			sr, err := SetLimits(e.ctx, e.run, e.k, []Tier{tier}, nil)
			assert.NoError(t, err, "SetLimits with T %s", tt.name)
			assert.Empty(t, sr.Field)
		})
	}
}

// T is written by struct.pack on Redis and by lib.lua's own codec where
// struct is missing (miniredis): on a real Redis both write the same bytes
// for every value a field holds, and each reads what the other wrote.
func TestTheTwoCodecsOfTWriteTheSameBytes(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	values := []string{"0", "1", "2", "1000", "3600000", "1700000000000000", "1796144054226011",
		"9007199254740991", "9007199254740992", "1e300", "2.5e21", "0.1", "123456.789",
		"4.9406564584124654e-324", "2.2250738585072014e-308", "1.7976931348623157e308", "inf", "-0", "-7.25"}
	script := helpers + `
local out = {}
for i, s in ipairs(ARGV) do
  local v = tonumber(s)
  if s == 'inf' then v = math.huge elseif s == '-0' then v = -0.0 end
  local c, l = struct.pack('<d', v), double_bytes(v)
  local back1 = struct.unpack('<d', l)
  local back2 = bytes_double(c, 1)
  out[i] = (c == l and 'same' or 'differ') .. ' ' .. ((back1 == v and back2 == v) and 'read' or 'unread')
end
return out`
	args := make([]any, len(values))
	for i, v := range values {
		args[i] = v
	}
	got, err := rdb.Eval(context.Background(), script, nil, args...).StringSlice()
	require.NoError(t, err)
	for i, v := range values {
		assert.Equal(t, "same read", got[i], "the codecs on %s", v)
	}
}

// No path may shorten a lifetime another path set (issue 34): every expiry
// a script sets goes through lib.lua's extend_to, or keep_alive and its
// set_ttl for the key's hash, which only ever raise a TTL. A PEXPIRE
// anywhere else is a path that could shorten one.
func TestEveryExpiryGoesThroughExtendTo(t *testing.T) {
	scripts, err := filepath.Glob("*.lua")
	require.NoError(t, err)
	expire := regexp.MustCompile(`(?i)'(p?expire(at)?|persist)'`)
	for _, name := range scripts {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		fn := ""
		for i, line := range strings.Split(string(src), "\n") {
			if m := regexp.MustCompile(`^(?:  )?(?:local )?function (\w+)`).FindStringSubmatch(line); m != nil {
				fn = m[1]
			}
			if expire.MatchString(line) {
				ok := name == "lib.lua" && (fn == "extend_to" || fn == "set_ttl")
				assert.True(t, ok, "%s:%d (in %s) sets an expiry outside extend_to and set_ttl: %s", name, i+1, fn, strings.TrimSpace(line))
			}
		}
	}
}

// Every caller of keep_alive applies the TTL it asks for: the memo it
// returns (T's x) says the key lives that long, and the decisions after
// trust it to spare a PEXPIRE. observe.lua wrote the memo and extended the
// key to the need alone, and a key's state expired while its bucket owed
// (TestObserveKeyLivesUntilItsExpiryMemo). Fails on that code with
// "observe.lua:305 asks keep_alive for a TTL (ttl) and never uses it".
func TestEveryKeepAliveTTLIsApplied(t *testing.T) {
	scripts, err := filepath.Glob("*.lua")
	require.NoError(t, err)
	call := regexp.MustCompile(`^\s*(?:local\s+)?\w+(?:\.\w+)?,\s*(\w+)\s*=\s*keep_alive\(`)
	calls := 0
	for _, name := range scripts {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		lines := strings.Split(string(src), "\n")
		for i, line := range lines {
			m := call.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			calls++
			used := regexp.MustCompile(`\b` + m[1] + `\b`)
			ok := false
			for _, after := range lines[i+1:] {
				code, _, _ := strings.Cut(after, "--")
				if used.MatchString(code) {
					ok = true
					break
				}
			}
			assert.True(t, ok, "%s:%d asks keep_alive for a TTL (%s) and never uses it", name, i+1, m[1])
		}
	}
	assert.GreaterOrEqual(t, calls, 4, "keep_alive's callers found: the test proves little")
}
