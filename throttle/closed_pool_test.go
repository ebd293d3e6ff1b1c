package throttle_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// stderrLogger is go-redis's default logger again, after a test replaced it.
type stderrLogger struct{}

func (stderrLogger) Printf(_ context.Context, format string, v ...any) {
	log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile).Output(2, fmt.Sprintf(format, v...))
}

// logCapture collects what go-redis logs.
type logCapture struct {
	mu    sync.Mutex
	lines []string
}

func (l *logCapture) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

// A program that stops using a Limiter (as a worker does at shutdown:
// ByProvider gives it no Close) and then closes its Redis client makes
// go-redis log nothing. (Regression: the flight's idle timer gave its kept
// connection back 250 ms after the last lone decision, into the closed
// pool, and go-redis logged "Unexpected conn[N] state changed by hook to
// CLOSED, closing it", 32 times in one run of bench scenarios B and C.)
func TestClosingTheClientAfterALimiterLogsNothing(t *testing.T) {
	logs := &logCapture{}
	redis.SetLogger(logs) // (go-redis's logger is global: no t.Parallel here)
	t.Cleanup(func() { redis.SetLogger(stderrLogger{}) })
	mr := miniredis.RunT(t)
	// As a production client: context deadlines honoured, a pool >= 8.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, PoolSize: 10})
	lim := throttle.NewLimiter(rdb) // what ByProvider makes
	ctx := context.Background()
	require.NoError(t, lim.SetLimits(ctx, "slack", throttle.PerSecond(10)))
	_, err := lim.Take(ctx, "slack") // a lone decision: the flight keeps a connection
	require.NoError(t, err)
	require.NoError(t, rdb.Close())    // the program shuts down within 250 ms
	time.Sleep(400 * time.Millisecond) // the idle timer gives the connection back
	logs.mu.Lock()
	defer logs.mu.Unlock()
	// go-redis's logger serves the whole process: a parallel test's server,
	// stopped, makes its clients log their dials ("dial tcp ADDR"). Only
	// what names this test's server, or no server, is this client's.
	var ours []string
	for _, line := range logs.lines {
		if !strings.Contains(line, "dial tcp ") || strings.Contains(line, mr.Addr()) {
			ours = append(ours, line)
		}
	}
	assert.Empty(t, ours, "go-redis logged:\n%s", strings.Join(ours, "\n"))
}
