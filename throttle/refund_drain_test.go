package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// A key offered exactly what its tokens refill, each call booking twice
// what it uses, admits every call: the refunds come back to its bucket
// however long it has been busy (issue 29, item 9). 20 calls a second of
// 200 tokens, each giving back 100 when it ends 200 ms later, on 2,000
// tokens a second. Before, the least the bucket owed was kept since the
// first call of the minute (the bucket full then), each refund lowered it
// for good, and half the calls were refused.
func TestRefundsOnABusyKeyKeepItsUsageRate(t *testing.T) {
	ctx := context.Background()
	s := newDrainSim(t, 1, 3)
	require.NoError(t, s.l.SetLimits(ctx, "k", PerMinute(2400).WithBurst(40), PerMinute(120000).WithBurst(2000).In("tokens")))
	type call struct {
		ends time.Time
		d    Decision
	}
	var calls []call
	refused := 0
	for range 400 {
		s.setClock(s.now.Add(50 * time.Millisecond))
		for len(calls) > 0 && !calls[0].ends.After(s.now) {
			c := calls[0]
			calls = calls[1:]
			require.NoError(t, s.l.adjust(ctx, "k", -100, lua.Call{At: c.d.at, Charged: 200, Generation: c.d.gen, Unit: "tokens"}))
		}
		d, err := s.l.decide(ctx, "k", variant{granule: granule, headroom: s.l.o.headroom}, "", taskCost{n: 1, units: "tokens=200"}, "")
		require.NoError(t, err)
		if !d.Allowed {
			refused++
			continue
		}
		calls = append(calls, call{s.now.Add(200 * time.Millisecond), d})
	}
	assert.Zero(t, refused, "calls refused of 400, at 20 a second")
}
