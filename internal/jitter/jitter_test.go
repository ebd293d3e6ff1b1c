package jitter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAddNeverEarlierAndWithinSpread(t *testing.T) {
	j := New(rand.NewPCG(1, 2), 100*time.Millisecond, 5*time.Second, 0.1)
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond, time.Second, time.Minute, time.Hour} {
		base := max(d, 0)
		for range 1000 {
			got := j.Add(d)
			require.GreaterOrEqual(t, got, base, "Add(%v) came back early", d)
			require.LessOrEqual(t, got, base+j.Spread(base), "Add(%v) beyond spread", d)
		}
	}
	assert.Equal(t, 100*time.Millisecond, j.Spread(time.Millisecond), "min bound")
	assert.Equal(t, 3*time.Second, j.Spread(30*time.Second), "fraction")
	assert.Equal(t, 5*time.Second, j.Spread(time.Hour), "max bound")
}

func TestAddSpreadsACrowd(t *testing.T) {
	j := New(rand.NewPCG(3, 4), time.Second, time.Second, 0)
	buckets := make(map[time.Duration]int)
	for range 1000 {
		buckets[(j.Add(10*time.Second)-10*time.Second)/(100*time.Millisecond)]++
	}
	// 1000 draws over 10 buckets of 100 ms: every bucket is hit, none hoards.
	require.GreaterOrEqual(t, len(buckets), 10)
	for b, n := range buckets {
		if b < 10 {
			assert.Less(t, n, 200, "bucket %d has %d of 1000", b, n)
			assert.Greater(t, n, 50, "bucket %d has %d of 1000", b, n)
		}
	}
}

func TestSeededSourceIsDeterministic(t *testing.T) {
	a := New(rand.NewPCG(7, 7), 0, time.Second, 1)
	b := New(rand.NewPCG(7, 7), 0, time.Second, 1)
	for range 100 {
		require.Equal(t, a.Add(time.Second), b.Add(time.Second))
	}
}
