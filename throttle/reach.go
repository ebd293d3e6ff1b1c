package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// reach names the cause when Redis cannot be reached ("cannot reach Redis
// at 127.0.0.1:6390: dial tcp 127.0.0.1:6390: connect: connection
// refused"), where go-redis reports only the end of the call's context:
// it redials (DialerRetries times per dial, again on each of MaxRetries)
// until the context ends, and keeps the dial error to itself (logging one
// line per round of dials through its own logger, which a library must
// leave alone).
//
// So a call gives the client its WithTimeout less a small reserve, and one
// that fails other than with a Redis reply has the client's address dialled
// once more, as the client dials it, within that reserve (a probe, whose
// finding serves the Limiter's other calls for probeFresh). A probe refused
// outright (not merely slow) marks Redis down: until a probe connects
// again, each call first dials once itself and, still refused, fails at
// once with the cause, without having go-redis redial for the whole
// timeout (and log each round of it).
type reach struct {
	targets []reachTarget // nothing to dial (a Ring, another client): no probe

	down atomic.Bool // the latest probe was refused outright

	mu   sync.Mutex
	last *probe // the latest probe
}

// reachTarget is one address the client dials, and how it dials it.
type reachTarget struct {
	name string // as the error names it
	dial func(ctx context.Context) (net.Conn, error)
}

// probe is one round of dials to every target.
type probe struct {
	at      time.Time
	done    chan struct{}
	err     *unreachableError // set before done is closed; nil: a target answered
	refused bool              // every dial failed outright, none merely timed out
}

// probeFresh is how long a probe's finding serves the Limiter's calls;
// probeReserve bounds the part of a call's timeout kept for a probe.
const (
	probeFresh   = 100 * time.Millisecond
	probeReserve = 50 * time.Millisecond
)

// newReach returns the reach of rdb's addresses: a plain or failover
// client's, or a Cluster's seeds (none reachable is the cause; some
// reachable says nothing).
func newReach(rdb redis.UniversalClient) *reach {
	r := &reach{}
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		name := o.Addr
		if name == "FailoverClient" {
			name = "the master (through Sentinel)"
		}
		dial, network, addr := o.Dialer, o.Network, o.Addr
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		if network == "" {
			network = "tcp"
		}
		r.targets = []reachTarget{{name: name, dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, network, addr) }}}
	case *redis.ClusterClient:
		o := c.Options()
		dial := o.Dialer
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		for _, addr := range o.Addrs {
			r.targets = append(r.targets, reachTarget{name: addr, dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, "tcp", addr) }})
		}
	}
	return r
}

// reserve is the part of a call's timeout kept for a probe.
func (r *reach) reserve(timeout time.Duration) time.Duration {
	if len(r.targets) == 0 || timeout <= 0 {
		return 0
	}
	return min(timeout/10, probeReserve)
}

// before is asked at the start of a call that ends at deadline: while
// Redis is marked down it probes (or takes a fresh probe's finding) and
// returns the cause when Redis still refuses. One atomic load otherwise.
func (r *reach) before(deadline time.Time) error {
	if !r.down.Load() {
		return nil
	}
	p := r.probeBy(deadline)
	if !p.wait(deadline) || !p.refused {
		return nil
	}
	return p.err
}

// explain returns err naming why Redis could not be reached, when that is
// why the call failed: a dial error from the client, or any other failure
// but a Redis reply when a probe by deadline finds no address reachable.
func (r *reach) explain(err error, deadline time.Time) error {
	if err == nil || isRedisError(err) {
		return err
	}
	var ue *unreachableError
	if errors.As(err, &ue) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		addr := "?"
		if op.Addr != nil {
			addr = op.Addr.String()
		}
		return fmt.Errorf("cannot reach Redis at %s: %w", addr, err)
	}
	if len(r.targets) == 0 || !time.Now().Before(deadline) {
		return err
	}
	// Only a dial refused outright names the cause: one that merely timed
	// out within the reserve may be a slow link, not a dead one.
	p := r.probeBy(deadline)
	if !p.wait(deadline) || !p.refused {
		return err
	}
	return fmt.Errorf("%w (%w)", p.err, err)
}

// probeBy returns the latest probe while fresh (or still running), else
// starts one that gives up at deadline.
func (r *reach) probeBy(deadline time.Time) *probe {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.last; p != nil && time.Since(p.at) < probeFresh {
		return p
	}
	p := &probe{at: time.Now(), done: make(chan struct{})}
	r.last = p
	go r.run(p, deadline)
	return p
}

// wait waits for p's finding until deadline, and reports whether it came.
func (p *probe) wait(deadline time.Time) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

func (r *reach) run(p *probe, deadline time.Time) {
	defer close(p.done)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	errs := make([]error, len(r.targets))
	var wg sync.WaitGroup
	for i, t := range r.targets {
		wg.Go(func() {
			conn, err := t.dial(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			_ = conn.Close()
		})
	}
	wg.Wait()
	names := make([]string, 0, len(errs))
	refused := true
	for i, err := range errs {
		if err == nil {
			r.down.Store(false)
			return // reachable: the cause is elsewhere
		}
		names = append(names, r.targets[i].name)
		var ne net.Error
		if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, context.DeadlineExceeded) {
			refused = false // slow, maybe only: not down
		}
	}
	p.err = &unreachableError{addr: strings.Join(names, ", "), err: errs[0]}
	p.refused = refused
	r.down.Store(refused)
}

// unreachableError says that Redis could not be dialled, and why.
type unreachableError struct {
	addr string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis at %s: %v", e.addr, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }
