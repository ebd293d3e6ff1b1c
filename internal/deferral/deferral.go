// Package deferral is the contract between the throttle middleware and the
// worker package: the error a deferred task returns, and the context mark that
// tells the middleware the server was built by worker.NewServer, so the
// error's atomic retry path is safe to use.
package deferral

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Error is returned by the middleware for a deferred task under
// worker.NewServer: not a failure, retried after Delay.
type Error struct {
	Key    string
	Reason string
	Delay  time.Duration
}

// Error says how long the task is deferred and why.
func (e *Error) Error() string {
	return fmt.Sprintf("throttle: task deferred %v: key %q %s", e.Delay.Round(time.Millisecond), e.Key, e.Reason)
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
