// Command asynq-throttle operates asynq-throttle's limits in Redis: list the
// keys, read and change their limits and their tenants' weights, suspend
// and resume them, watch them live, explain why a task waits, and serve
// the web view with /metrics.
//
//	asynq-throttle --redis redis://localhost:6379/0 list
//	asynq-throttle set slack 10/s:burst=20 50/m
//	asynq-throttle set github 5000/h:window 10/s
//	asynq-throttle set stripe 25/s 4:inflight
//	asynq-throttle set openai 500/m 30000/m:tokens 16:inflight
//	asynq-throttle weights llm enterprise=3 pro=2
//	asynq-throttle suspend slack 30s
//	asynq-throttle why 5f1c0e6a-... --queue default
//	asynq-throttle serve                  # on 127.0.0.1:8080
//
// Exit codes: 0 success, 1 the command failed (Redis unreachable, task not
// found, ...), 2 bad usage (unknown command or flag, bad argument).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	redis.SetLogger(redisLog{os.Stderr})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// redisLog passes what go-redis logs on to stderr, but for its failed
// dials, which the command reports itself, once, as "cannot reach Redis".
// Anything else go-redis says (a connection closed under it, a protocol
// surprise) shows, as it would in any program using the library.
type redisLog struct{ w io.Writer }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "failed to dial") {
		return
	}
	fmt.Fprintf(l.w, "asynq-throttle: go-redis: %s\n", msg)
}
