package lua

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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
	for _, f := range []string{"L", "T", "s", "O", "D", "a", "V", "R", "FL", "Ww"} {
		assert.Contains(t, found, f, "the scripts use field %s: the search above misses it", f)
	}
	for f, where := range found {
		assert.True(t, named[f], "field %q (%s) is not in lib.lua's storage spec", f, strings.Join(where, ", "))
	}
}

// A key whose limits come from the caller's defaults (none in Redis) lives
// until its buckets are full again, not the idle expiry: with thousands of
// tenant keys on default limits, idle ones leave nothing behind. A key with
// limits in Redis keeps them for the idle expiry.
func TestAKeyOnDefaultLimitsExpiresOnceItsBucketsAreFull(t *testing.T) {
	e := newEnv(t)
	defaults := []Tier{{Rate: 1, PerMS: 1000, Burst: 10}}
	for range 5 {
		require.Equal(t, StatusAllowed, e.decide(DecideArgs{Defaults: defaults, IdleExpiry: time.Hour}).Status)
	}
	ttl := e.mr.TTL(e.k.Bucket)
	assert.GreaterOrEqual(t, ttl, 5*time.Second, "5 tokens owed at 1/s: full in 5 s")
	assert.LessOrEqual(t, ttl, 10*time.Second, "a key on default limits outlived twice its refill")

	e.setLimits(Tier{Rate: 1, PerMS: 1000, Burst: 10})
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{IdleExpiry: time.Hour}).Status)
	assert.Equal(t, time.Hour, e.mr.TTL(e.k.Bucket), "a key with limits in Redis: the idle expiry")
}
