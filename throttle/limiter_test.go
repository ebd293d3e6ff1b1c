package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestEveryCallSurvivesScriptFlush(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(2))
	assertAllowed(t, r.take("k"), "Take before SCRIPT FLUSH")
	steps := []struct {
		name string
		call func() error
	}{
		{"Take", func() error { _, err := r.lim.Take(r.ctx, "k"); return err }},
		{"Reserve", func() error { _, err := throttle.Reserve(r.lim, r.ctx, "k", "a", time.Minute, 0); return err }},
		{"SetLimits", func() error { return r.lim.SetLimits(r.ctx, "k", throttle.PerSecond(3)) }},
		{"Suspend", func() error { return r.lim.Suspend(r.ctx, "k", time.Second) }},
		{"Inspect", func() error { _, err := r.lim.Inspect(r.ctx, "k"); return err }},
	}
	for _, s := range steps {
		require.NoError(t, r.rdb.ScriptFlush(r.ctx).Err(), "SCRIPT FLUSH")
		assert.NoError(t, s.call(), "%s after SCRIPT FLUSH", s.name)
	}
}

func TestTakeHonoursACanceledContext(t *testing.T) {
	r := newRig(t)
	r.setLimits("k", throttle.PerSecond(1))
	ctx, cancel := context.WithCancel(r.ctx)
	cancel()
	_, err := r.lim.Take(ctx, "k")
	assert.True(t, errors.Is(err, context.Canceled), "Take with a canceled context: %v", err)
}
