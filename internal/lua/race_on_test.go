//go:build race

package lua

// raceOn says the race detector instruments this test binary: miniredis's
// Lua is Go code, instrumented, and the longest simulations here take
// several times as long; they run a shorter course under it (the suite's
// CI run, .ci/run, uses -race; `go test ./...` runs them whole).
const raceOn = true
