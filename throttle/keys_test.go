package throttle_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestEveryCallRefusesAnInvalidKey(t *testing.T) {
	r := newRig(t, throttle.WithDefaultLimits(throttle.PerSecond(1)))
	for _, key := range []string{"", strings.Repeat("a", throttle.MaxKeyLen+1), "a{b", "a}b", "\x00", "tab\t", "\xff\xfe", "new\nline"} {
		t.Run(fmt.Sprintf("%q", key), func(t *testing.T) {
			calls := map[string]error{
				"ValidateKey": throttle.ValidateKey(key),
				"SetLimits":   r.lim.SetLimits(r.ctx, key, throttle.PerSecond(1)),
				"Suspend":     r.lim.Suspend(r.ctx, key, time.Second),
			}
			_, calls["Resume"] = r.lim.Resume(r.ctx, key)
			_, calls["Take"] = r.lim.Take(r.ctx, key)
			_, calls["Reserve"] = throttle.Reserve(r.lim, r.ctx, key, "id", time.Minute, time.Second)
			_, calls["Limits"] = throttle.Limits(r.lim, r.ctx, key)
			_, calls["Inspect"] = r.lim.Inspect(r.ctx, key)
			for call, err := range calls {
				assert.ErrorIs(t, err, throttle.ErrInvalidKey, "%s(%q)", call, key)
			}
		})
	}
	assert.Empty(t, r.mr.Keys(), "Redis keys written for invalid limiter keys")
}

func TestRedisKeysCarryThePrefixAndTheHashTag(t *testing.T) {
	tests := []struct {
		name   string
		opts   []throttle.Option
		prefix string
	}{
		{"default prefix", nil, throttle.DefaultPrefix},
		{"WithPrefix", []throttle.Option{throttle.WithPrefix("myapp")}, "myapp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts...)
			r.setLimits("slack", throttle.PerSecond(1))
			r.take("slack")
			r.reserve("slack", "task-1", time.Minute, time.Second)
			r.suspend("slack", time.Second)
			// Its own keys, and the index of the limiter's keys.
			want := []string{tt.prefix + ":keys"}
			for _, p := range []string{"b", "c", "r"} {
				want = append(want, tt.prefix+":{slack}:"+p)
			}
			assert.Equal(t, want, r.mr.Keys(), "Redis keys of limiter key slack")
		})
	}
}
