//go:build !race

package main

// raceFlag builds the README's program as this test binary was built, so
// that go build finds its dependencies compiled in the cache.
var raceFlag []string
