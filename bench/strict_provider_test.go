package main

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// at is a fixed instant on a whole second, so that windows align with it.
var at = time.Unix(1_796_040_000, 0)

func TestWindowModelAnswersLikeGitHub(t *testing.T) {
	m := &windowModel{n: 3, w: 2 * time.Second}
	for i := range 3 {
		h := http.Header{}
		require.True(t, m.serve(at.Add(time.Duration(i)*100*time.Millisecond), h), "call %d", i)
		assert.Equal(t, strconv.Itoa(2-i), h.Get("X-RateLimit-Remaining"))
		assert.Equal(t, strconv.Itoa(i+1), h.Get("X-RateLimit-Used"))
		assert.Equal(t, strconv.FormatInt(at.Unix()+2, 10), h.Get("X-RateLimit-Reset"), "the window's end, a Unix time")
	}
	h := http.Header{}
	assert.False(t, m.serve(at.Add(1999*time.Millisecond), h), "a 4th call in the window")
	assert.Equal(t, "0", h.Get("X-RateLimit-Remaining"))
	assert.Empty(t, h.Get("Retry-After"), "GitHub's primary limit says only the reset")
	assert.True(t, m.serve(at.Add(2*time.Second), http.Header{}), "the next window")
}

func TestWindowModelHalvesItsIETFQuota(t *testing.T) {
	m := &windowModel{n: 4, w: time.Second, ietf: true, halveAt: at.Add(time.Second)}
	h := http.Header{}
	require.True(t, m.serve(at.Add(300*time.Millisecond), h))
	assert.Equal(t, `"default";q=4;w=1`, h.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=3;t=1`, h.Get("RateLimit"))
	n := 0
	for i := range 10 {
		if m.serve(at.Add(time.Second+time.Duration(i)*time.Millisecond), http.Header{}) {
			n++
		}
	}
	assert.Equal(t, 2, n, "halved: 2 per window")
	h = http.Header{}
	require.False(t, m.serve(at.Add(1500*time.Millisecond), h))
	assert.Equal(t, `"default";q=2;w=1`, h.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=0;t=1`, h.Get("RateLimit"))
	assert.Equal(t, "1", h.Get("Retry-After"))
}

// TestSlidingModelNeverExceeds: whatever the call times, no window of
// length w holds more than n admitted calls, and a refused call was refused
// only with n calls in the window.
func TestSlidingModelNeverExceeds(t *testing.T) {
	const n, w = 5, time.Second
	m := &slidingModel{n: n, w: w}
	rng := rand.New(rand.NewPCG(1, 2))
	now := at
	var admitted []time.Time
	for range 2000 {
		now = now.Add(time.Duration(rng.IntN(120)) * time.Millisecond)
		inWindow := 0
		for _, a := range admitted {
			if now.Sub(a) < w {
				inWindow++
			}
		}
		h := http.Header{}
		ok := m.serve(now, h)
		require.Equal(t, inWindow < n, ok, "at %v with %d in the window", now.Sub(at), inWindow)
		if ok {
			admitted = append(admitted, now)
		} else {
			require.NotEmpty(t, h.Get("Retry-After"))
		}
	}
}

func TestBucketModelAdmitsItsBurstThenItsRate(t *testing.T) {
	m := newBucketModel(10, 5, at)
	for i := range 5 {
		require.True(t, m.serve(at, http.Header{}), "burst call %d", i)
	}
	h := http.Header{}
	require.False(t, m.serve(at, h))
	assert.Equal(t, "1", h.Get("Retry-After"))
	assert.True(t, m.serve(at.Add(100*time.Millisecond), http.Header{}), "one token per 100 ms")
	assert.False(t, m.serve(at.Add(150*time.Millisecond), http.Header{}))
}

func TestAnalyzeEMeasuresTheShareOfTheQuota(t *testing.T) {
	calls := func(every time.Duration, from, to time.Duration) []callRecord {
		var out []callRecord
		for d := from; d < to; d += every {
			out = append(out, callRecord{at: at.Add(d), ok: true})
		}
		return out
	}
	end := at.Add(8 * time.Second)
	fixed := providerSpec{Kind: kindFixed, Quota: 100, Window: 2 * time.Second}
	r := analyzeE(fixed, calls(20*time.Millisecond, 0, 8*time.Second), at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 1.0, r.Share, 1e-9, "50/s is all of 100 per 2 s")
	assert.Equal(t, 400, r.Admitted)

	bucket := providerSpec{Kind: kindBucket, Quota: 50, Window: time.Second, Burst: 50}
	// The burst at once, then 50/s: the rate.
	cs := append(calls(time.Nanosecond, 0, 50), calls(20*time.Millisecond, 0, 8*time.Second)...)
	r = analyzeE(bucket, cs, at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 1.0, r.Share, 0.01)
	// Nothing until 3 s, then the burst saved since 2 s at once and 25/s:
	// 175 calls in the 6 s measured, a second's tokens wasted while full.
	cs = append(calls(time.Nanosecond, 3*time.Second, 3*time.Second+50), calls(40*time.Millisecond, 3*time.Second, 8*time.Second)...)
	r = analyzeE(bucket, cs, at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 175.0/300, r.Share, 0.01, "the calls made in the span")
	// Full when the span starts (a slow warm-up), its burst spent at once,
	// then the rate: the burst saved before the span does not count.
	cs = append(calls(time.Nanosecond, 2*time.Second, 2*time.Second+50), calls(20*time.Millisecond, 2*time.Second, 8*time.Second)...)
	r = analyzeE(bucket, cs, at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 1.0, r.Share, 0.01, "the rate, not the rate and the saved burst")
	// A stall of the warm-up's second second, then just under the rate
	// (49/s): the fleet never empties the bucket again. (Measured from the
	// first emptying, such a run scored 0.49, and 0.00 when the bucket
	// emptied in the run's last moments.)
	cs = append(calls(time.Second/50, 0, time.Second), calls(time.Second/49, 2*time.Second, 8*time.Second)...)
	r = analyzeE(bucket, cs, at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 0.98, r.Share, 0.01, "49/s of 50/s")
	// The rate, but no call for one second in the middle of the span.
	cs = append(calls(20*time.Millisecond, 0, 4*time.Second), calls(20*time.Millisecond, 5*time.Second, 8*time.Second)...)
	r = analyzeE(bucket, cs, at, end, 2*time.Second, time.Time{})
	assert.InDelta(t, 5.0/6, r.Share, 0.01, "a lost second of six")
	assert.Less(t, r.Share, eRunFloor, "a lost second is below the floor")

	ietf := providerSpec{Kind: kindIETF, Quota: 60, Window: time.Second}
	halved := at.Add(4 * time.Second)
	cs = calls(time.Second/60, 0, 4*time.Second)
	cs = append(cs, callRecord{at: halved.Add(300 * time.Millisecond)}, callRecord{at: halved.Add(500 * time.Millisecond)})
	cs = append(cs, calls(time.Second/30, 5*time.Second, 8*time.Second)...)
	r = analyzeE(ietf, cs, at, end, 2*time.Second, halved)
	assert.Equal(t, 0, r.LimitedBefore)
	assert.Equal(t, 2, r.LimitedAfter)
	assert.True(t, r.Obeyed)
	assert.Equal(t, 500*time.Millisecond, r.ObeyAfter, "from the halving to its last 429")
	assert.InDelta(t, 1.0, r.ShareBefore, 0.02)
	assert.InDelta(t, 1.0, r.ShareAfter, 0.02)
}

func TestAlignedWindowsSpanWholeWindowsOnly(t *testing.T) {
	a, b := alignedWindows(at.Add(300*time.Millisecond), at.Add(7900*time.Millisecond), 2*time.Second)
	assert.Equal(t, at.Add(2*time.Second), a)
	assert.Equal(t, at.Add(6*time.Second), b)
	a, b = alignedWindows(at.Add(300*time.Millisecond), at.Add(time.Second), 2*time.Second)
	assert.Equal(t, a, b, "no whole window: an empty span")
}
