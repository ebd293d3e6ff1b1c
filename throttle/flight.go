package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// flight sends the decisions that the goroutines of one Limiter ask for at
// the same time to Redis together, in one pipeline ("one flight"), instead of
// one round trip each. When no flight is in the air, a decision leaves at
// once, alone; decisions asked for while one is in the air wait for it to
// land and leave together in the next. Every decision is still its own
// atomic script run inside Redis; only the network trips are shared.
//
// One goroutine flies the flights while there are any and exits when the
// queue is empty. Callers wait for their own decision with their own
// deadline, so a Redis that stops answering costs each caller its timeout,
// never longer, whatever the client's read timeout.
type flight struct {
	rdb      redis.UniversalClient
	timeout  time.Duration
	maxQueue int

	mu     sync.Mutex
	flying bool    // the flying goroutine is running
	queue  []*call // waiting for the next flight
	spare  []*call // the other buffer, reused
}

// maxQueued bounds the decisions waiting for a flight: past it Redis is
// clearly not keeping up, and callers fail at once instead of piling up.
const maxQueued = 100_000

// errQueueFull is returned when maxQueued decisions are already waiting.
var errQueueFull = errors.New("throttle: too many decisions waiting for Redis")

// call is one decision travelling in a flight. Calls are pooled, each with
// its own reusable timer: a decision allocates only what go-redis needs for
// its command and its reply.
type call struct {
	args      []any         // the whole EVALSHA command
	cmd       *redis.Cmd    // set while in a pipeline
	reply     string        // the script's reply
	err       error         // or the error
	abandoned atomic.Bool   // its caller stopped waiting: skip it, never pool it
	done      chan struct{} // signalled once the reply or error is set
	timer     *time.Timer
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{args: make([]any, 0, 16), done: make(chan struct{}, 1), timer: t}
}}

func getCall() *call { return callPool.Get().(*call) }

func putCall(c *call) {
	clear(c.args)
	c.args, c.cmd, c.reply, c.err = c.args[:0], nil, "", nil
	callPool.Put(c)
}

// do runs c in a flight and waits for it until ctx ends or the flight
// timeout passes. It returns the reply, and always consumes c.
func (f *flight) do(ctx context.Context, c *call) (string, error) {
	f.mu.Lock()
	if len(f.queue) >= maxQueued {
		f.mu.Unlock()
		putCall(c)
		return "", errQueueFull
	}
	f.queue = append(f.queue, c)
	if !f.flying {
		f.flying = true
		go f.fly()
	}
	f.mu.Unlock()

	var timeout <-chan time.Time
	if f.timeout > 0 {
		c.timer.Reset(f.timeout)
		timeout = c.timer.C
	}
	select {
	case <-c.done:
		c.timer.Stop()
		reply, err := c.reply, c.err
		putCall(c)
		return reply, err
	case <-ctx.Done():
		c.abandoned.Store(true)
		c.timer.Stop()
		return "", ctx.Err()
	case <-timeout:
		c.abandoned.Store(true)
		return "", fmt.Errorf("%w: no answer within %v (WithTimeout)", context.DeadlineExceeded, f.timeout)
	}
}

// fly sends flights until the queue is empty.
func (f *flight) fly() {
	for {
		f.mu.Lock()
		batch := f.queue
		if len(batch) == 0 {
			f.flying = false
			f.mu.Unlock()
			return
		}
		f.queue = f.spare[:0]
		f.mu.Unlock()

		f.send(batch)

		clear(batch)
		f.mu.Lock()
		f.spare = batch[:0]
		f.mu.Unlock()
	}
}

// send runs a batch: one command directly, more in one pipeline. A NOSCRIPT
// reply (Redis restarted, failed over, or SCRIPT FLUSH) loads the script and
// sends those calls once more. Every call is signalled at the end.
func (f *flight) send(batch []*call) {
	live := batch[:0:0]
	for _, c := range batch {
		if !c.abandoned.Load() {
			live = append(live, c)
		}
	}
	if len(live) > 0 {
		ctx := context.Background()
		if f.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, f.timeout)
			defer cancel()
		}
		f.exec(ctx, live)
		var again []*call
		for _, c := range live {
			if c.err != nil && isNoScript(c.err) {
				again = append(again, c)
			}
		}
		if len(again) > 0 {
			if err := lua.LoadDecide(ctx, f.rdb); err != nil {
				for _, c := range again {
					c.err = err
				}
			} else {
				f.exec(ctx, again)
			}
		}
	}
	for _, c := range live {
		c.done <- struct{}{}
	}
}

func (f *flight) exec(ctx context.Context, batch []*call) {
	if len(batch) == 1 {
		c := batch[0]
		c.reply, c.err = f.rdb.Do(ctx, c.args...).Text()
		return
	}
	pipe := f.rdb.Pipeline()
	for _, c := range batch {
		c.cmd = pipe.Do(ctx, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, c := range batch {
		c.reply, c.err = c.cmd.Text()
		c.cmd = nil
	}
}

func isNoScript(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOSCRIPT")
}
