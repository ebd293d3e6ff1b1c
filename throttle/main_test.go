package throttle_test

import (
	"os"
	"testing"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// TestMain runs the parallel tests of this package (the ones that wait on
// real Redis servers, clusters and timeouts) four at a time unless
// -parallel says otherwise.
func TestMain(m *testing.M) {
	redistest.RaiseParallel(4)
	os.Exit(m.Run())
}
