package main

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMonitorArgsSplitsAQuotedLine(t *testing.T) {
	line := `1796061319.070809 [0 lua] "HSET" "throttle:{soak}:b" "T" "\x00\x10\xa0@\n\\z" "D" "a \"q\""` + "\r\n"
	assert.Equal(t, []string{"HSET", "throttle:{soak}:b", "T", "\x00\x10\xa0@\n\\z", "D", `a "q"`}, monitorArgs(line))
}

// binT writes a T field: ts, x, q, then period and owed per bucket.
func binT(vals ...float64) string {
	b := make([]byte, 0, 8*len(vals))
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// Two tiers: 100/s burst 20 and 4800/min burst 400. The replay counts the
// calls each write admitted from what every tier owes.
func TestAdmissionsAreCountedFromStateWrites(t *testing.T) {
	writes := []stateWrite{
		{at: 10, L: "100/1000/20 4800/60000/400 #1", hasL: true},
		{T: binT(1000000, 0, 0, 1000, 1000000, 60000, 60000000), hasT: true},  // 1 call
		{T: binT(1000500, 0, 0, 1000, 2950000, 60000, 177600000), hasT: true}, // 2 calls, 500 us later
		{at: 1000600, S: "4000000", hasS: true},                               // a suspension
		{T: binT(3000000, 0, 0, 1000, 1000000, 60000, 60000000), hasT: true},  // both refilled, 1 call
		{at: 3000150, L: "200/1000/40 4800/60000/400 #2", T: binT(3000100, 0, 0, 1000, 990000, 60000, 59520000), hasL: true, hasT: true},
		{T: binT(3000200, 0, 0, 1000, 1970000, 60000, 119040000), hasT: true}, // 1 call under the new limits
		{T: binT(3000300, 0, 0, 1000, 1950000, 60000, 118560000), hasT: true}, // 0 calls (refused all)
		{T: binT(3000400, 0, 0, 1000, 2930000, 60000, 178080001), hasT: true}, // tiers disagree
	}
	r, err := admissionsFromWrites(writes)
	require.NoError(t, err)
	assert.Equal(t, []int64{1000000, 1000500, 1000500, 3000000, 3000200, 3000400}, r.admitted)
	assert.Equal(t, []int64{10, 3000100}, r.changes, "MONITOR's time, or T's ts when written")
	assert.Equal(t, [][2]int64{{1000600, 4000000}}, r.suspend)
	assert.Equal(t, 1, r.disagree, "the last write's tiers disagree")
}
