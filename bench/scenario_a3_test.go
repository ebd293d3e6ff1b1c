package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSmallCaseReportsOrderRateAndIdealTime(t *testing.T) {
	s := time.Second
	tests := []struct {
		name  string
		c     smallCase
		late  int
		rate  float64
		ideal time.Duration
	}{
		{"in order at the rate", smallCase{Rate: 1, Tasks: 4, Order: []int{0, 1, 2, 3}, At: []time.Duration{0, s, 2 * s, 3 * s}, Elapsed: 3 * s}, 0, 1, 3 * s},
		{"reordered within a second", smallCase{Rate: 5, Tasks: 7, Order: []int{4, 2, 0, 1, 3, 6, 5}, At: []time.Duration{0, 0, 0, 0, 0, s / 5, s / 2}, Elapsed: s / 2}, 0, 4, 2 * s / 5},
		{"issue 20's D1 order", smallCase{Rate: 1, Tasks: 4, Order: []int{0, 2, 3, 1}, At: []time.Duration{0, 2 * s, 4 * s, 6 * s}, Elapsed: 6 * s}, 1, 0.5, 3 * s},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.late, tt.c.outOfOrder(), "outOfOrder of %v at %v", tt.c.Order, tt.c.At)
			assert.InDelta(t, tt.rate, tt.c.achieved(), 1e-9, "achieved")
			assert.Equal(t, tt.ideal, tt.c.ideal(), "ideal")
		})
	}
}
