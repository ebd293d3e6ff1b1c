package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// Variants: how a fleet throttles its tasks.
const (
	// vAsynq is asynq with no throttling at all (the reference of B and D).
	vAsynq = "asynq"
	// vSleep: a middleware that calls redis_rate Allow and sleeps RetryAfter
	// until allowed, holding its worker (what most teams write today).
	vSleep = "sleep"
	// vWiki: asynq's wiki pattern, a per-process x/time/rate limiter at
	// quota/servers, a RateLimitError, IsFailure and RetryDelayFunc.
	vWiki = "wiki"
	// vNaive: our middleware without reservations (deny, retry after).
	vNaive = "naive"
	// vOurs: worker.NewServer + throttle.ByProvider as shipped.
	vOurs = "ours"
)

// fleetSpec describes one fleet run: servers x concurrency on one queue.
type fleetSpec struct {
	variant     string
	servers     int
	concurrency int
	queue       string
	// prefix isolates this run's limiter keys (ours, naive: WithPrefix;
	// sleep: redis_rate key prefix).
	prefix string
	// limits are the throttled keys and their fleet-wide quota; keys not in
	// it are not limited.
	limits map[string]quota
	// handlers maps task types to their handler factory; the factory gets the
	// variant's way to report a provider 429.
	handlers map[string]func(onLimited limitedFunc) asynq.Handler
	// throttleLimits, when set, are the limits of ours and naive per key, in
	// place of limits as per-second buckets (scenario E states quotas per
	// window); sleepLimits the same for sleep's redis_rate.
	throttleLimits map[string][]throttle.Limit
	sleepLimits    map[string]redis_rate.Limit
	// throttleOptions are added to the middleware options of ours and naive.
	throttleOptions []throttle.Option
	// custom, when set, builds the middleware of a variant this file does
	// not know (scenario F's naive and semaphore) for server i on rdb; it
	// may change the server's config (IsFailure, RetryDelayFunc) and
	// returns what to close when the fleet stops.
	custom func(i int, rdb *redis.Client, cfg *asynq.Config) (asynq.MiddlewareFunc, func(), error)
}

// limitedFunc turns a provider 429 into the error the variant's mechanism
// expects.
type limitedFunc func(resp *http.Response) error

// counters are what the throttling mechanism itself reports in one run.
type counters struct {
	// denials: ours/naive deferrals (observer: Deferred and Suspended),
	// sleep: refused Allow calls (each one a sleep), wiki: RateLimitErrors
	// from the local limiter.
	denials     atomic.Int64
	suspensions atomic.Int64 // ours/naive: Suspended outcomes (provider 429)
	failed      atomic.Int64 // ours/naive: Failed outcomes (Redis could not decide)
	reserved    atomic.Int64 // ours: deferrals that held a reserved slot
	copied      atomic.Int64 // ours/naive: deferrals by re-enqueued copy
	mu          sync.Mutex
	byReason    map[string]int64
	failedErrs  map[string]int64 // ours/naive: Failed decisions by error
	// trace, when set, records every event (scenario E's -e-trace).
	trace *runTrace
	// tap, when set, sees every event first (scenario T counts deferrals
	// by tenant).
	tap func(throttle.Event)
}

func newCounters() *counters {
	return &counters{byReason: map[string]int64{}, failedErrs: map[string]int64{}}
}

func (c *counters) observe(ev throttle.Event) {
	if c.tap != nil {
		c.tap(ev)
	}
	c.trace.event(ev)
	switch ev.Outcome {
	case throttle.Deferred, throttle.Suspended:
		c.denials.Add(1)
		if ev.Outcome == throttle.Suspended {
			c.suspensions.Add(1)
		}
		if ev.Reserved {
			c.reserved.Add(1)
		}
		if ev.Copied {
			c.copied.Add(1)
		}
		c.mu.Lock()
		c.byReason[ev.Reason.String()]++
		c.mu.Unlock()
	case throttle.Failed:
		c.failed.Add(1)
		if !ev.HandlerRan {
			c.denials.Add(1)
		}
		if ev.Err != nil {
			c.mu.Lock()
			c.failedErrs[ev.Err.Error()]++
			c.mu.Unlock()
		}
	}
}

// fleet is the running servers of one variant, each with its own Redis
// client as separate processes would have.
type fleet struct {
	servers []*asynq.Server
	clients []*redis.Client
	closers []func()
}

// stop shuts every server down (in parallel) and closes their clients.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, s := range f.servers {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	for _, c := range f.clients {
		_ = c.Close()
	}
	for _, c := range f.closers {
		c()
	}
}

// startFleet starts spec.servers asynq servers of spec.variant.
func startFleet(e *env, spec fleetSpec, c *counters) (*fleet, error) {
	f := &fleet{}
	for i := range spec.servers {
		if err := f.startServer(e, spec, c, i); err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// startServer starts server i of spec's fleet, on a client of its own:
// asynq's server with the variant's throttle, and spec's handlers.
func (f *fleet) startServer(e *env, spec fleetSpec, c *counters, i int) error {
	rdb := e.newClient(spec.concurrency + 20)
	f.clients = append(f.clients, rdb)
	cfg := asynq.Config{
		Concurrency:     spec.concurrency,
		Queues:          map[string]int{spec.queue: 1},
		Logger:          asynqLogger{verbose: e.verbose, prefix: fmt.Sprintf("[%s #%d] ", spec.variant, i)},
		ShutdownTimeout: 3 * time.Second,
	}
	mux := asynq.NewServeMux()
	srv, onLimited, err := f.variantServer(spec, c, i, rdb, &cfg, mux)
	if err != nil {
		return err
	}
	for typ, h := range spec.handlers {
		mux.Handle(typ, h(onLimited))
	}
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start %s server %d: %w", spec.variant, i, err)
	}
	f.servers = append(f.servers, srv)
	return nil
}

// providerStatus reports a provider's 429 as a plain error.
func providerStatus(resp *http.Response) error { return fmt.Errorf("provider: %s", resp.Status) }

// variantServer makes server i as spec's variant runs it: its throttle on
// mux (and cfg changed as the variant needs), and how its handlers report a
// provider's 429.
func (f *fleet) variantServer(spec fleetSpec, c *counters, i int, rdb *redis.Client, cfg *asynq.Config, mux *asynq.ServeMux) (*asynq.Server, limitedFunc, error) {
	switch {
	case spec.custom != nil:
		mw, closer, err := spec.custom(i, rdb, cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("%s server %d: %w", spec.variant, i, err)
		}
		if closer != nil {
			f.closers = append(f.closers, closer)
		}
		mux.Use(mw)
		return asynq.NewServerFromRedisClient(rdb, *cfg), providerStatus, nil
	case spec.variant == vAsynq:
		return asynq.NewServerFromRedisClient(rdb, *cfg), providerStatus, nil
	case spec.variant == vSleep:
		mux.Use(sleepMiddleware(redis_rate.NewLimiter(rdb), spec.prefix, spec.redisRateLimits(), c))
		onLimited := func(resp *http.Response) error {
			return &providerLimitedError{RetryAfter: retryAfter(resp)}
		}
		return asynq.NewServerFromRedisClient(rdb, *cfg), onLimited, nil
	case spec.variant == vWiki:
		mux.Use(wikiMiddleware(spec.perProcessLimiters(), c))
		cfg.IsFailure = func(err error) bool { return !IsRateLimitError(err) }
		cfg.RetryDelayFunc = wikiRetryDelay
		onLimited := func(resp *http.Response) error { return &RateLimitError{RetryIn: retryAfter(resp)} }
		return asynq.NewServerFromRedisClient(rdb, *cfg), onLimited, nil
	case spec.variant == vNaive, spec.variant == vOurs:
		if c.trace != nil {
			// Outermost: when asynq handed the task over, before any
			// decision or pacing wait.
			mux.Use(c.trace.dequeued)
		}
		lim := throttle.NewLimiter(rdb, spec.throttleOpts()...)
		lim.OnEvent(c.observe)
		mux.Use(lim.Middleware())
		onLimited := func(resp *http.Response) error { return throttle.Observe(context.Background(), resp) }
		return worker.NewServer(rdb, *cfg), onLimited, nil
	}
	return nil, nil, fmt.Errorf("unknown variant %q", spec.variant)
}

// redisRateLimits are sleep's redis_rate limits: sleepLimits, else limits
// as per-second buckets.
func (spec fleetSpec) redisRateLimits() map[string]redis_rate.Limit {
	if spec.sleepLimits != nil {
		return spec.sleepLimits
	}
	limits := map[string]redis_rate.Limit{}
	for k, q := range spec.limits {
		limits[k] = redis_rate.Limit{Rate: int(q.Rate), Burst: int(q.Burst), Period: time.Second}
	}
	return limits
}

// perProcessLimiters are wiki's x/time/rate limiters: each process gets
// quota/servers, as the wiki's per-process limiter must to keep the fleet
// under the provider's quota.
func (spec fleetSpec) perProcessLimiters() map[string]*rate.Limiter {
	lims := map[string]*rate.Limiter{}
	for k, q := range spec.limits {
		burst := max(1, int(q.Burst)/spec.servers)
		lims[k] = rate.NewLimiter(rate.Limit(q.Rate/float64(spec.servers)), burst)
	}
	return lims
}

// throttleOpts are the Limiter options of ours and naive (naive: without
// reservations).
func (spec fleetSpec) throttleOpts() []throttle.Option {
	opts := []throttle.Option{
		throttle.WithPrefix(spec.prefix),
		throttle.WithLogger(slog.New(slog.DiscardHandler)),
	}
	opts = append(opts, spec.throttleOptions...)
	if spec.variant == vNaive {
		opts = append(opts, throttle.WithReservationHorizon(0))
	}
	return opts
}

// setLimits stores the fleet-wide limits of ours and naive in Redis.
func setLimits(ctx context.Context, e *env, spec fleetSpec) error {
	if spec.variant != vOurs && spec.variant != vNaive {
		return nil
	}
	l := throttle.NewLimiter(e.ctl, throttle.WithPrefix(spec.prefix))
	if spec.throttleLimits != nil {
		for k, lims := range spec.throttleLimits {
			if err := l.SetLimits(ctx, k, lims...); err != nil {
				return err
			}
		}
		return nil
	}
	for k, q := range spec.limits {
		lim := throttle.Limit{N: int(q.Rate), Per: time.Second, Burst: int(q.Burst)}
		if err := l.SetLimits(ctx, k, lim); err != nil {
			return err
		}
	}
	return nil
}

func retryAfter(resp *http.Response) time.Duration {
	s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || s < 0 {
		return time.Second
	}
	return time.Duration(s) * time.Second
}

// providerLimitedError is the sleep baseline's 429: its middleware sleeps
// RetryAfter and goes through the limiter again.
type providerLimitedError struct{ RetryAfter time.Duration }

func (e *providerLimitedError) Error() string {
	return fmt.Sprintf("provider rate limited, retry after %v", e.RetryAfter)
}

// sleepMiddleware is the baseline most teams write: ask redis_rate, and
// sleep on the worker goroutine until allowed.
func sleepMiddleware(rl *redis_rate.Limiter, prefix string, limits map[string]redis_rate.Limit, c *counters) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			key := t.Headers()[throttle.HeaderKey]
			limit, ok := limits[key]
			if !ok {
				return next.ProcessTask(ctx, t)
			}
			for {
				res, err := rl.Allow(ctx, prefix+":"+key, limit)
				if err != nil {
					return err
				}
				if res.Allowed == 0 {
					c.denials.Add(1)
					if err := sleepCtx(ctx, res.RetryAfter); err != nil {
						return err
					}
					continue
				}
				err = next.ProcessTask(ctx, t)
				var pl *providerLimitedError
				if !errors.As(err, &pl) {
					return err
				}
				if err := sleepCtx(ctx, pl.RetryAfter); err != nil {
					return err
				}
			}
		})
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RateLimitError is the asynq wiki's error for "rate limited, retry in".
type RateLimitError struct{ RetryIn time.Duration }

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("rate limited (retry in %v)", e.RetryIn)
}

// IsRateLimitError is the wiki's IsFailure helper.
func IsRateLimitError(err error) bool {
	var rl *RateLimitError
	return errors.As(err, &rl)
}

// wikiRetryDelay is the wiki's RetryDelayFunc: the limiter's delay for a
// RateLimitError, asynq's default otherwise.
func wikiRetryDelay(n int, err error, t *asynq.Task) time.Duration {
	var rl *RateLimitError
	if errors.As(err, &rl) {
		return rl.RetryIn
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// wikiMiddleware asks the process-local limiter of the task's key; when it
// has no token the task fails with a RateLimitError carrying the limiter's
// delay (the reservation is cancelled: the task will ask again).
func wikiMiddleware(lims map[string]*rate.Limiter, c *counters) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			lim := lims[t.Headers()[throttle.HeaderKey]]
			if lim == nil {
				return next.ProcessTask(ctx, t)
			}
			r := lim.Reserve()
			if d := r.Delay(); d > 0 {
				r.Cancel()
				c.denials.Add(1)
				return &RateLimitError{RetryIn: d}
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// asynqLogger silences asynq unless -v.
type asynqLogger struct {
	verbose bool
	prefix  string
}

func (l asynqLogger) log(level string, args ...any) {
	if l.verbose {
		fmt.Fprint(os.Stderr, append([]any{l.prefix, level, " "}, args...)...)
		fmt.Fprintln(os.Stderr)
	}
}

func (l asynqLogger) Debug(args ...any) {}
func (l asynqLogger) Info(args ...any)  {}
func (l asynqLogger) Warn(args ...any)  { l.log("WARN", args...) }
func (l asynqLogger) Error(args ...any) { l.log("ERROR", args...) }
func (l asynqLogger) Fatal(args ...any) {
	fmt.Fprint(os.Stderr, append([]any{l.prefix, "FATAL "}, args...)...)
	os.Exit(1)
}

// keyedTask is throttle.NewTask for the harness's own keys and costs, which
// are valid: an error is the harness's bug.
func keyedTask(typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	t, err := throttle.NewTask(typename, payload, opts...)
	if err != nil {
		panic(err)
	}
	return t
}
