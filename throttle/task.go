package throttle

import (
	"fmt"
	"strings"

	"github.com/hibiken/asynq"
)

// Task headers the middleware reads and writes.
const (
	// HeaderKey carries the limiter key of a task (set by Key through NewTask).
	HeaderKey = "throttle-key"
	// HeaderOrigin carries the ID of the task a deferred copy was made from,
	// so the copy keeps the original's reservation.
	HeaderOrigin = "throttle-origin"
	// HeaderDeferrals counts how many times a task was deferred by copy.
	HeaderDeferrals = "throttle-deferrals"
	// HeaderCopyOf carries the ID of the task a deferred copy was made from
	// (the task it replaces, where HeaderOrigin names the first of a chain).
	HeaderCopyOf = "throttle-copy-of"
	// HeaderDeferredKey and HeaderDeferredReason say which key deferred a
	// copy, and why ("suspended", "tier", ...).
	HeaderDeferredKey    = "throttle-deferred-key"
	HeaderDeferredReason = "throttle-deferred-reason"
	// HeaderRetried counts the retries the tasks before a copy spent: a
	// copy's MaxRetry is what is left of the original's.
	HeaderRetried = "throttle-retried"
)

// keyOption is the asynq.Option returned by Key.
type keyOption string

// optionTypeKey is outside asynq's own option types, which asynq's client
// switches on: it ignores this option, which is why Key must go through NewTask.
const optionTypeKey asynq.OptionType = 1 << 20

// String, Type and Value make Key an asynq.Option.
func (k keyOption) String() string         { return fmt.Sprintf("throttle.Key(%q)", string(k)) }
func (k keyOption) Type() asynq.OptionType { return optionTypeKey }
func (k keyOption) Value() interface{}     { return string(k) }

// Key names the limiter key a task is throttled under, e.g. Key("slack").
//
// Pass it to NewTask, which stores it in the task's headers. asynq drops
// options it does not know: a Key passed straight to asynq.Client.Enqueue
// or asynq.NewTask vanishes without an error and the task is throttled by its
// type prefix instead (see WithKeyFunc).
func Key(name string) asynq.Option { return keyOption(name) }

// NewTask returns an asynq task whose headers carry the Key among opts; all
// other options are kept on the task as asynq.NewTask would.
func NewTask(typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	headers := map[string]string{}
	rest := make([]asynq.Option, 0, len(opts))
	for _, o := range opts {
		if k, ok := o.(keyOption); ok {
			headers[HeaderKey] = string(k)
			continue
		}
		rest = append(rest, o)
	}
	return asynq.NewTaskWithHeaders(typename, payload, headers, rest...)
}

// KeyOf returns the key in t's headers ("" if none).
func KeyOf(t *asynq.Task) string { return t.Headers()[HeaderKey] }

// keyOf picks the key of a task: its header, else the key function, else the
// type prefix before ':'. A header key that is invalid is an error (the
// enqueuer's bug, reported on the task); a derived key that is invalid means
// "unthrottled".
func (o *options) keyOf(t *asynq.Task) (string, error) {
	if k, ok := t.Headers()[HeaderKey]; ok {
		if err := ValidateKey(k); err != nil {
			return "", fmt.Errorf("throttle: task type %q: header %s: %w", t.Type(), HeaderKey, err)
		}
		return k, nil
	}
	var k string
	if o.keyFunc != nil {
		k = o.keyFunc(t)
	} else if i := strings.IndexByte(t.Type(), ':'); i > 0 {
		k = t.Type()[:i]
	}
	if k != "" && ValidateKey(k) != nil {
		return "", nil
	}
	return k, nil
}
