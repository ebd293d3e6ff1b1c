package deferral

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestParse(t *testing.T) {
	for _, e := range []*Error{
		{Key: "slack", Reason: "suspended", Delay: time.Minute},
		{Key: `odd "key": x`, Reason: "before slot", Delay: 1500 * time.Millisecond},
	} {
		key, reason, ok := Parse(e.Error())
		assert.True(t, ok, "Parse(%q)", e.Error())
		assert.Equal(t, e.Key, key, "Parse(%q): key", e.Error())
		assert.Equal(t, e.Reason, reason, "Parse(%q): reason", e.Error())
	}
	for _, msg := range []string{"", "boom", `throttle: task deferred 1s: key slack suspended`, `throttle: task deferred 1s: key "unterminated`} {
		_, _, ok := Parse(msg)
		assert.False(t, ok, "Parse(%q)", msg)
	}
}
