package redistest

import (
	"flag"
	"strconv"
)

// RaiseParallel makes a test binary run up to n parallel tests at once
// (t.Parallel) unless -test.parallel was given, and not fewer than it
// would anyway (GOMAXPROCS). Call it from TestMain before m.Run: tests that
// wait on real Redis servers and fleets use little CPU while they wait,
// and the default runs only GOMAXPROCS of them at a time.
func RaiseParallel(n int) {
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	set := false
	flag.Visit(func(v *flag.Flag) { set = set || v.Name == "test.parallel" })
	if cur, err := strconv.Atoi(f.Value.String()); set || err != nil || cur >= n {
		return
	}
	_ = f.Value.Set(strconv.Itoa(n))
}
