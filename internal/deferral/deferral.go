// Package deferral is the contract between the throttle middleware and the
// worker package: the error a deferred task returns, and the context mark that
// tells the middleware the server was built by worker.NewServer, so the
// error's atomic retry path is safe to use.
package deferral

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Error is returned by the middleware for a deferred task under
// worker.NewServer: not a failure, retried after Delay.
type Error struct {
	Key    string
	Reason string
	Delay  time.Duration
}

// prefix starts every deferral's message; asynq keeps the message as the
// task's last error, where Parse finds it again.
const prefix = "throttle: task deferred "

// Error says how long the task is deferred and why.
func (e *Error) Error() string {
	return fmt.Sprintf("%s%v: key %q %s", prefix, e.Delay.Round(time.Millisecond), e.Key, e.Reason)
}

// Parse reads the key and reason back from a deferral's message (a task's
// last error in asynq).
func Parse(msg string) (key, reason string, ok bool) {
	rest, found := strings.CutPrefix(msg, prefix)
	if !found {
		return "", "", false
	}
	i := strings.Index(rest, `: key "`)
	if i < 0 {
		return "", "", false
	}
	rest = rest[i+len(": key "):]
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", false
	}
	key, err = strconv.Unquote(q)
	if err != nil {
		return "", "", false
	}
	return key, strings.TrimPrefix(rest[len(q):], " "), true
}

// As returns the deferral in err's chain.
func As(err error) (*Error, bool) {
	var d *Error
	ok := errors.As(err, &d)
	return d, ok
}

type markKey struct{}

// Mark marks a context as coming from a worker.NewServer server.
func Mark(ctx context.Context) context.Context { return context.WithValue(ctx, markKey{}, true) }

// Marked reports whether ctx was marked.
func Marked(ctx context.Context) bool {
	v, _ := ctx.Value(markKey{}).(bool)
	return v
}
