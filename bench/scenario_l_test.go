package main

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestLLMWorkloadIsHeavyTailedAndSeeded(t *testing.T) {
	tasks := llmWorkload(20000, 1)
	sizes := make([]int, len(tasks))
	for i, tk := range tasks {
		sizes[i] = tk.used()
		require.LessOrEqual(t, tk.Completion, lMaxTokens, "task %d: the completion fits max_tokens", i)
		require.Equal(t, max(tk.used()/lCompletionShare, 1), tk.Completion)
	}
	slices.Sort(sizes)
	assert.InDelta(t, lMedianTokens, sizes[len(sizes)/2], 0.05*lMedianTokens, "median")
	assert.InDelta(t, lP99Tokens, sizes[len(sizes)*99/100], 0.15*lP99Tokens, "p99")
	assert.LessOrEqual(t, sizes[len(sizes)-1], lMaxUsage, "capped")
	assert.Equal(t, tasks[:50], llmWorkload(50, 1), "the same seed, the same tasks")
	assert.NotEqual(t, tasks[:50], llmWorkload(50, 2))
}

func TestLModesEstimateAndCharge(t *testing.T) {
	tk := llmTask{Prompt: 7000, Completion: 1000}
	byMax, median := lModes[0], lModes[1]
	e := byMax.withEstimates([]llmTask{tk})[0]
	assert.Equal(t, 7000+lMaxTokens, e.Estimate, "prompt + max_tokens")
	assert.Equal(t, e.Estimate, byMax.charge(e), "charged as estimated")
	e = median.withEstimates([]llmTask{tk})[0]
	assert.Equal(t, 2*lMedianTokens, e.Estimate)
	assert.Equal(t, 8000, median.charge(e), "settled to the usage")
}

func TestLIdealIsEachBucketAtOnceThenItsRate(t *testing.T) {
	lim := llmLimits{RPM: 600, TPM: 60000, Capacity: time.Second} // 10 req/s, 1,000 tokens/s
	m := lModes[1]                                                // settles: charges the usage
	tasks := make([]llmTask, 30)
	for i := range tasks {
		tasks[i] = llmTask{Prompt: 50, Completion: 50}
	}
	d, unit := lIdeal(tasks, m, lim)
	assert.Equal(t, 2*time.Second, d, "(30 - 10) requests at 10/s; tokens (3000 - 1000) / 1000 = 2 s too")
	tasks[0].Prompt += 1000
	d, unit = lIdeal(tasks, m, lim)
	assert.Equal(t, "tokens", unit)
	assert.Equal(t, 3*time.Second, d)
	d, unit = lIdeal(tasks[1:6], m, lim)
	assert.Equal(t, time.Duration(0), d, "within both buckets")
	assert.Equal(t, "tokens", unit)
	d, unit = lIdeal(make([]llmTask, 40), m, lim)
	assert.Equal(t, "requests", unit)
	assert.Equal(t, 3*time.Second, d)

	o := lOptions{rpm: 600, tpm: 60000, seed: 1}
	sized := lTasks(o, m, lim, 5*time.Second)
	got, _ := lIdeal(sized, m, lim)
	less, _ := lIdeal(sized[:len(sized)-1], m, lim)
	assert.GreaterOrEqual(t, got, 5*time.Second)
	assert.Less(t, less, 5*time.Second, "the fewest tasks that reach the target")
	o.tasks = 7
	assert.Len(t, lTasks(o, m, lim, time.Hour), 7)
}

// TestLShareIsWhatTheLimitAllowedInTheSpan: charges over the level at the
// span's start plus rate x span, replayed through the bucket.
func TestLShareIsWhatTheLimitAllowedInTheSpan(t *testing.T) {
	unit := func(ev llmEvent) int { return ev.requests }
	calls := func(n int, every, from time.Duration) []llmEvent {
		var out []llmEvent
		for i := range n {
			out = append(out, llmEvent{at: at.Add(from + time.Duration(i)*every), requests: 1})
		}
		return out
	}
	from, to := at.Add(time.Second), at.Add(11*time.Second)
	// 10/s holding 10: the burst at 0, then the rate from 1 s on.
	evs := append(calls(10, 0, 0), calls(110, 100*time.Millisecond, 100*time.Millisecond)...)
	assert.InDelta(t, 1, lShare(evs, unit, 10, 10, at, from, to), 1e-9, "the rate from 1 s to 11 s, and the token the bucket held at 1 s")
	evs = append(calls(10, 0, 0), calls(100, 100*time.Millisecond, time.Second+time.Millisecond)...)
	assert.InDelta(t, 100.0/(10+100), lShare(evs, unit, 10, 10, at, from, to), 1e-9, "the first second's refill, saved at 1 s and never used")
	// Nothing until 6 s: the bucket full at 1 s, then 50 calls.
	evs = calls(60, 100*time.Millisecond, 6*time.Second)
	assert.InDelta(t, 50.0/(10+100), lShare(evs, unit, 10, 10, at, from, to), 0.02, "half the span lost")
	// A bucket holding a minute (600): a stall counts as much.
	evs = append(calls(300, 0, 0), calls(400, 10*time.Millisecond, 7*time.Second)...)
	s := lShare(evs, unit, 10, 600, at, from, to)
	assert.InDelta(t, 400.0/(310+100), s, 0.01, "400 of the 410 the limit allowed: the bucket emptied in the end")
	evs = append(calls(300, 0, 0), calls(200, 10*time.Millisecond, 7*time.Second)...)
	assert.InDelta(t, 200.0/410, lShare(evs, unit, 10, 600, at, from, to), 0.01, "tokens left in the bucket are not used")
	assert.Zero(t, lShare(evs, unit, 10, 600, at, to, from), "an empty span")

	// Refunds and debts: settled charges count net, a debt at from allows less.
	tok := func(ev llmEvent) int { return ev.tokens }
	evs = []llmEvent{{at: at, requests: 1, tokens: 100}, {at: at.Add(500 * time.Millisecond), tokens: 1900},
		{at: at.Add(2 * time.Second), requests: 1, tokens: 100}, {at: at.Add(2500 * time.Millisecond), tokens: -50}}
	// 900 at 0, -900 at 0.5 s (1000, capped, less 1900), -400 at 1 s: 50
	// charged net in [1 s, 11 s], of 10000 - 400 allowed.
	assert.InDelta(t, 50.0/9600, lShare(evs, tok, 1000, 1000, at, from, to), 1e-9)
}

func TestScenarioLPrintsAVerdictPerRun(t *testing.T) {
	lim := llmLimits{RPM: 600, TPM: 60000, Capacity: time.Second}
	c, err := newLCase(1, lModes[0], lim, lOptions{tasks: 5, seed: 1}, 0)
	require.Error(t, err, "an estimate above the token bucket's 1,000 can never be admitted")
	lim.TPM = 6000000
	c, err = newLCase(1, lModes[0], lim, lOptions{tasks: 5, seed: 1}, 0)
	require.NoError(t, err)
	s := &scenarioL{RPM: lim.RPM, TPM: lim.TPM, Cases: []lCase{c}, Results: []lResult{
		{Case: c.id(), Variant: lCookbook1, Tasks: 5, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.97, ShareRequests: 0.97, Client: lClientStats{Succeeded: 5}},
		{Case: c.id(), Variant: lCookbook3, Tasks: 5, Binding: c.Binding, Spent: true, Limited: 3, ShortTokens: 3, ShareTokens: 0.5, ShareRequests: 0.5, Client: lClientStats{Succeeded: 2}},
	}}
	var b bytes.Buffer
	s.print(&b)
	out := b.String()
	assert.Contains(t, out, "targets L1 cookbook-x1: 429s 0 met (0); share of the "+c.Binding+" limit 0.97 met (>= 0.90); drained")
	assert.Contains(t, out, "targets L1 cookbook-x3: 429s 3 MISSED (0); share of the "+c.Binding+" limit 0.50 MISSED (>= 0.90); NOT DRAINED by the cut-off (2 of 5 tasks settled)")
}

// TestLSpanStartsOnceTheSavedBurstIsSpent: a bucket that holds a second of
// its rate is spent from the warm-up on; one that holds a minute once it is
// drawn down to a second's worth; one never drawn down has no span.
func TestLSpanStartsOnceTheSavedBurstIsSpent(t *testing.T) {
	unit := func(ev llmEvent) int { return ev.requests }
	from, to := at.Add(time.Second), at.Add(20*time.Second)
	got, ok := lBurstSpent(nil, unit, 10, 10, at, from, to)
	assert.True(t, ok)
	assert.Equal(t, from, got, "a second's worth at most: spent already")

	// 600 held, 40 calls a second from 0: 10 s later, 600 + 100 - 400 =
	// 300; the level reaches 10 after 590 / 30 = 19.67 s.
	var evs []llmEvent
	for i := range 800 {
		evs = append(evs, llmEvent{at: at.Add(time.Duration(i) * 25 * time.Millisecond), requests: 1})
	}
	got, ok = lBurstSpent(evs, unit, 10, 600, at, from, to)
	require.True(t, ok)
	assert.InDelta(t, 19.67, got.Sub(at).Seconds(), 0.05)
	_, ok = lBurstSpent(evs[:200], unit, 10, 600, at, from, to)
	assert.False(t, ok, "200 calls never spend a minute's worth")
}

func TestLBurstTimeIsWhatOneProcessNeedsToSpendTheBuckets(t *testing.T) {
	m := lModes[1]
	tasks := []llmTask{{Prompt: 900, Completion: 100}} // 1,000 tokens charged
	second := llmLimits{RPM: 600, TPM: 60000, Capacity: time.Second}
	assert.Zero(t, lBurstTime(tasks, m, second, 100*time.Millisecond), "a second's worth: nothing saved")
	minute := llmLimits{RPM: 600, TPM: 60000, Capacity: time.Minute}
	// 16 workers at 100 ms: 160 calls/s, 160,000 tokens/s; requests:
	// (600 - 10) / 150 = 3.93 s; tokens: (60,000 - 1,000) / 159,000.
	assert.InDelta(t, 590.0/150, lBurstTime(tasks, m, minute, 100*time.Millisecond).Seconds(), 1e-6)
	assert.Equal(t, time.Minute, lBurstTime(tasks, m, minute, 10*time.Second), "1.6 calls/s never spend 10/s: a minute at most")
	assert.Zero(t, lBurstTime(tasks, m, minute, 0))
}

// TestOursLLMLimitsSayTheBucketsBurst: ours is told the stated limits, with
// the burst the provider's buckets hold when they hold less than a minute;
// ours-10x 10x the stated limits and no burst (a minute's worth).
func TestOursLLMLimitsSayTheBucketsBurst(t *testing.T) {
	second := llmLimits{RPM: 1000, TPM: 2000000, Capacity: time.Second}
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(1000).WithBurst(16), throttle.PerMinute(2000000).WithBurst(33333).In("tokens")},
		oursLLMLimits(second, 1, time.Minute))
	minute := second
	minute.Capacity = time.Minute
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(1000), throttle.PerMinute(2000000).In("tokens")}, oursLLMLimits(minute, 1, time.Minute))
	assert.Equal(t, []throttle.Limit{throttle.PerMinute(10000), throttle.PerMinute(20000000).In("tokens")}, oursLLMLimits(second, 10, time.Minute))
	// ours-10x-s: the same rates as per-second tiers (issue 29 item 10's
	// 400/s and 20,000/s for 2,400 and 120,000 a minute), rounded down.
	item10 := llmLimits{RPM: 2400, TPM: 120000, Capacity: time.Second}
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(400), throttle.PerSecond(20000).In("tokens")}, oursLLMLimits(item10, 10, time.Second))
	assert.Equal(t, []throttle.Limit{throttle.PerSecond(166), throttle.PerSecond(333333).In("tokens")}, oursLLMLimits(second, 10, time.Second))
}

func TestLPayloadRoundTrips(t *testing.T) {
	task := llmTask{ID: 7, Prompt: 900, Completion: 100, Estimate: 4996}
	idx, estimate, used, err := lParsePayload(lPayload(task))
	require.NoError(t, err)
	assert.Equal(t, []int{7, 4996, 1000}, []int{idx, estimate, used})
	_, _, _, err = lParsePayload([]byte("7 4996"))
	assert.Error(t, err)
	_, _, _, err = lParsePayload([]byte("7 x 1000"))
	assert.Error(t, err)
}

// TestLLearningFindsEachUnitsTier: the request tier is the bucket without a
// unit, the tokens tier the bucket in tokens; within 5 % is learned.
func TestLLearningFindsEachUnitsTier(t *testing.T) {
	in := []throttle.Limit{throttle.PerMinute(2000000).WithBurst(33333).In("tokens"), throttle.PerMinute(1000).WithBurst(16), throttle.InFlight(4)}
	req, ok := tierOf(in, "requests")
	require.True(t, ok)
	assert.Equal(t, 1000, req.N)
	tok, ok := tierOf(in, "tokens")
	require.True(t, ok)
	assert.Equal(t, 33333, tok.Burst)
	_, ok = tierOf(in, "input-tokens")
	assert.False(t, ok)
	// Rates per second and bursts in units, whatever the tier's period
	// (Burst 0 is N): 40 requests a second in a bucket of 40.
	u := newLUnitLearning("requests", 40, 40)
	for _, c := range []struct {
		in          throttle.Limit
		rate, burst bool
	}{
		{throttle.PerSecond(40).WithBurst(40), true, true},
		{throttle.PerSecond(40), true, true},
		{throttle.PerMinute(2400).WithBurst(40), true, true},
		{throttle.PerMinute(2400), true, false},
		{throttle.PerSecond(400), false, false},
		{throttle.PerMinute(24000), false, false},
		{throttle.PerSecond(400).WithBurst(40), false, true},
	} {
		rate, burst, in, found := u.learnedIn([]throttle.Limit{c.in, throttle.PerSecond(20000).In("tokens")})
		assert.Equal(t, []bool{c.rate, c.burst, true}, []bool{rate, burst, found}, "%v: rate, burst learned, found", c.in)
		assert.Equal(t, c.in, in)
	}
	assert.True(t, near(16, 16.67))
	assert.False(t, near(15, 16.67), "15 is 10 % below a bucket of 16.7")
	assert.False(t, near(1, 0))
}

// TestScenarioLPrintsOursBesideTheCookbook: ratios of ours over each
// column, and the learning block of ours-10x, learned or not.
func TestScenarioLPrintsOursBesideTheCookbook(t *testing.T) {
	lim := llmLimits{RPM: 600, TPM: 6000000, Capacity: time.Second}
	c, err := newLCase(1, lModes[0], lim, lOptions{tasks: 5, seed: 1}, 0)
	require.NoError(t, err)
	learning := func(rateAt time.Duration, seen int) *lLearning {
		return &lLearning{Configured: oursLLMLimits(lim, 10, time.Minute), Suspensions: 2, Units: []lUnitLearning{
			{Unit: "requests", ProviderRate: 10, ProviderBurst: 10, RateAt: rateAt, BurstAt: rateAt, RateResponses: 2, BurstResponse: 3,
				RateSeen: seen, BurstSeen: -1},
			{Unit: "tokens", ProviderRate: 100000, ProviderBurst: 100000, RateAt: rateAt, BurstAt: rateAt, RateResponses: 2, BurstResponse: 2,
				RateSeen: seen, BurstSeen: seen},
		}}
	}
	s := &scenarioL{RPM: lim.RPM, TPM: lim.TPM, Cases: []lCase{c}, Results: []lResult{
		{Case: c.id(), Variant: lCookbook1, Tasks: 5, Binding: c.Binding, Spent: true, Limited: 3, ShareTokens: 0.2, ShareRequests: 0.2, Drain: 20 * time.Second, Client: lClientStats{Succeeded: 2}},
		{Case: c.id(), Variant: lOurs, Tasks: 5, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.9, ShareRequests: 0.9, Drain: 5 * time.Second,
			Client: lClientStats{Succeeded: 5, Learning: &lLearning{}, Lag: 12 * time.Millisecond}},
		{Case: c.id(), Variant: lOurs10x, Tasks: 5, Finished: true, Binding: c.Binding, Spent: true, Limited: 1, ShareTokens: 0.8, ShareRequests: 0.8, Drain: 10 * time.Second,
			Client: lClientStats{Succeeded: 5, Learning: learning(-1, -1), Late: 1, Lag: 30 * time.Millisecond}},
	}}
	var b bytes.Buffer
	s.print(&b)
	out := b.String()
	assert.Regexp(t, `ours / this column: share of the binding limit \(`+c.Binding+`\) +4\.50x +1\.00x +1\.12x`, out)
	assert.Regexp(t, `ours / this column: drain time \(DNF: at most\) +<0\.25x +1\.00x +0\.50x`, out)
	assert.Regexp(t, `admission to the provider's decision, longest / calls later than the 20ms headroom +- +12ms / 0 +30ms / 1`, out)
	assert.Contains(t, out, "targets L1 ours-10x: NOT LEARNED (MISSED)")
	assert.Contains(t, out, "suspensions 2 MISSED (<= 1); 429s 1")

	// The poll saw the requests' burst after 3 responses; the reads after
	// each response saw the rates after 1 and the tokens' burst after 1.
	s.Results[2].Client.Learning = learning(time.Second, 1)
	b.Reset()
	s.print(&b)
	out = b.String()
	assert.Contains(t, out, "rate learned by 1.0s, after <= 2 responses (poll), <= 1 (read after each); burst learned by 1.0s, after <= 3 responses (poll);")
	assert.Contains(t, out, "targets L1 ours-10x: learned after at most 3 responses met (<= 3); suspensions 2 MISSED (<= 1)")

	// Seen only by the reads after each response, never by a poll.
	l := learning(-1, 4)
	l.Units[0].BurstSeen = 4
	s.Results[2].Client.Learning = l
	b.Reset()
	s.print(&b)
	assert.Contains(t, b.String(), "targets L1 ours-10x: learned after at most 4 responses MISSED (<= 3)")
}

// L5 is issue 29's shape, whatever -l-capacity says: 40 requests and
// 2,000 tokens a second in buckets of a second, 300 tasks booking 200
// tokens and using 20 to 180 (about 100 on average), charged their usage;
// it runs ours and ours-enqueue unless -l-variants says, and its verdict
// counts ours' deferrals per task.
func TestLRefundsCaseIsIssue29sShape(t *testing.T) {
	m := lModes[2]
	require.Equal(t, "refunds", m.Name)
	c, err := newLCase(7, m, llmLimits{RPM: m.fixed.RPM, TPM: m.fixed.TPM, Capacity: m.fixed.Capacity, Settle: m.Settle}, lOptions{seed: 1}, lDrainTarget)
	require.NoError(t, err)
	assert.Equal(t, "L5", c.Name, "a fixed case keeps its name")
	assert.Equal(t, 300, c.Tasks)
	assert.Equal(t, []string{lOurs, lOursEnqueue}, lOptions{}.caseVariants(c))
	assert.Equal(t, []string{lCookbook1}, lOptions{variants: []string{lCookbook1}}.caseVariants(c))
	used := 0
	for _, task := range c.tasks {
		assert.Equal(t, 200, task.Estimate)
		assert.True(t, task.used() >= 20 && task.used() <= 180, "usage %d", task.used())
		used += task.used()
	}
	assert.InDelta(t, 100, float64(used)/300, 5, "mean usage")
	assert.Equal(t, used, c.Charged, "the provider charges the usage")
	assert.Equal(t, "tokens", c.Binding)

	s := &scenarioL{RPM: c.lim.RPM, TPM: c.lim.TPM, Cases: []lCase{c}, Results: []lResult{
		{Case: c.id(), Variant: lOurs, Tasks: 300, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.95, Client: lClientStats{Succeeded: 300, Deferrals: 291, Learning: &lLearning{}}},
		{Case: c.id(), Variant: lOursEnqueue, Tasks: 300, Finished: true, Binding: c.Binding, Spent: true, ShareTokens: 0.5, Client: lClientStats{Succeeded: 300, Deferrals: 600, Learning: &lLearning{}}},
	}}
	var b bytes.Buffer
	s.print(&b)
	out := b.String()
	assert.Regexp(t, `ours: deferrals per task \(target <= 1\.5\) +0\.97 \(291\) +2\.00 \(600\)`, out)
	assert.Contains(t, out, "targets L5 ours: 429s 0 met (0); share of the tokens limit 0.95 met (>= 0.90); deferrals per task 0.97 met (<= 1.5); drained")
	assert.Contains(t, out, "targets L5 ours-enqueue: 429s 0 met (0); share of the tokens limit 0.50 MISSED (>= 0.90); deferrals per task 2.00 MISSED (<= 1.5); drained")
}
