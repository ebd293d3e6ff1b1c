package throttle

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is a parent context given an earlier deadline: Deadline
// reports it, and Done is closed when it passes or when the parent is done,
// so go-redis ends a wait for a pool connection, a dial and its retry
// backoff there, not only socket I/O. Unlike context.WithDeadline (four
// allocations per call), it lives in a pooled call and is reused: its timer
// is reset, its channel kept until it is closed. The timer, and the watch of
// a parent that can be canceled (a handler's context), start only once
// something asks for Done: on the connection a lone decision keeps,
// go-redis never does (it reads Deadline for its socket deadlines), and a
// timer and a watch per decision cost time and allocations for nothing.
type deadlineCtx struct {
	context.Context // the parent

	timer *time.Timer // runs expire at the deadline

	mu        sync.Mutex
	armed     bool   // the timer runs for this use (Done was asked for)
	use       uint64 // counts the uses: a late timer or watch of an old one does nothing
	deadline  time.Time
	done      chan struct{}
	err       error
	stopWatch func() bool // stops the watch of the parent, once Done was asked for
}

// start makes d the parent with deadline at. It must not be in use.
func (d *deadlineCtx) start(parent context.Context, at time.Time) {
	d.mu.Lock()
	d.use++
	d.Context = parent
	d.deadline = at
	if d.err != nil || d.done == nil {
		d.done = make(chan struct{})
		d.err = nil
	}
	d.mu.Unlock()
}

// stop ends the use of d; its parent is dropped.
func (d *deadlineCtx) stop() {
	d.mu.Lock()
	if d.armed {
		d.timer.Stop()
		d.armed = false
	}
	if d.stopWatch != nil {
		d.stopWatch()
		d.stopWatch = nil
	}
	d.use++
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
	if d.deadline.IsZero() || time.Now().Before(d.deadline) {
		return
	}
	d.end(context.DeadlineExceeded)
}

// end closes Done with err, unless it is closed already. d.mu is held.
func (d *deadlineCtx) end(err error) {
	if d.err != nil {
		return
	}
	d.err = err
	close(d.done)
}

// Deadline returns the deadline of the current use.
func (d *deadlineCtx) Deadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deadline, !d.deadline.IsZero()
}

// Done is closed when the deadline passes or the parent is done. The
// timer and the watch of the parent start when something first asks.
func (d *deadlineCtx) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed && d.err == nil && !d.deadline.IsZero() {
		if d.timer == nil {
			d.timer = time.AfterFunc(time.Until(d.deadline), d.expire)
		} else {
			d.timer.Reset(time.Until(d.deadline))
		}
		d.armed = true
	}
	if d.stopWatch == nil && d.err == nil && d.Context != nil && d.Context.Done() != nil {
		use := d.use
		d.stopWatch = context.AfterFunc(d.Context, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.use == use && d.Context != nil {
				d.end(d.Context.Err())
			}
		})
	}
	return d.done
}

// Err is the reason Done is closed: context.DeadlineExceeded, or the
// parent's error (which closes Done, when nothing watched the parent yet).
func (d *deadlineCtx) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil && d.Context != nil {
		if err := d.Context.Err(); err != nil {
			d.end(err)
		} else if !d.deadline.IsZero() && !time.Now().Before(d.deadline) {
			d.end(context.DeadlineExceeded) // (no timer was asked for)
		}
	}
	return d.err
}
