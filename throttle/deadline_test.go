package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closed reports whether ch is closed (without waiting).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// deadlineCtx keeps the context contract over reuse: Done closes at its
// deadline or when the parent is done, Err says which, and nothing of one
// use leaks into the next.
func TestDeadlineCtxClosesAtItsDeadlineOrItsParents(t *testing.T) {
	var d deadlineCtx

	t.Run("the deadline passes", func(t *testing.T) {
		d.start(context.Background(), time.Now().Add(20*time.Millisecond))
		defer d.stop()
		assert.Nil(t, d.Err())
		select {
		case <-d.Done():
		case <-time.After(time.Second):
			t.Fatal("Done not closed a second after a 20ms deadline")
		}
		assert.ErrorIs(t, d.Err(), context.DeadlineExceeded)
	})

	t.Run("a watched parent is canceled", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		d.start(parent, time.Now().Add(time.Hour))
		defer d.stop()
		done := d.Done() // asked for: the parent is watched
		require.False(t, closed(done))
		cancel()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Done not closed after the parent was canceled")
		}
		assert.ErrorIs(t, d.Err(), context.Canceled)
	})

	t.Run("a parent canceled before anything asked for Done", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		d.start(parent, time.Now().Add(time.Hour))
		defer d.stop()
		cancel()
		assert.ErrorIs(t, d.Err(), context.Canceled, "Err reports the parent's")
		assert.True(t, closed(d.Done()), "Done is closed once Err is not nil")
	})

	t.Run("an old use's parent canceled late closes nothing", func(t *testing.T) {
		old, cancelOld := context.WithCancel(context.Background())
		d.start(old, time.Now().Add(time.Hour))
		_ = d.Done()
		d.stop()
		d.start(context.Background(), time.Now().Add(time.Hour))
		defer d.stop()
		cancelOld()
		time.Sleep(20 * time.Millisecond)
		assert.False(t, closed(d.Done()), "the next use was closed by the old parent")
		assert.Nil(t, d.Err())
		dl, ok := d.Deadline()
		assert.True(t, ok)
		assert.WithinDuration(t, time.Now().Add(time.Hour), dl, time.Second)
	})

	t.Run("values come from the parent", func(t *testing.T) {
		type k struct{}
		d.start(context.WithValue(context.Background(), k{}, "v"), time.Now().Add(time.Hour))
		defer d.stop()
		assert.Equal(t, "v", d.Value(k{}))
	})
}

// A task admitted at an instant ahead is deferred to it, rather than run
// early, when the wait is longer than a worker waits (a paced wait) or
// than half the time its deadline leaves (issue 29, item 6: a worker that
// slept at most a paced wait and then ran started calls a window counted
// seconds later).
func TestMiddlewareDefersAdmissionsFurtherAheadThanAPacedWait(t *testing.T) {
	m := &middleware{now: time.Now}
	// (asynq gives every task a deadline: its Timeout, 30 min by default)
	ctx, cancelAll := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancelAll()
	assert.False(t, m.tooFarAhead(ctx, 0), "admitted now")
	assert.False(t, m.tooFarAhead(ctx, maxPaceWait), "a paced wait")
	assert.True(t, m.tooFarAhead(ctx, maxPaceWait+time.Millisecond), "beyond a paced wait")
	assert.True(t, m.tooFarAhead(ctx, 54*time.Second), "a window's tolerance")
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	assert.True(t, m.tooFarAhead(short, 600*time.Millisecond), "beyond half of what a 1 s deadline leaves")
	assert.False(t, m.tooFarAhead(short, 100*time.Millisecond), "well within a 1 s deadline")
}
