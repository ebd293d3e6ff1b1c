package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
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
	rdb     redis.UniversalClient
	runner  *lua.Runner
	timeout time.Duration
	// inline: the client itself bounds I/O by timeout, so a lone decision
	// can fly on its caller's goroutine without a handoff.
	inline bool
	reach  *reach // why Redis does not answer, when it does not
	// giveBack undoes the decision of a call whose caller stopped waiting
	// before its reply came (nil: nothing is undone).
	giveBack func(c *call)

	// A connection kept for lone decisions (see processAlone). It is only
	// touched by the one lone decision in the air (flying guards it), and
	// by the idle timer and close under mu.
	owner    *redis.Client // non-nil: lone decisions may keep a connection
	own      *redis.Conn
	ownSince time.Time     // when own was taken from the pool
	ownUsed  atomic.Int64  // when own was last used (UnixNano)
	renew    time.Duration // own goes back to the pool once this old
	idle     *time.Timer   // gives own back after ownIdle unused
	closed   atomic.Bool   // close was called: keep no connection

	mu     sync.Mutex
	flying bool    // a flight (or a lone decision) is in the air
	queue  []*call // waiting for the next flight
	spare  []*call // the other buffer, reused
}

// maxQueued bounds the decisions waiting for a flight: past it Redis is
// clearly not keeping up, and callers fail at once instead of piling up.
const maxQueued = 100_000

// errQueueFull is returned when maxQueued decisions are already waiting.
var errQueueFull = errors.New("throttle: too many decisions waiting for Redis")

// call is one decision travelling in a flight. Calls are pooled, each with
// its own reusable timer and deadline context.
type call struct {
	alone  run           // its own run, when it flies alone
	one    [1]*call      // the calls of that run: itself
	args   []any         // the command of that run, reused
	dctx   deadlineCtx   // its deadline, when it flies alone
	tmpl   []any         // the cached command of its key, without task IDs
	key    string        // the limiter key
	id     string        // task ID ("" = no reservation)
	cost   taskCost      // what it takes: requests, and other units
	fair   bool          // its template is fair: it says its tenant
	tenant string        // its tenant, when fair
	reply  string        // the script's reply for this decision
	err    error         // or the error
	state  atomic.Int32  // callWaiting, then callAbandoned or callAnswered
	done   chan struct{} // signalled once the reply or error is set
	timer  *time.Timer
}

// A call in a flight is waiting for its reply until either its caller
// stops waiting (abandoned: the flight skips it if not sent yet, undoes its
// decision if it was, and it is never pooled) or the flight answers it,
// whichever comes first.
const (
	callWaiting int32 = iota
	callAbandoned
	callAnswered
)

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

func getCall() *call { return callPool.Get().(*call) }

func putCall(c *call) {
	c.tmpl, c.key, c.id, c.cost, c.reply, c.err, c.fair, c.tenant = nil, "", "", taskCost{}, "", nil, false, ""
	c.state.Store(callWaiting)
	callPool.Put(c)
}

// sendAlone flies c alone on its caller's goroutine, reusing the buffers c
// carries, so that a lone decision allocates only what go-redis does. Its
// deadline covers everything the client may wait on: a pool connection, a
// dial and its retries, the reply.
func (f *flight) sendAlone(ctx context.Context, c *call) {
	// end is when the call must have ended; the client gets until
	// deadline, less the reserve in which a failed call finds out why
	// (see reach).
	var deadline, end time.Time
	if f.timeout > 0 {
		end = time.Now().Add(f.timeout)
		deadline = end.Add(-f.reach.reserve(f.timeout))
		if d, ok := ctx.Deadline(); !ok || d.After(end) {
			c.dctx.start(ctx, deadline)
			ctx = &c.dctx
			defer c.dctx.stop()
		} else {
			deadline, end = time.Time{}, d
		}
	}
	c.one[0] = c
	c.alone = run{calls: c.one[:]}
	c.args = c.alone.appendArgs(c.args[:0])
	for attempt := 0; ; attempt++ {
		c.alone.finish(f.processAlone(ctx, c.args))
		if c.err == nil || attempt == 2 || !f.runner.Recover(ctx, lua.DecideScript, c.args, c.err) {
			break
		}
	}
	if c.err != nil && !deadline.IsZero() && !time.Now().Before(deadline) && !errors.Is(c.err, context.DeadlineExceeded) {
		// The socket deadline fired: say so as the waiting path does.
		c.err = fmt.Errorf("%w: no answer within %v (WithTimeout): %v", context.DeadlineExceeded, f.timeout, c.err)
	}
	if c.err != nil {
		c.err = f.reach.explain(c.err, end)
	}
	clear(c.args)
	c.one[0], c.alone = nil, run{}
}

// minPoolForOwn is the smallest pool a lone decision keeps a connection of:
// a smaller pool is left entirely to the application.
const minPoolForOwn = 8

// ownRenew is how long a kept connection serves lone decisions before it
// goes back to the pool and the next one is taken. go-redis (v9.23) skips
// its RESP3 push-notification peek, a syscall and six allocations per
// command, only on a connection put back into the pool within the last 5 s;
// a connection kept for longer pays it on every command, which is more than
// the pool's own health check the kept connection is there to save.
const ownRenew = 4 * time.Second

// ownIdle is how long a kept connection may go unused before it goes back
// to the pool: a Limiter that stops deciding (or is dropped without Close)
// holds no connection that the application could use.
const ownIdle = 250 * time.Millisecond

// processAlone runs one command for a lone decision. On a plain client with
// a pool of at least minPoolForOwn connections it runs on a connection the
// flight keeps for lone decisions: a pool hands out a connection only after
// a health-check syscall (and three allocations), which costs a lone
// decision more than it saves. The kept connection goes back to the pool
// every ownRenew, after ownIdle unused, and on close. A kept connection
// that fails other than with a Redis error reply, or answers READONLY (a
// failover), is dropped at once; when it was found dead or read-only the
// command runs once more on the pool, as go-redis itself retries it.
func (f *flight) processAlone(ctx context.Context, args []any) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, args...)
	if f.owner == nil || f.closed.Load() {
		_ = f.rdb.Process(ctx, cmd)
		return cmd
	}
	if f.own != nil && time.Since(f.ownSince) >= f.renew {
		f.returnOwn() // back to the pool, marked fresh
	}
	if f.own == nil {
		f.own, f.ownSince = f.owner.Conn(), time.Now()
		f.armIdle()
	}
	err := f.own.Process(ctx, cmd)
	f.ownUsed.Store(time.Now().UnixNano())
	if err == nil || (isRedisError(err) && !isReadOnly(err)) {
		return cmd
	}
	f.returnOwn()
	if !deadConn(err) && !isReadOnly(err) {
		return cmd
	}
	cmd = redis.NewStringCmd(ctx, args...)
	_ = f.rdb.Process(ctx, cmd)
	return cmd
}

// armIdle starts (or restarts) the timer that gives the kept connection
// back when it goes unused. Called with the connection held by a lone
// decision in the air, once per connection taken (every ownRenew at
// most). Under mu: the timer may fire while this decision is still in the
// air (a slow or unreachable Redis), and idleCheck reads f.idle.
func (f *flight) armIdle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.idle == nil {
		f.idle = time.AfterFunc(ownIdle, f.idleCheck)
	} else {
		f.idle.Reset(ownIdle)
	}
}

// idleCheck gives the kept connection back when no decision is in the air
// and it was not used for ownIdle; otherwise it looks again later.
func (f *flight) idleCheck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flying {
		// The decision in the air owns f.own: not even read it now.
		f.idle.Reset(ownIdle)
		return
	}
	if f.own == nil {
		return
	}
	unused := time.Since(time.Unix(0, f.ownUsed.Load()))
	if unused < ownIdle {
		f.idle.Reset(ownIdle - unused + time.Millisecond)
		return
	}
	f.returnOwn()
}

// close gives the kept connection back and keeps none from now on. A lone
// decision in the air gives it back when it lands.
func (f *flight) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed.Store(true)
	if f.idle != nil {
		f.idle.Stop()
	}
	if !f.flying && f.own != nil {
		f.returnOwn()
	}
}

// returnOwn returns the kept connection to its pool, or only forgets it when
// the application closed its client meanwhile: put back into a closed pool,
// go-redis logs "Unexpected conn[N] state changed by hook to CLOSED", which
// a program that closes its client right after a decision must not print.
// (A closed pool holds no connection at all, an open one at least the kept
// one.)
func (f *flight) returnOwn() {
	if f.owner.PoolStats().TotalConns > 0 {
		_ = f.own.Close()
	}
	f.own = nil
}

// isRedisError reports whether err is an error reply from Redis (the
// connection is fine). Its own function, so that a call without an error
// does not allocate the target errors.As needs.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isReadOnly reports a READONLY reply: the connection talks to a replica
// (after a failover, through a name that now points elsewhere) and must not
// be used again, as go-redis drops such connections from its pool.
func isReadOnly(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "READONLY")
}

// deadConn reports whether err says a connection was already dead when it
// was used: closed by the other side or reset.
func deadConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// maxPerRun bounds the decisions one script run makes, so that one run
// never holds Redis for long.
const maxPerRun = 256

// run is one script run in a flight: decisions on one key, in order.
type run struct {
	calls []*call
	args  []any
	cmd   *redis.StringCmd
}

// do runs c in a flight and waits for it until ctx ends or the flight
// timeout passes. It returns the reply, and always consumes c.
func (f *flight) do(ctx context.Context, c *call) (string, error) {
	var end time.Time
	if f.timeout > 0 {
		end = time.Now().Add(f.timeout)
		if err := f.reach.before(end); err != nil {
			putCall(c)
			return "", err
		}
	}
	f.mu.Lock()
	if len(f.queue) >= maxQueued {
		f.mu.Unlock()
		putCall(c)
		return "", errQueueFull
	}
	if !f.flying && f.inline {
		// Nothing in the air: this decision flies now, on its caller's
		// goroutine; whoever queued meanwhile leaves in the next flight.
		f.flying = true
		f.mu.Unlock()
		f.sendAlone(ctx, c)
		f.mu.Lock()
		if f.closed.Load() && f.own != nil {
			f.returnOwn()
		}
		if len(f.queue) > 0 {
			go f.fly()
		} else {
			f.flying = false
		}
		f.mu.Unlock()
		reply, err := c.reply, c.err
		putCall(c)
		return reply, err
	}
	f.queue = append(f.queue, c)
	if !f.flying {
		f.flying = true
		go f.fly()
	}
	f.mu.Unlock()

	var timeout <-chan time.Time
	if f.timeout > 0 {
		c.timer.Reset(f.timeout - f.reach.reserve(f.timeout))
		timeout = c.timer.C
	}
	var err error
	select {
	case <-c.done:
	case <-ctx.Done():
		err = ctx.Err() // the caller's own end: not Redis's doing
	case <-timeout:
		err = f.reach.explain(fmt.Errorf("%w: no answer within %v (WithTimeout)", context.DeadlineExceeded, f.timeout), end)
	}
	c.timer.Stop()
	if err != nil {
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return "", err
		}
		<-c.done // answered as the caller gave up: the answer stands
	}
	reply, err := c.reply, c.err
	putCall(c)
	if err != nil {
		err = f.reach.explain(err, end)
	}
	return reply, err
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

		f.send(context.Background(), batch)

		clear(batch)
		f.mu.Lock()
		f.spare = batch[:0]
		f.mu.Unlock()
	}
}

// send runs a batch. Decisions on the same key (and mode) share one script
// run; runs on different keys share one pipeline. A missing function
// library or script (Redis restarted, failed over, FUNCTION or SCRIPT FLUSH)
// is recovered from (see lua.Runner.Recover) and those runs sent once more.
// Every call is signalled at the end.
func (f *flight) send(ctx context.Context, batch []*call) {
	var runs []*run
	for _, c := range batch {
		if c.state.Load() == callAbandoned {
			continue // never sent: nothing to undo
		}
		var r *run
		for _, x := range runs {
			if &x.calls[0].tmpl[0] == &c.tmpl[0] && len(x.calls) < maxPerRun {
				r = x
				break
			}
		}
		if r == nil {
			r = &run{}
			runs = append(runs, r)
		}
		r.calls = append(r.calls, c)
	}
	if len(runs) > 0 {
		if f.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, f.timeout)
			defer cancel()
		}
		for _, r := range runs {
			r.args = r.appendArgs(make([]any, 0, len(r.calls[0].tmpl)+2*len(r.calls)))
		}
		f.exec(ctx, runs)
		for attempt := 0; attempt < 2; attempt++ {
			var again []*run
			for _, r := range runs {
				if err := r.calls[0].err; err != nil && f.runner.Recover(ctx, lua.DecideScript, r.args, err) {
					again = append(again, r)
				}
			}
			if len(again) == 0 {
				break
			}
			f.exec(ctx, again)
		}
	}
	for _, r := range runs {
		for _, c := range r.calls {
			switch {
			case c.state.CompareAndSwap(callWaiting, callAnswered):
				c.done <- struct{}{}
			case c.err == nil && f.giveBack != nil:
				// Sent, decided, and nobody is waiting for it any more.
				f.giveBack(c)
			}
		}
	}
}

// exec sends runs: one alone, several in one pipeline.
func (f *flight) exec(ctx context.Context, runs []*run) {
	if len(runs) == 1 {
		r := runs[0]
		cmd := redis.NewStringCmd(ctx, r.args...)
		_ = f.rdb.Process(ctx, cmd)
		r.finish(cmd)
		return
	}
	pipe := f.rdb.Pipeline()
	for _, r := range runs {
		r.cmd = redis.NewStringCmd(ctx, r.args...)
		_ = pipe.Process(ctx, r.cmd)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, r := range runs {
		r.finish(r.cmd)
		r.cmd = nil
	}
}

// appendArgs builds the command of a run: its key's template, and a task ID
// and a cost per decision (nothing for a lone Take: the script's default).
func (r *run) appendArgs(args []any) []any {
	args = append(args, r.calls[0].tmpl...)
	if r.calls[0].fair {
		for _, c := range r.calls {
			args = append(args, c.id, c.cost.arg(), c.tenant)
		}
		return args
	}
	if len(r.calls) == 1 {
		return lua.AppendCallers(args, r.calls[0].id, r.calls[0].cost.arg())
	}
	for _, c := range r.calls {
		args = append(args, c.id, c.cost.arg())
	}
	return args
}

// finish hands each call its part of the run's reply.
func (r *run) finish(cmd *redis.StringCmd) {
	s, err := cmd.Result()
	if err != nil {
		r.fail(err)
		return
	}
	for i, c := range r.calls {
		if s == "" && i > 0 {
			r.fail(fmt.Errorf("%w: %d decisions asked, fewer answered", lua.ErrBadReply, len(r.calls)))
			return
		}
		c.reply, s = lua.NextReply(s)
		c.err = nil
	}
}

func (r *run) fail(err error) {
	for _, c := range r.calls {
		c.reply, c.err = "", err
	}
}

// boundsIO reports whether rdb's own settings end every command within
// timeout: context deadlines honoured, or read and write timeouts no longer.
func boundsIO(rdb redis.UniversalClient, timeout time.Duration) bool {
	if timeout <= 0 {
		return true
	}
	ok := func(ctxTimeouts bool, read, write time.Duration) bool {
		return ctxTimeouts || (read > 0 && read <= timeout && write > 0 && write <= timeout)
	}
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return ok(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case *redis.ClusterClient:
		o := c.Options()
		return ok(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	}
	return false
}

// giveBack undoes an admitted decision whose caller stopped waiting (its
// WithTimeout, its context) after it was sent: Redis made it all the same,
// but nobody runs the call. Its slot in flight is released and its tokens
// (the cost and any lease) given back, so that nothing stays taken until
// the slot expires for a task that did not run (and, failing closed, was
// deferred). This needs the reply: a client that ends socket reads at the
// caller's deadline (ContextTimeoutEnabled, on the lone-decision path)
// drops the connection with the reply unread, and what Redis decided then
// is not known here (docs/guarantees.md, faults).
func (l *Limiter) giveBack(c *call) {
	r, err := lua.ParseDecide(c.reply)
	if err != nil || r.Status != lua.StatusAllowed {
		return
	}
	key, cost, tenant := c.key, c.cost, c.tenant
	cost.n += int(r.Lease)
	go func() {
		ctx := context.Background()
		if r.Slot != "" {
			if err := l.Release(ctx, key, r.Slot); err != nil {
				l.o.logger.Warn("throttle: cannot give back the slot of a decision its caller gave up on; it frees when it expires",
					"key", key, "slot", r.Slot, "slot_expiry", l.o.slotExpiry, "err", err)
			}
		}
		// The whole charge back, from where it was counted (see adjust).
		if err := l.refund(ctx, key, r.At, r.Generation, cost, tenant); err != nil {
			l.o.logger.Warn("throttle: cannot give back the tokens of a decision its caller gave up on", "key", key, "tokens", cost.String(), "err", err)
			return
		}
		l.o.logger.Debug("throttle: gave back a decision its caller gave up on", "key", key, "tokens", cost.String(), "slot", r.Slot)
	}()
}
