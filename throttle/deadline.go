package throttle

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is a parent context without a Done channel of its own
// (context.Background, say) given a deadline: Deadline reports it, and Done
// is closed when it passes, so go-redis ends a wait for a pool connection, a
// dial and its retry backoff there, not only socket I/O. Unlike
// context.WithTimeout it is reused from call to call: its timer and, unless
// the deadline fired, its channel are allocated once.
type deadlineCtx struct {
	context.Context // the parent; its Done() is nil

	timer *time.Timer // runs expire at the deadline

	mu       sync.Mutex
	deadline time.Time
	done     chan struct{}
	err      error
}

// start makes d the parent with deadline at. It must not be in use.
func (d *deadlineCtx) start(parent context.Context, at time.Time) {
	d.mu.Lock()
	d.Context = parent
	d.deadline = at
	if d.err != nil || d.done == nil {
		d.done = make(chan struct{})
		d.err = nil
	}
	d.mu.Unlock()
	if d.timer == nil {
		d.timer = time.AfterFunc(time.Until(at), d.expire)
	} else {
		d.timer.Reset(time.Until(at))
	}
}

// stop ends the use of d; its parent is dropped.
func (d *deadlineCtx) stop() {
	d.timer.Stop()
	d.mu.Lock()
	d.Context = nil
	d.deadline = time.Time{}
	d.mu.Unlock()
}

// expire closes Done once the deadline of the current use has passed. A
// run of the timer left over from an earlier use finds the deadline of the
// current one still ahead and does nothing.
func (d *deadlineCtx) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil || d.deadline.IsZero() || time.Now().Before(d.deadline) {
		return
	}
	d.err = context.DeadlineExceeded
	close(d.done)
}

// Deadline returns the deadline of the current use.
func (d *deadlineCtx) Deadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deadline, !d.deadline.IsZero()
}

// Done is closed when the deadline passes.
func (d *deadlineCtx) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

// Err is context.DeadlineExceeded once Done is closed.
func (d *deadlineCtx) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// Value is the parent's.
func (d *deadlineCtx) Value(key any) any {
	d.mu.Lock()
	p := d.Context
	d.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Value(key)
}
