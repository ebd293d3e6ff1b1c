// Package jitter spreads retry times so that a crowd of deferred tasks does
// not come back in lockstep. Jitter is only ever added: a task never comes
// back earlier than the retry-after it was given.
package jitter

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Jitter adds a random delay in [0, spread] to a duration, where spread is
// Fraction of the duration clamped to [Min, Max]. It is safe for concurrent use.
type Jitter struct {
	mu       sync.Mutex
	r        *rand.Rand
	min, max time.Duration
	fraction float64
}

// New returns a Jitter drawing from src (tests pass a seeded source). A nil
// src means a randomly seeded PCG. min and max bound the spread; fraction is
// the spread relative to the duration being jittered (0.1 = up to 10 % later).
func New(src rand.Source, min, max time.Duration, fraction float64) *Jitter {
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	if max < min {
		max = min
	}
	return &Jitter{r: rand.New(src), min: min, max: max, fraction: fraction}
}

// Spread returns the largest jitter Add may add to d.
func (j *Jitter) Spread(d time.Duration) time.Duration {
	s := time.Duration(float64(d) * j.fraction)
	if s < j.min {
		s = j.min
	}
	if s > j.max {
		s = j.max
	}
	return s
}

// Add returns d plus a uniformly random jitter in [0, Spread(d)]. It never
// returns less than d (negative d counts as 0).
func (j *Jitter) Add(d time.Duration) time.Duration {
	if d < 0 {
		d = 0
	}
	s := j.Spread(d)
	if s <= 0 {
		return d
	}
	j.mu.Lock()
	x := time.Duration(j.r.Int64N(int64(s) + 1))
	j.mu.Unlock()
	return d + x
}
