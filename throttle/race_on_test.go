//go:build race

package throttle_test

// raceOn says the race detector instruments this test binary: the property
// tests, whose scripts run in miniredis's Lua (Go code, instrumented),
// take several times as long per check, and run fewer (see racedChecks).
const raceOn = true
