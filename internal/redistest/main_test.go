package redistest_test

import (
	"os"
	"testing"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// TestMain runs this package's parallel tests (failovers that wait on
// timeouts) four at a time unless -parallel says otherwise, and gives what
// go-redis logs about a test's servers (stopped, restarted, failed over) to
// that test.
func TestMain(m *testing.M) {
	redistest.RaiseParallel(4)
	redistest.RouteRedisLogs()
	os.Exit(m.Run())
}
