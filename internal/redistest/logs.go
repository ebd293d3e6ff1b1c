package redistest

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// RouteRedisLogs replaces go-redis's logger, which prints to stderr, with
// one that gives each line naming the address of a server this package
// started to the test that started it: the test logs, when the server is
// cleaned up, how many lines go-redis printed about it and the first one.
// A test that kills or pauses its Redis makes every client of it log each
// failed dial ("connection refused"), dozens of lines that would otherwise
// land in the middle of whatever other test fails at the time. Lines that
// name no such server still go to stderr, as go-redis prints them.
//
// go-redis's logger is global to the process: call RouteRedisLogs from
// TestMain, before m.Run, and do not replace the logger in a test.
func RouteRedisLogs() {
	redis.SetLogger(routes)
}

// routes is the logger RouteRedisLogs installs, and the servers it routes
// lines for. It is global because go-redis's logger is.
var routes = &logRouter{byAddr: map[string]*logRoute{}}

type logRouter struct {
	mu     sync.Mutex
	byAddr map[string]*logRoute
	stderr *log.Logger // made on first use
}

// logRoute is what go-redis printed about one server.
type logRoute struct {
	lines int
	first string
}

// Printf routes one go-redis log line.
func (r *logRouter) Printf(_ context.Context, format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, rt := range r.byAddr {
		if names(line, addr) {
			if rt.lines == 0 {
				rt.first = line
			}
			rt.lines++
			return
		}
	}
	if r.stderr == nil {
		r.stderr = log.New(os.Stderr, "redis: ", log.LstdFlags)
	}
	r.stderr.Print(line)
}

// watch routes the lines that name s.Addr to t until t's cleanup, which
// then reports them. Cleanups run last in, first out: registered before
// the server's Stop, this runs after it, and after the clients made later.
func (r *logRouter) watch(t testing.TB, s *Server) {
	r.mu.Lock()
	rt := &logRoute{}
	r.byAddr[s.Addr] = rt
	r.mu.Unlock()
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.byAddr[s.Addr] == rt {
			delete(r.byAddr, s.Addr)
		}
		if rt.lines > 0 {
			t.Logf("redistest: go-redis logged %d line(s) about %s (its clients while it was down or paused); the first: %s", rt.lines, s.Addr, rt.first)
		}
	})
}

// names reports whether line names addr ("127.0.0.1:6379"), not merely a
// longer port that starts with the same digits.
func names(line, addr string) bool {
	for i := strings.Index(line, addr); i >= 0; {
		end := i + len(addr)
		if end == len(line) || line[end] < '0' || line[end] > '9' {
			return true
		}
		j := strings.Index(line[end:], addr)
		if j < 0 {
			return false
		}
		i = end + j
	}
	return false
}
