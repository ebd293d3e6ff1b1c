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
	// Until is when the task is due again (wall clock); zero: not known,
	// the message then says Delay.
	Until time.Time
}

// prefix starts every deferral's message. asynq keeps the message as the
// task's last error, shown by asynqmon and the asynq CLI even once the task
// completed: it must read as what it is, not as a failure. Parse finds the
// key and reason in it again.
const prefix = "throttled (not a failure): key "

// Error says which key deferred the task, until when (UTC, to the second:
// asynq's granularity), and why, e.g.
//
//	throttled (not a failure): key "slack" deferred until 2026-12-01T15:04:05Z (tier)
func (e *Error) Error() string {
	when := "for " + e.Delay.Round(time.Millisecond).String()
	if !e.Until.IsZero() {
		when = "until " + e.Until.UTC().Round(time.Second).Format(time.RFC3339)
	}
	return fmt.Sprintf("%s%q deferred %s (%s)", prefix, e.Key, when, e.Reason)
}

// Parse reads the key and reason back from a deferral's message (a task's
// last error in asynq).
func Parse(msg string) (key, reason string, ok bool) {
	rest, found := strings.CutPrefix(msg, prefix)
	if !found {
		return "", "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", false
	}
	key, err = strconv.Unquote(q)
	if err != nil {
		return "", "", false
	}
	rest, found = strings.CutPrefix(rest[len(q):], " deferred ")
	if !found {
		return "", "", false
	}
	// The time or delay holds no " (": the reason is what follows it.
	i := strings.Index(rest, " (")
	if i < 0 || !strings.HasSuffix(rest, ")") || i+2 > len(rest)-1 {
		return "", "", false
	}
	return key, rest[i+2 : len(rest)-1], true
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
