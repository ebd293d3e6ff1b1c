//go:build !race

package lua

// raceOn says the race detector instruments this test binary (see
// race_on_test.go).
const raceOn = false
