package keyspace

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// All lists every Redis key: a field added to lua.Keys must be listed there.
func TestAllCoversTheLayout(t *testing.T) {
	k, err := RedisKeys("p", "slack")
	require.NoError(t, err)
	var want []string
	v := reflect.ValueOf(k)
	for i := range v.NumField() {
		want = append(want, v.Field(i).String())
	}
	assert.ElementsMatch(t, want, All(k))
	assert.Equal(t, reflect.TypeOf(lua.Keys{}).NumField(), len(All(k)))
}

// Every Redis key RedisKeys derives parses back to its name, and nothing
// else under the prefix does.
func TestNameOfParsesRedisKeysBack(t *testing.T) {
	for _, prefix := range []string{"throttle", "a:b", "x*?[y]\\"} {
		for _, want := range []string{"slack api", "{slack}:T0123", "{slack}app"} {
			k, err := RedisKeys(prefix, want)
			require.NoError(t, err)
			for _, rk := range All(k) {
				name, ok := NameOf(prefix, rk)
				assert.True(t, ok, rk)
				assert.Equal(t, want, name, rk)
			}
		}
	}
	for _, tc := range []struct{ prefix, key string }{
		{"throttle", "throttle2:{slack}:cfg"},
		{"throttle", "throttle:{slack}"},
		{"throttle", "throttle:{}:cfg"},
		{"throttle", "throttle:slack:cfg"},
		{"throttle", "asynq:{default}:pending"},
		{"a", "a:b:{slack}:cfg"},
		{"throttle", "throttle:{{slack}}:b"},
		{"throttle", "throttle:{{slack}:x}y}:b"},
	} {
		_, ok := NameOf(tc.prefix, tc.key)
		assert.False(t, ok, "%q under prefix %q", tc.key, tc.prefix)
	}
}

func TestScanPatternEscapesGlobCharacters(t *testing.T) {
	assert.Equal(t, "throttle:{*}:*", ScanPattern("throttle"))
	assert.Equal(t, `x\*\?\[y\]\\:{*}:*`, ScanPattern(`x*?[y]\`))
}

// A task's key is its Key header, else the key function's, else its type's
// prefix; an invalid header or function key is an error, an invalid prefix
// runs the task unthrottled.
func TestKeyOfTaskPicksHeaderThenFunctionThenPrefix(t *testing.T) {
	byPayload := func(t *asynq.Task) string { return "tenant-" + string(t.Payload()) }
	for _, tc := range []struct {
		name           string
		task           *asynq.Task
		fn             func(*asynq.Task) string
		want           string
		err, badPrefix bool
	}{
		{"header", asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{Key: "crm"}), byPayload, "crm", false, false},
		{"type prefix", asynq.NewTask("slack:sync", nil), nil, "slack", false, false},
		{"nested type prefix", asynq.NewTask("crm:hubspot:contacts", nil), nil, "crm", false, false},
		{"no prefix", asynq.NewTask("cleanup", nil), nil, "", false, false},
		{"key function", asynq.NewTask("slack:sync", []byte("7")), byPayload, "tenant-7", false, false},
		{"key function says unthrottled", asynq.NewTask("slack:sync", nil), func(*asynq.Task) string { return "" }, "", false, false},
		{"bad header", asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{Key: "a{b}"}), nil, "a{b}", true, false},
		{"bad key function", asynq.NewTask("slack:sync", nil), func(*asynq.Task) string { return "a{b}" }, "a{b}", true, false},
		{"bad prefix", asynq.NewTask("a{b}:sync", nil), nil, "", false, true},
	} {
		got, badPrefix, err := KeyOfTask(tc.task, tc.fn)
		assert.Equal(t, tc.want, got, tc.name)
		assert.Equal(t, tc.badPrefix, badPrefix, tc.name)
		if tc.err {
			assert.ErrorIs(t, err, ErrInvalidKey, tc.name)
		} else {
			assert.NoError(t, err, tc.name)
		}
	}
}

// A family tag puts every key of the family in one Redis Cluster slot: the
// hash tag Redis reads of each Redis key is "{family", whatever follows.
func TestFamilyKeysShareTheirHashTag(t *testing.T) {
	assert.Equal(t, "slack", Family("{slack}:T0123"))
	assert.Equal(t, "", Family("slack:T0123"))
	tagOf := func(k string) string { // Redis's rule: first '{' to the first '}' after it
		i := strings.IndexByte(k, '{')
		j := strings.IndexByte(k[i+1:], '}')
		return k[i+1 : i+1+j]
	}
	for _, name := range []string{"{slack}:T0123:chat.postMessage", "{slack}:T0123", "{slack}:app"} {
		k, err := RedisKeys("throttle", name)
		require.NoError(t, err)
		for _, rk := range All(k) {
			assert.Equal(t, "{slack", tagOf(rk), rk)
		}
	}
	k, err := RedisKeys("throttle", "slack")
	require.NoError(t, err)
	assert.Equal(t, "slack", tagOf(k.Bucket), "a name without a family keeps its own tag (and its state where it was)")
}

func TestSetKeysAndKeysOfTaskRoundTrip(t *testing.T) {
	h := map[string]string{}
	require.NoError(t, SetKeys(h, []string{"a:b:c", "a:b", "a"}))
	assert.Equal(t, map[string]string{Key: "a:b:c", "throttle-key-2": "a:b", "throttle-key-3": "a"}, h)
	task := asynq.NewTaskWithHeaders("x", nil, h)
	more, err := KeysOfTask(task, "a:b:c")
	require.NoError(t, err)
	assert.Equal(t, []string{"a:b", "a"}, more)

	one := asynq.NewTaskWithHeaders("x", nil, map[string]string{Key: "a"})
	more, err = KeysOfTask(one, "a")
	require.NoError(t, err)
	assert.Nil(t, more, "one key: none more")
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = KeysOfTask(one, "a") }), "a task of one key allocates nothing")

	for name, hs := range map[string]map[string]string{
		"no first key": {"throttle-key-2": "b"},
		"duplicate":    {Key: "a", "throttle-key-2": "b", "throttle-key-3": "b"},
		"five":         {Key: "a", "throttle-key-2": "b", "throttle-key-3": "c", "throttle-key-4": "d", "throttle-key-5": "e"},
	} {
		_, err := KeysOfTask(asynq.NewTaskWithHeaders("x", nil, hs), hs[Key])
		assert.ErrorIs(t, err, ErrInvalidKey, "%s", name)
	}
}
