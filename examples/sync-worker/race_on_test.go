//go:build race

package main

// raceOn says the race detector instruments this test binary. The demo's
// Redis is an embedded miniredis, whose Lua is Go code: instrumented, a
// decision's script takes many milliseconds, and the instant it admits a
// call at is read when the script starts. A call can then reach the
// provider later than the 20 ms of headroom, which the lag meter (a sleep
// in the test process) does not see (see raceAllowance).
const raceOn = true
