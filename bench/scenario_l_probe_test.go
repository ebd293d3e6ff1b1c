package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// TestLProbeLearnsOneCallAtATime: the serial probe of ours-10x, on a Redis
// of its own, makes calls one at a time on its own endpoint and key (the
// run's endpoint and key are never touched) and says after how many
// responses each unit's rate and burst were within 5 % of the provider's,
// for buckets holding a second and a minute, in both modes, at the bench's
// latency. Every rate is learned from the first response; a burst it does
// not learn is one whose bucket every response showed full (reset 0s).
func TestLProbeLearnsOneCallAtATime(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	e := &env{ctl: rdb, runID: "probe"}
	p := newLLMProvider(lConf.latency)
	t.Cleanup(p.Close)
	for _, capacity := range []time.Duration{time.Second, time.Minute} {
		for _, m := range lModes {
			name := "l-" + capacity.String() + "-" + m.Name
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				lim := llmLimits{RPM: defaultLRPM, TPM: defaultLTPM, Capacity: capacity, Settle: m.Settle}
				r := &lRun{Mode: m, Endpoint: name, Provider: p, Limits: lim, Tasks: m.withEstimates(llmWorkload(3, 1))}
				start := time.Now()
				got := runLProbe(context.Background(), e, "bench-probe-"+name, r, oursLLMLimits(lim, 10, time.Minute))
				took := time.Since(start)
				require.Empty(t, got.Err)
				n, ok := got.learned()
				t.Logf("learned after %d response(s) (%v), %d call(s) in %v: %+v", n, ok, got.Calls, took, got.Units)
				for _, u := range got.Units {
					assert.Equal(t, 1, u.Rate, "%s: the rate from the first response", u.Unit)
					if u.Burst < 0 {
						assert.Equal(t, got.Responses, u.Full, "%s: a burst not learned: every response showed the bucket full", u.Unit)
					}
				}
				if ok {
					assert.LessOrEqual(t, n, lLearnResponses)
					assert.Equal(t, n, got.Calls, "it stops once every unit is learned")
				} else {
					assert.Equal(t, lProbeCalls, got.Calls, "it makes all its calls")
				}
				if capacity == time.Minute {
					assert.True(t, ok, "a minute's bucket: the burst is the learned rate's minute")
				}
				assert.Equal(t, got.Calls, got.Responses)
				assert.Zero(t, got.Limited)
				assert.Equal(t, r.Tasks[0].Estimate, got.Estimate)
				assert.Equal(t, r.Tasks[0].used(), got.Used)
				ep := p.snapshot(name + lProbeSuffix)
				require.NotNil(t, ep, "the probe's own endpoint")
				assert.Equal(t, got.Calls, ep.calls)
				assert.Nil(t, p.snapshot(name), "the run's endpoint is not touched")
				st, err := throttle.NewLimiter(rdb, throttle.WithPrefix("bench-probe-"+name)).Inspect(context.Background(), lKey)
				require.NoError(t, err)
				assert.Empty(t, st.Limits, "the run's key is not touched")
			})
		}
	}
}

// TestScenarioLPrintsTheProbesCount: the targets line of ours-10x takes the
// serial probe's exact count when it ran (the fleet's upper bounds stay in
// the unit lines), and says MISSED for a unit the probe never learned.
func TestScenarioLPrintsTheProbesCount(t *testing.T) {
	lim := llmLimits{RPM: 600, TPM: 6000000, Capacity: time.Second}
	c, err := newLCase(1, lModes[0], lim, lOptions{tasks: 5, seed: 1}, 0)
	require.NoError(t, err)
	probe := &lProbe{Endpoint: "l-ep-probe", Key: lKey + lProbeSuffix, Estimate: 5000, Used: 900, Calls: 2, Responses: 2, Units: []lProbeUnit{
		{Unit: "requests", ProviderRate: 10, ProviderBurst: 10, Rate: 1, Burst: 1},
		{Unit: "tokens", ProviderRate: 100000, ProviderBurst: 100000, Rate: 1, Burst: 2},
	}}
	learning := &lLearning{Configured: oursLLMLimits(lim, 10, time.Minute), Probe: probe, Units: []lUnitLearning{
		{Unit: "requests", ProviderRate: 10, ProviderBurst: 10, RateAt: time.Second, BurstAt: time.Second, RateResponses: 48, BurstResponse: 48, RateSeen: 11, BurstSeen: 11},
		{Unit: "tokens", ProviderRate: 100000, ProviderBurst: 100000, RateAt: time.Second, BurstAt: time.Second, RateResponses: 48, BurstResponse: 48, RateSeen: 11, BurstSeen: 11},
	}}
	s := &scenarioL{RPM: lim.RPM, TPM: lim.TPM, Cases: []lCase{c}, Results: []lResult{
		{Case: c.id(), Variant: lOurs10x, Tasks: 5, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.9, ShareRequests: 0.9, Drain: 5 * time.Second,
			Client: lClientStats{Succeeded: 5, Learning: learning}},
	}}
	var b bytes.Buffer
	s.print(&b)
	out := b.String()
	assert.Contains(t, out, "burst learned by 1.0s, after <= 48 responses (poll), <= 11 (read after each)", "the fleet's bounds stay")
	assert.Contains(t, out, "serial probe (one call at a time, own endpoint l-ep-probe and key openai:gpt-4o-probe, each declaring 5000 tokens, using 900): "+
		"requests rate and burst within 5 % after 1 response(s), tokens after 2 response(s) (rate after 1, burst after 2); 2 call(s), 0 429(s); "+
		"of its 2 response(s), showing the bucket full (reset 0s: a full bucket, which Observe reads as holding what is left): requests 0, tokens 0; target <= 3 met")
	assert.Contains(t, out, "targets L1 ours-10x: learned after 2 responses (the serial probe's exact count; the fleet's bound: after <= 11) met (<= 3)")

	probe.Calls, probe.Responses = lProbeCalls, lProbeCalls
	probe.Units[1].Burst = -1
	probe.Units[1].Found, probe.Units[1].End = true, throttle.PerMinute(6000000).WithBurst(1000000).In("tokens")
	b.Reset()
	s.print(&b)
	out = b.String()
	assert.Contains(t, out, "tokens NOT LEARNED (MISSED) within 20 calls (rate after 1, burst never;")
	assert.Contains(t, out, "target <= 3 MISSED")
	assert.Contains(t, out, "targets L1 ours-10x: NOT LEARNED (MISSED) by the serial probe: not every unit's rate and burst within 5 % of the provider's after 20 calls (the fleet's bound: after <= 11)")

	probe.Units[1].Full = lProbeCalls
	b.Reset()
	s.print(&b)
	assert.Contains(t, b.String(), "after 20 calls: the rates after 1, the bursts missed with every response showing the buckets full (the fleet's bound: after <= 11)")

	probe.Err = "call 3: boom"
	b.Reset()
	s.print(&b)
	out = b.String()
	assert.Contains(t, out, "STOPPED: call 3: boom")
	assert.Contains(t, out, "targets L1 ours-10x: serial probe FAILED (call 3: boom), so by the fleet's upper bound: learned after at most 11 responses MISSED (<= 3)")
}

// TestLLearningOfPerSecondTiers: ours-10x-s (issue 29, item 10) is told
// 10x the provider's per-minute quotas as per-second tiers; its learning
// check compares rates per second and bursts in units, so a key that keeps
// 10x is NOT LEARNED by the poll, the reads after each response and the
// printed verdict alike, and the serial probe, through Observe and the
// provider's headers (2,400 requests and 120,000 tokens a minute from
// buckets holding a second), finds 40/s and 2,000/s learned.
func TestLLearningOfPerSecondTiers(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	e := &env{ctl: rdb, runID: "item10"}
	ctx := context.Background()
	m := lModes[2]
	require.Equal(t, "refunds", m.Name)
	lim := llmLimits{RPM: 2400, TPM: 120000, Capacity: time.Second, Settle: m.Settle}
	limits := oursLLMLimits(lim, 10, time.Second)
	require.Equal(t, []throttle.Limit{throttle.PerSecond(400), throttle.PerSecond(20000).In("tokens")}, limits)

	// The key keeps 10x: nothing observed.
	prefix := "bench-item10-kept"
	admin := throttle.NewLimiter(rdb, throttle.WithPrefix(prefix))
	t.Cleanup(func() { admin.Close() })
	require.NoError(t, admin.SetLimits(ctx, lKey, limits...))
	learn := &lLearning{Configured: limits, Units: []lUnitLearning{
		newLUnitLearning("requests", lim.requestRate(), lim.requestCapacity()),
		newLUnitLearning(lUnit, lim.tokenRate(), lim.tokenCapacity()),
	}}
	o := &lOursRun{factor: 10, limits: limits, learn: learn, inspector: admin}
	o.responses.Store(3)
	o.checkLearned()
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	o.poll(stopped, learn) // one read, then the context's end
	require.Equal(t, 1, learn.Polls)
	require.Zero(t, learn.PollErrors)
	for i, u := range learn.Units {
		assert.True(t, u.Found, u.Unit)
		assert.Equal(t, limits[i].WithBurst(limits[i].N), u.End, "%s: in force as told", u.Unit)
		assert.Equal(t, []int{-1, -1, -1, -1}, []int{u.RateSeen, u.BurstSeen, int(u.RateAt), int(u.BurstAt)}, "%s: nothing learned", u.Unit)
		assert.False(t, u.learned(), u.Unit)
	}
	assert.False(t, o.learnedAll.Load())
	c, err := newLCase(0, m, lim, lOptions{seed: 1}, lDrainTarget)
	require.NoError(t, err)
	s := &scenarioL{RPM: lim.RPM, TPM: lim.TPM, Cases: []lCase{c}, Results: []lResult{
		{Case: c.id(), Variant: lOurs10xS, Tasks: c.Tasks, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.6, Client: lClientStats{Succeeded: c.Tasks, Learning: learn}},
	}}
	var b bytes.Buffer
	s.print(&b)
	out := b.String()
	assert.Contains(t, out, "learning L5 ours-10x-s (configured 10x too high: 400/1s burst 400, 20000/1s burst 20000 in tokens;")
	assert.Contains(t, out, "requests provider 40.0/s holding 40.0; rate not learned; burst not learned; in force at the end: 400/1s burst 400")
	assert.Contains(t, out, "targets L5 ours-10x-s: NOT LEARNED (MISSED)")

	// The probe, through Observe: the per-minute quotas bind the
	// per-second tiers.
	p := newLLMProvider(lConf.latency)
	t.Cleanup(p.Close)
	r := &lRun{Mode: m, Endpoint: "l-item10", Provider: p, Limits: lim, Tasks: m.draw(3, 1)}
	got := runLProbe(ctx, e, "bench-item10-probe", r, limits)
	require.Empty(t, got.Err)
	t.Logf("%+v", got.Units)
	n, ok := got.learned()
	assert.True(t, ok, "learned")
	assert.Equal(t, 1, n, "after the first response")
	assert.Zero(t, got.Limited)
	assert.Equal(t, throttle.PerSecond(40).WithBurst(40), got.Units[0].End)
	assert.Equal(t, throttle.PerSecond(2000).WithBurst(2000).In("tokens"), got.Units[1].End)
}
