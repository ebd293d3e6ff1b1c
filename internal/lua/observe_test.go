package lua

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func (e *env) observe(a ObserveArgs) []string {
	e.t.Helper()
	if a.LearnFor == 0 {
		a.LearnFor = 10 * time.Minute
	}
	if a.MaxSuspension == 0 {
		a.MaxSuspension = time.Hour
	}
	got, err := Observe(e.ctx, e.run, e.k, a)
	require.NoError(e.t, err)
	return got
}

func (e *env) inspect() InspectReply {
	e.t.Helper()
	r, err := Inspect(e.ctx, e.run, e.k, nil, 0)
	require.NoError(e.t, err)
	return r
}

// A published quota below the configured tier of its period lowers it
// until the provider stops saying it; one above it never raises it; the
// configured tier stays the ceiling.
func TestObserveLearnsAQuotaBelowTheCeiling(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 60_000, Burst: 100}, Tier{Rate: 10, PerMS: 1000, Burst: 10})
	gen0 := e.inspect().Generation

	got := e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 60, PerMS: 60_000}}})
	assert.Equal(t, []string{"learned 0 60 100 60000"}, got)
	r := e.inspect()
	assert.Equal(t, int64(60), r.Tiers[0].Rate, "in force: the learned quota")
	assert.Equal(t, int64(60), r.Tiers[0].Burst, "the burst is lowered with it")
	assert.Equal(t, int64(100), r.Configured[0].Rate, "configured: the ceiling, unchanged")
	assert.Equal(t, 10*time.Minute, r.LearnedFor[0])
	assert.Zero(t, r.LearnedFor[1])
	assert.InDelta(t, 60, r.Tokens[0], 1e-6)
	assert.Greater(t, r.Generation, gen0, "a learned change is a change of limits for leases")

	// Decisions obey it: 60 at once and 1/s after, for 19.8 s (the
	// configured 100/min would admit all 100 calls).
	a := DecideArgs{}
	admitted := 0
	for i := range 100 {
		e.at(time.Duration(i) * 200 * time.Millisecond)
		if e.decide(a).Status == StatusAllowed {
			admitted++
		}
	}
	assert.Equal(t, 79, admitted, "admitted in 19.8 s under a learned 60/min")

	// Said again: no change to log; higher than configured: back to it.
	assert.Empty(t, e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 60, PerMS: 60_000}}}))
	assert.Equal(t, []string{"ceiling 0 100 60000"},
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 500, PerMS: 60_000}}}))
	assert.Equal(t, int64(100), e.inspect().Tiers[0].Rate, "never above the configured tier")

	// A unit the key has no tier of is reported, not applied.
	assert.Equal(t, []string{"unmatched 3600000 5000 tokens"},
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 5000, PerMS: 3_600_000, Unit: "tokens"}}}))

	// Learned, then the provider goes quiet: back to the ceiling after
	// LearnFor.
	e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 30, PerMS: 60_000}}, LearnFor: time.Minute})
	assert.Equal(t, int64(30), e.inspect().Tiers[0].Rate)
	e.at(20*time.Second + 2*time.Minute + time.Millisecond)
	assert.Equal(t, int64(100), e.inspect().Tiers[0].Rate, "expired back to the configured tier")
}

// A remaining count below the tokens brings them down, never up; remaining
// 0 with a reset suspends the key until the reset.
func TestObserveRemainingLowersTokensNeverRaises(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 60_000, Burst: 100}, Tier{Kind: KindWindow, Rate: 1000, PerMS: 3_600_000, Burst: 1000})
	got := e.observe(ObserveArgs{Remaining: 40, WindowMS: 60_000})
	assert.Equal(t, []string{"tokens 0 100 40"}, got, "only the tier of the remaining's window")
	r := e.inspect()
	assert.InDelta(t, 40, r.Tokens[0], 1e-6)
	assert.InDelta(t, 1000, r.Tokens[1], 1e-6)
	assert.Empty(t, e.observe(ObserveArgs{Remaining: 90, WindowMS: 60_000}), "never up")

	// Window unknown: every tier.
	got = e.observe(ObserveArgs{Remaining: 20})
	assert.Equal(t, []string{"tokens 0 40 20", "tokens 1 1000 20"}, got)
	r = e.inspect()
	assert.InDelta(t, 20, r.Tokens[0], 1e-6)
	assert.InDelta(t, 20, r.Tokens[1], 1e-6, "a window counts the provider's other calls")

	got = e.observe(ObserveArgs{Remaining: 0, WindowMS: 60_000, Reset: 30 * time.Second, Stop: true})
	assert.Equal(t, []string{"tokens 0 20 0", "suspended 30000000"}, got)
	assert.Equal(t, 30*time.Second, e.inspect().Suspended)
	d := e.decide(DecideArgs{})
	assert.Equal(t, StatusDenied, d.Status)
	assert.Equal(t, "suspended", d.RefusedBy)
	// A shorter reset never shortens the suspension.
	e.observe(ObserveArgs{Remaining: 0, Reset: time.Second, Stop: true})
	assert.Equal(t, 30*time.Second, e.inspect().Suspended)
}

// Adaptive: each new suspension halves the rate tiers in force, once
// however many callers report it; clean intervals win back 10 % each.
func TestAdaptiveHalvesOnSuspensionAndWinsBackWhenClean(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100}, Tier{Kind: KindAdaptive, PerMS: 10_000})
	r := e.inspect()
	assert.Equal(t, 10*time.Second, r.AdaptiveEvery)
	assert.InDelta(t, 1, r.AdaptiveFactor, 1e-9)

	s, err := SuspendKey(e.ctx, e.run, e.k, 2*time.Second, time.Hour)
	require.NoError(t, err)
	assert.True(t, s.Adapted)
	assert.InDelta(t, 0.5, s.Factor, 1e-9)
	for range 5 { // the rest of the fleet saw the same 429
		s, err = SuspendKey(e.ctx, e.run, e.k, 2*time.Second, time.Hour)
		require.NoError(t, err)
		assert.False(t, s.Adapted, "once per suspension, not once per worker")
	}
	assert.Equal(t, int64(50), e.inspect().Tiers[0].Rate)

	// A second suspension after the first ended: halved again.
	e.at(3 * time.Second)
	s, err = SuspendKey(e.ctx, e.run, e.k, time.Second, time.Hour)
	require.NoError(t, err)
	assert.InDelta(t, 0.25, s.Factor, 1e-9)
	assert.Equal(t, int64(25), e.inspect().Tiers[0].Rate)
	assert.Equal(t, int64(100), e.inspect().Configured[0].Rate)

	// Clean intervals from the end of the suspension (4 s): +10 % each.
	e.at(4*time.Second + 10*time.Second)
	assert.Equal(t, int64(35), e.inspect().Tiers[0].Rate)
	e.at(4*time.Second + 80*time.Second)
	assert.Equal(t, int64(100), e.inspect().Tiers[0].Rate, "back to the ceiling, never above")
	assert.InDelta(t, 1, e.inspect().AdaptiveFactor, 1e-9)

	// Without Adaptive a suspension cuts nothing.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100})
	s, err = SuspendKey(e2.ctx, e2.run, e2.k, time.Second, time.Hour)
	require.NoError(t, err)
	assert.False(t, s.Adapted)
}

// On a window, the provider's other calls behind a low remaining count
// leave at the provider's reset, not a whole window later.
func TestObserveRemainingOnAWindowLeavesAtTheReset(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Kind: KindWindow, Rate: 10, PerMS: 1000, Burst: 10})
	assert.Equal(t, []string{"tokens 0 10 0"}, e.observe(ObserveArgs{Remaining: 0, WindowMS: 1000, Reset: 300 * time.Millisecond}))
	assert.InDelta(t, 0, e.inspect().Tokens[0], 1e-9)
	assert.Zero(t, e.inspect().Suspended, "not told to stop: no suspension")
	e.at(250 * time.Millisecond)
	assert.InDelta(t, 0, e.inspect().Tokens[0], 1e-9, "before the reset")
	e.at(300*time.Millisecond + 50*time.Millisecond) // and the sub-window (50 ms)
	assert.InDelta(t, 10, e.inspect().Tokens[0], 1e-9, "after the provider's reset")
}

// Remaining 0 with a near reset: the bucket admits nothing until the reset
// (it refills from empty then), with no suspension.
func TestObserveNoneLeftAdmitsNothingUntilANearReset(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10, PerMS: 1000, Burst: 10})
	assert.Equal(t, []string{"tokens 0 10 0"}, e.observe(ObserveArgs{Remaining: 0, Reset: 3 * time.Second, Stop: true}))
	assert.Zero(t, e.inspect().Suspended, "a near reset is kept by the tier, not a suspension")
	a := DecideArgs{}
	e.at(2900 * time.Millisecond)
	assert.Equal(t, StatusDenied, e.decide(a).Status, "before the reset")
	e.at(3100 * time.Millisecond)
	assert.Equal(t, StatusAllowed, e.decide(a).Status, "a token after the reset")
}

// A response that brings the buckets down writes T with the key's expiry
// memo (x, T's second double), which the decisions after trust to spare a
// PEXPIRE: the key lives at least until the memo says. Before the fix the
// memo said twice the need (keep_alive's TTL) while the key was extended
// to the need alone, and a key of PerSecond(2) in a provider's debt lost
// its state a second and a half before its bucket was full. Fails with
// "the key lives until the memo in T" (3s, the memo 6s).
func TestObserveKeyLivesUntilItsExpiryMemo(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 2}).Status)
	require.Equal(t, []string{"tokens 0 0 0"}, e.observe(ObserveArgs{Remaining: 0, Reset: 2 * time.Second}))
	T := decodeT(t, e.mr.HGet(e.k.Bucket, "T"))
	memo := time.Duration(T[1]-float64(testEpoch().UnixMicro())) * time.Microsecond
	require.Greater(t, memo, 3*time.Second, "the memo is beyond the need (the bucket full in 3s): the test proves little")
	assert.GreaterOrEqual(t, e.mr.TTL(e.k.Bucket), memo, "the key lives until the memo in T")
}

// ObserveKey also tells the key's tiers, in force and configured, whatever
// was sent: what lets a process send only the quotas that change something.
func TestObserveKeyTellsTheTiers(t *testing.T) {
	e := newEnv(t)
	args := ObserveArgs{Remaining: -1, LearnFor: time.Minute, MaxSuspension: time.Hour,
		Policies: []Policy{{Quota: 60, PerMS: 60_000}, {Quota: 7, PerMS: 3_000}}}
	o, err := ObserveKey(e.ctx, e.run, e.k, args)
	require.NoError(t, err)
	assert.Equal(t, Observed{}, o, "a key without limits: nothing changes, no tiers")

	e.setLimits(Tier{Rate: 100, PerMS: 60_000, Burst: 100}, Tier{Kind: KindWindow, Rate: 10, PerMS: 1000, Burst: 10})
	o, err = ObserveKey(e.ctx, e.run, e.k, args)
	require.NoError(t, err)
	// (7 per 3 s: the 1 s window is the nearest period, at 2 a second.)
	assert.Equal(t, Observed{
		Changes:    []string{"learned 0 60 100 60000", "converted 1 2 10 1000 7 3000"},
		Tiers:      []ObservedTier{{PerMS: 60_000, InForce: 60, Configured: 100, Burst: 60}, {PerMS: 1000, InForce: 2, Configured: 10}},
		Generation: 2, // (set, then learned)
	}, o)
	o, err = ObserveKey(e.ctx, e.run, e.k, ObserveArgs{Remaining: -1, LearnFor: time.Minute, MaxSuspension: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, []ObservedTier{{PerMS: 60_000, InForce: 60, Configured: 100, Burst: 60}, {PerMS: 1000, InForce: 2, Configured: 10}}, o.Tiers,
		"told with nothing sent")
	assert.Empty(t, o.Changes)
}

// Adaptive's clean intervals count from the end of the suspension that
// cut the rate, and an extended suspension (another 429 while it lasts, or
// a provider's far reset) moves that end: no interval is clean while the
// key is still suspended.
func TestAdaptiveExtendedSuspensionMovesTheCleanStart(t *testing.T) {
	extend := map[string]func(e *env){
		"Suspend": func(e *env) {
			s, err := SuspendKey(e.ctx, e.run, e.k, 60*time.Second, time.Hour)
			require.NoError(e.t, err)
			assert.False(e.t, s.Adapted, "an extension cuts nothing more")
		},
		"Observe": func(e *env) {
			e.observe(ObserveArgs{Remaining: 0, Reset: 60 * time.Second, Stop: true})
		},
	}
	for name, ext := range extend {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100}, Tier{Kind: KindAdaptive, PerMS: 10_000})
			s, err := SuspendKey(e.ctx, e.run, e.k, 2*time.Second, time.Hour)
			require.NoError(t, err)
			require.InDelta(t, 0.5, s.Factor, 1e-9)
			e.at(time.Second)
			ext(e) // suspended until 61 s
			require.Equal(t, 60*time.Second, e.inspect().Suspended)

			e.at(45 * time.Second)
			assert.InDelta(t, 0.5, e.inspect().AdaptiveFactor, 1e-9, "still suspended: no clean interval yet")
			e.at(61*time.Second + 10*time.Second)
			assert.InDelta(t, 0.6, e.inspect().AdaptiveFactor, 1e-9, "one clean interval after the extended end")
			assert.Equal(t, int64(60), e.inspect().Tiers[0].Rate)
		})
	}
}

// A burst told from a provider's floored remaining is what its bucket
// holds or one below: told one below the burst in force at the same quota,
// the key keeps the higher (the bursts told converge up to the bucket);
// told two below, or a higher one, it takes what it is told.
func TestObserveLearnedBurstKeepsTheHigherWithinRounding(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 10000, PerMS: 60_000, Burst: 10000})
	told := func(b int64) int64 {
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 1000, PerMS: 60_000, Burst: b}}})
		return e.inspect().Tiers[0].Burst
	}
	assert.Equal(t, int64(15), told(15), "first told")
	assert.Equal(t, int64(16), told(16), "a higher one is taken")
	assert.Equal(t, int64(16), told(15), "one below: rounding, the higher kept")
	assert.Equal(t, int64(16), told(16))
	assert.Equal(t, int64(14), told(14), "two below: the bucket shrank")
	assert.Equal(t, int64(1000), e.inspect().Tiers[0].Rate)
	// At another quota the burst told is taken as it is.
	e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 900, PerMS: 60_000, Burst: 13}}})
	assert.Equal(t, int64(13), e.inspect().Tiers[0].Burst, "a new quota: no rounding band")
}

// A burst told within rounding below the key's own burst (one, or 1 % of
// it) is the provider's rounding of that same bucket: nothing is learned
// and the limits' generation stays (a change of generation would cost the
// refunds of every call under way).
func TestObserveBurstWithinRoundingOfTheKeysIsNothing(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 1000, PerMS: 60_000, Burst: 1000}, Tier{Rate: 16, PerMS: 1000, Burst: 16})
	gen := e.inspect().Generation
	assert.Empty(t, e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 1000, PerMS: 60_000, Burst: 999}}}))
	r := e.inspect()
	assert.Equal(t, int64(1000), r.Tiers[0].Burst)
	assert.Equal(t, gen, r.Generation, "no change of limits")
	assert.Empty(t, e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 16, PerMS: 1000, Burst: 15}}}), "one below 16: rounding")
	assert.Equal(t, []string{"burst 1 14 16 1000"},
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 16, PerMS: 1000, Burst: 14}}}))
	assert.Equal(t, int64(14), e.inspect().Tiers[1].Burst, "two below: learned")
	assert.Empty(t, e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 1000, PerMS: 60_000, Burst: 990}}}), "within 1 %")
	assert.Equal(t, []string{"burst 0 989 1000 60000"},
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 1000, PerMS: 60_000, Burst: 989}}}))
}

// A large bucket's burst, told from every response with a reset to the
// millisecond, moves by tens of tokens from one response to the next: it
// is learned once and kept while the bursts told stay within 1 % of it,
// with no new generation each time.
func TestObserveLargeLearnedBurstIgnoresRoundingJitter(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 20_000_000, PerMS: 60_000, Burst: 20_000_000, Unit: "tokens"})
	told := func(b int64) []string {
		return e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 2_000_000, PerMS: 60_000, Unit: "tokens", Burst: b}}})
	}
	assert.Equal(t, []string{"learned 0 2000000 20000000 60000"}, told(1_999_967), "a bucket of the quota, rounded")
	gen := e.inspect().Generation
	for _, b := range []int64{2_000_000, 1_999_933, 2_000_010, 1_980_000} {
		assert.Empty(t, told(b), "%d: the same bucket", b)
	}
	r := e.inspect()
	assert.Equal(t, int64(2_000_000), r.Tiers[0].Burst)
	assert.Equal(t, gen, r.Generation, "no new generation")
	assert.Equal(t, []string{"learned 0 2000000 20000000 60000", "burst 0 1950000 20000000 60000"}, told(1_950_000), "more than 1 % below: learned")
	gen = e.inspect().Generation
	for _, b := range []int64{1_950_000, 1_931_000, 1_969_000} {
		assert.Empty(t, told(b), "%d: the same bucket", b)
	}
	r = e.inspect()
	assert.Equal(t, int64(1_950_000), r.Tiers[0].Burst, "kept")
	assert.Equal(t, gen, r.Generation, "no new generation")
}

// Observe bringing a unit's bucket down keeps what refunds are bounded by
// (M): a call under way when a response said less was left still gets
// back what it did not use.
func TestObserveLoweringKeepsRefunds(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 60_000, PerMS: 60_000, Burst: 60_000, Unit: "tokens"})
	a := DecideArgs{Units: "tokens=2000"}
	first := e.decide(a) // from a full bucket: M starts at its instant
	require.Equal(t, StatusAllowed, first.Status)
	for range 20 {
		require.Equal(t, StatusAllowed, e.decide(a).Status)
	}
	e.at(100 * time.Millisecond)
	call := e.decide(a)
	require.Equal(t, StatusAllowed, call.Status)
	e.at(200 * time.Millisecond)
	e.observe(ObserveArgs{Remaining: -1, Left: []UnitLeft{{Unit: "tokens", WindowMS: 60_000, Remaining: 10_000}}})
	before := e.inspect().Tokens[0]
	require.InDelta(t, 10_000, before, 1e-6, "brought down to what the provider said")
	e.at(300 * time.Millisecond)
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -1500, Call{At: call.At, Charged: 2000, Generation: call.Generation, Unit: "tokens"}, nil))
	assert.InDelta(t, before+100+1500, e.inspect().Tokens[0], 1e-6, "100 refilled, and the 1,500 not used given back")
}

// A change of limits learned from a response starts M afresh: a call
// admitted after it gets back what it did not use, whatever the bucket
// owed under the limits before (a key 10x too high owed little of its
// burst).
func TestObserveRelearnedStartsRefundsAfresh(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 600_000, PerMS: 60_000, Burst: 600_000, Unit: "tokens"}) // 10x
	small := DecideArgs{Units: "tokens=100"}
	for i := range 2 {
		e.at(time.Duration(i) * time.Millisecond)
		require.Equal(t, StatusAllowed, e.decide(small).Status) // M's least: about 100 owed
	}
	e.at(2 * time.Millisecond)
	e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 60_000, PerMS: 60_000, Unit: "tokens"}}})
	a := DecideArgs{Units: "tokens=2000"}
	for i := range 20 {
		e.at(time.Duration(3+i) * time.Millisecond)
		require.Equal(t, StatusAllowed, e.decide(a).Status)
	}
	e.at(30 * time.Millisecond)
	call := e.decide(a)
	require.Equal(t, StatusAllowed, call.Status)
	e.at(2 * time.Second) // 2,000 refilled since: the refill rule gives nothing back
	before := e.inspect().Tokens[0]
	require.NoError(t, Adjust(e.ctx, e.run, e.k, -1900, Call{At: call.At, Charged: 2000, Generation: call.Generation, Unit: "tokens"}, nil))
	assert.InDelta(t, before+1900, e.inspect().Tokens[0], 1e-6, "all 1,900 back: the bucket owed more than that all the time since the call")
}

// A window tier learns a published quota, with or without a burst told
// (a window has none).
func TestObserveWindowLearnsAQuota(t *testing.T) {
	for _, burst := range []int64{0, 5} {
		e := newEnv(t)
		e.setLimits(Tier{Kind: KindWindow, Rate: 100, PerMS: 1000})
		assert.Equal(t, []string{"learned 0 10 100 1000"},
			e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 10, PerMS: 1000, Burst: burst}}}))
		assert.Equal(t, int64(10), e.inspect().Tiers[0].Rate)
	}
}

// A published quota for a period the key has no tier of binds the tier of
// the nearest period, converted to it (issue 29, item 10): limits set 10x
// too high as per-second tiers learn a provider's per-minute quota, from a
// bucket holding a second, in requests and in tokens alike; a quota per
// second binds a per-minute tier at sixty times it, holding no more than
// the per-second quota at once.
func TestObserveConvertsAQuotaOfAnotherPeriodToTheNearestTier(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 400, PerMS: 1000, Burst: 400}, Tier{Rate: 20_000, PerMS: 1000, Burst: 20_000, Unit: "tokens"})
	got := e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{
		{Quota: 2400, PerMS: 60_000, Burst: 40}, {Quota: 120_000, PerMS: 60_000, Unit: "tokens", Burst: 2000}}})
	assert.Equal(t, []string{"converted 0 40 400 1000 2400 60000", "converted 1 2000 20000 1000 120000 60000"}, got)
	r := e.inspect()
	assert.Equal(t, Tier{Rate: 40, PerMS: 1000, Burst: 40}, r.Tiers[0], "2,400/min in force as 40/s")
	assert.Equal(t, Tier{Rate: 2000, PerMS: 1000, Burst: 2000, Unit: "tokens"}, r.Tiers[1], "120,000 tokens/min in force as 2,000/s")
	assert.Equal(t, Tier{Rate: 400, PerMS: 1000, Burst: 400}, r.Configured[0], "the ceiling stays")

	// Per second into a tier per minute: 60x, holding 10 at once.
	e2 := newEnv(t)
	e2.setLimits(Tier{Rate: 1000, PerMS: 60_000, Burst: 1000}, Tier{Rate: 100_000, PerMS: 3_600_000, Burst: 100_000})
	assert.Equal(t, []string{"converted 0 600 1000 60000 10 1000", "burst 0 10 1000 60000"},
		e2.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 10, PerMS: 1000}}}))
	r = e2.inspect()
	assert.Equal(t, Tier{Rate: 600, PerMS: 60_000, Burst: 10}, r.Tiers[0])
	assert.Equal(t, Tier{Rate: 100_000, PerMS: 3_600_000, Burst: 100_000}, r.Tiers[1], "only the nearest period is bound")

	// The strictest of what one response says binds a tier: a quota of its
	// own period, and a converted one above it, do not undo it.
	e3 := newEnv(t)
	e3.setLimits(Tier{Rate: 100, PerMS: 1000, Burst: 100})
	assert.Equal(t, []string{"learned 0 50 100 1000"},
		e3.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 50, PerMS: 1000}, {Quota: 6000, PerMS: 60_000}}}))
	assert.Equal(t, int64(50), e3.inspect().Tiers[0].Rate)
}

// A quota too small to be said in the nearest tier's period (2 a minute
// against a tier per second: 0.03 a second) is not mapped, and reported:
// rounded up to one a second, the tier would admit 60 a minute.
func TestObserveLeavesAQuotaTooSmallForTheNearestTierUnmapped(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 2, PerMS: 1000, Burst: 2})
	assert.Equal(t, []string{"unmapped 60000 2 requests 1000"},
		e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 2, PerMS: 60_000}}}))
	assert.Equal(t, Tier{Rate: 2, PerMS: 1000, Burst: 2}, e.inspect().Tiers[0], "nothing learned")
}

// A queue of reservations booked under a learned rate is respaced when a
// later response changes that rate: the bookings after it are spaced at
// the rate in force (issue 29's combined model, a liveness case its soak
// found). On 12 a minute (burst 2), learned down to 2 a minute: the
// bucket emptied at 0, t3 (cost 1) books 30 s, 2 a minute's next token.
// The provider then says 8 a minute: what the schedule owes past the
// queue's end (31 s: t3's instant and a granule), 59 s at 2 a minute, is
// 14.75 s at 8, and t2 (cost 2, the whole burst) books 45.75 s, on the
// whole second 46 s. Left at 2 a minute's spacing, the schedule booked t2
// at 90 s.
func TestObserveRespacesAQueueBookedUnderALearnedRate(t *testing.T) {
	e := newEnv(t)
	e.setLimits(Tier{Rate: 12, PerMS: 60_000, Burst: 2})
	e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 2, PerMS: 60_000}}})
	book := func(id string, cost int) time.Duration {
		t.Helper()
		r := e.decide(DecideArgs{TaskID: id, Cost: cost, Horizon: 2 * time.Minute, Lapse: time.Minute, Granule: time.Second})
		require.Equal(t, StatusDenied, r.Status, "%s: %+v", id, r)
		return r.Reserved.Sub(testEpoch())
	}
	require.Equal(t, StatusAllowed, e.decide(DecideArgs{Cost: 2}).Status)
	assert.Equal(t, 30*time.Second, book("t3", 1), "2 a minute: a token in 30 s")
	e.observe(ObserveArgs{Remaining: -1, Policies: []Policy{{Quota: 8, PerMS: 60_000}}})
	require.Equal(t, int64(8), e.inspect().Tiers[0].Rate, "8 a minute in force")
	assert.Equal(t, 46*time.Second, book("t2", 2), "the schedule past t3 respaced to 8 a minute")
}
