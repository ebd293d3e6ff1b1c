package throttle

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Delete removes allRedisKeys: a field added to lua.Keys must be listed there.
func TestAllRedisKeysCoversLayout(t *testing.T) {
	k, err := redisKeys("p", "slack")
	require.NoError(t, err)
	var want []string
	v := reflect.ValueOf(k)
	for i := range v.NumField() {
		want = append(want, v.Field(i).String())
	}
	assert.ElementsMatch(t, want, allRedisKeys(k))
	assert.Equal(t, reflect.TypeOf(lua.Keys{}).NumField(), len(allRedisKeys(k)))
}

// Every Redis key redisKeys derives parses back to its name, and nothing
// else under the prefix does.
func TestNameOfRedisKey(t *testing.T) {
	for _, prefix := range []string{"throttle", "a:b", "x*?[y]\\"} {
		k, err := redisKeys(prefix, "slack api")
		require.NoError(t, err)
		for _, rk := range allRedisKeys(k) {
			name, ok := nameOfRedisKey(prefix, rk)
			assert.True(t, ok, rk)
			assert.Equal(t, "slack api", name, rk)
		}
	}
	for _, tc := range []struct{ prefix, key string }{
		{"throttle", "throttle2:{slack}:cfg"},
		{"throttle", "throttle:{slack}"},
		{"throttle", "throttle:{}:cfg"},
		{"throttle", "throttle:slack:cfg"},
		{"throttle", "asynq:{default}:pending"},
		{"a", "a:b:{slack}:cfg"},
	} {
		_, ok := nameOfRedisKey(tc.prefix, tc.key)
		assert.False(t, ok, "%q under prefix %q", tc.key, tc.prefix)
	}
}

func TestScanPattern(t *testing.T) {
	assert.Equal(t, "throttle:{*}:*", scanPattern("throttle"))
	assert.Equal(t, `x\*\?\[y\]\\:{*}:*`, scanPattern(`x*?[y]\`))
}
