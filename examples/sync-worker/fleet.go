package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// nodeSpec is everything a worker needs to join the fleet of one run. With
// -procs the parent hands it to each worker process as JSON.
type nodeSpec struct {
	// Run namespaces the run's queue, limiter keys and ledger in Redis.
	Run string `json:"run"`
	// RedisURL is the Redis of a worker process ("" in-process).
	RedisURL string `json:"redis_url,omitempty"`
	// Name tells this worker's log lines and counts apart ("w1"); with
	// several servers, each gets a number ("s1", "s2").
	Name string `json:"name"`
	// Servers is how many asynq servers the node runs.
	Servers int `json:"servers"`
	// Concurrency is each server's number of worker goroutines.
	Concurrency int `json:"concurrency"`
	// Endpoints are the providers to sync from.
	Endpoints []endpoint `json:"endpoints"`
}

// endpoint is what a worker knows of a provider: its name (the throttle
// key), its task type and where it is. Its limits are in Redis.
type endpoint struct {
	Name     string `json:"name"`
	TaskType string `json:"task_type"`
	URL      string `json:"url"`
}

// Names of a run's things in Redis.
func queueName(run string) string     { return "sync-" + run }
func limiterPrefix(run string) string { return "sync-worker:" + run + ":throttle" }
func ledgerNS(run string) string      { return "sync-worker:{" + run + "}" }

// limiterOptions are the options every process of a run builds its limiter
// with: the run's prefix.
func limiterOptions(run string) []throttle.Option {
	return []throttle.Option{throttle.WithPrefix(limiterPrefix(run))}
}

// job is the payload of one sync task.
type job struct {
	ID      string `json:"id"`
	Account string `json:"account"`
}

// node is one worker process's share of the fleet: asynq servers built by
// worker.NewServer, each with the throttle.ByProvider middleware, whose
// handlers call the providers over HTTP.
type node struct {
	spec    nodeSpec
	ledger  ledger
	counts  *counters
	log     *slog.Logger
	http    *http.Client
	byType  map[string]endpoint
	servers []*asynq.Server

	stopFlush chan struct{}
	flushed   chan struct{}
}

// flushInterval is how often a node writes its middleware counts to Redis.
const flushInterval = 200 * time.Millisecond

// startNode starts spec.Servers asynq servers on rdb, each with a Limiter of
// its own, as separate processes would have. Stop them with stop. first,
// when not nil, is given the first server's Limiter (the dashboard shows its
// decisions in a run without -procs).
func startNode(rdb redis.UniversalClient, spec nodeSpec, log *slog.Logger, first func(*throttle.Limiter)) (*node, error) {
	n := &node{
		spec:   spec,
		ledger: ledger{rdb: rdb, ns: ledgerNS(spec.Run)},
		counts: newCounters(),
		log:    log,
		http: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		},
		byType:    map[string]endpoint{},
		stopFlush: make(chan struct{}),
		flushed:   make(chan struct{}),
	}
	opts := limiterOptions(spec.Run)
	for _, ep := range spec.Endpoints {
		n.byType[ep.TaskType] = ep
	}
	// The middleware's suspension warnings would repeat the handlers' own
	// 429 lines, and what Observe learns is shown by the monitor, read
	// with Inspect: only the middleware's errors are shown.
	opts = append(opts, throttle.WithLogger(slog.New(levelHandler{log.Handler(), slog.LevelError})))
	go n.flushLoop()
	for i := range spec.Servers {
		srv := worker.NewServer(rdb, asynq.Config{
			Concurrency:     spec.Concurrency,
			Queues:          map[string]int{queueName(spec.Run): 1},
			Logger:          asynqLogger{log},
			LogLevel:        asynq.WarnLevel,
			ShutdownTimeout: 5 * time.Second,
		})
		mux := asynq.NewServeMux()
		name := spec.Name
		if spec.Servers > 1 {
			name = fmt.Sprintf("%s%d", spec.Name, i+1)
		}
		// One Limiter per server, as separate processes would have: they
		// share nothing but Redis. Its events are counted per server, to
		// show a suspension reach each of them.
		lim := throttle.NewLimiter(rdb, opts...)
		lim.OnEvent(func(ev throttle.Event) { n.counts.observe(name, ev) })
		if i == 0 && first != nil {
			first(lim)
		}
		mux.Use(lim.Middleware())
		handle := func(ctx context.Context, t *asynq.Task) error { return n.handle(ctx, t, name) }
		for _, ep := range spec.Endpoints {
			mux.HandleFunc(ep.TaskType, handle)
		}
		if err := srv.Start(mux); err != nil {
			n.stop()
			return nil, fmt.Errorf("start asynq server: %w", err)
		}
		n.servers = append(n.servers, srv)
	}
	return n, nil
}

// stop shuts the servers down (letting running handlers finish) and writes
// the last counts.
func (n *node) stop() {
	var wg sync.WaitGroup
	for _, srv := range n.servers {
		wg.Go(srv.Shutdown)
	}
	wg.Wait()
	close(n.stopFlush)
	<-n.flushed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := n.counts.flush(ctx, n.ledger); err != nil {
		n.log.Error("cannot write the last middleware counts", "err", err)
	}
	n.http.CloseIdleConnections()
}

func (n *node) flushLoop() {
	defer close(n.flushed)
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stopFlush:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = n.counts.flush(ctx, n.ledger) // kept and retried on the next tick
			cancel()
		}
	}
}

// handle syncs one job: one call to the provider, whose response goes
// through throttle.Observe. Observe learns, for the whole fleet, what the
// response says of the provider's quota (a lower published quota, calls
// remaining, a reset), and returns a 429 as a *throttle.RateLimitedError,
// which makes the middleware suspend the provider for the whole fleet and
// run the task again later.
func (n *node) handle(ctx context.Context, t *asynq.Task, worker string) error {
	ep, ok := n.byType[t.Type()]
	if !ok {
		return fmt.Errorf("no provider for task type %q: %w", t.Type(), asynq.SkipRetry)
	}
	var j job
	if err := json.Unmarshal(t.Payload(), &j); err != nil || j.ID == "" {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL+"/sync/"+j.ID, nil)
	if err != nil {
		return err
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", ep.Name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)

	if err := throttle.Observe(ctx, resp); err != nil {
		retry := cmp.Or(resp.Header.Get("Retry-After"), "-")
		if reset := resp.Header.Get("X-RateLimit-Reset"); reset != "" {
			retry = "reset " + reset
		}
		n.log.Info(fmt.Sprintf("%s: %s answered 429, Retry-After: %s (%s)", worker, ep.Name, retry, j.ID))
		return err // a *throttle.RateLimitedError: the middleware suspends ep.Name
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: job %s: HTTP %s", ep.Name, j.ID, resp.Status)
	}
	return n.ledger.markDone(ctx, ep.Name, j.ID, worker)
}

// asynqLogger sends asynq's warnings and errors to the run's event log.
type asynqLogger struct{ log *slog.Logger }

var _ asynq.Logger = asynqLogger{}

func (l asynqLogger) Debug(args ...any) {}
func (l asynqLogger) Info(args ...any)  {}
func (l asynqLogger) Warn(args ...any)  { l.log.Warn("asynq: " + fmt.Sprint(args...)) }
func (l asynqLogger) Error(args ...any) { l.log.Error("asynq: " + fmt.Sprint(args...)) }
func (l asynqLogger) Fatal(args ...any) {
	l.log.Error("asynq: " + fmt.Sprint(args...))
	os.Exit(1)
}

// levelHandler passes on the records of h at or above min.
type levelHandler struct {
	slog.Handler
	min slog.Level
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{h.Handler.WithAttrs(attrs), h.min}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{h.Handler.WithGroup(name), h.min}
}

// runWorkerProcess is the hidden -worker mode: one worker process of a
// -procs run. It serves until its standard input closes (the parent closes
// it, or died), then shuts down cleanly.
func runWorkerProcess(ctx context.Context, spec nodeSpec, stdin io.Reader, logw io.Writer) error {
	if spec.RedisURL == "" {
		return errors.New("-worker: the spec has no Redis URL")
	}
	rdb, _, err := dialRedis(ctx, spec.RedisURL, "-worker")
	if err != nil {
		return err
	}
	defer rdb.Close()
	log := slog.New(newLineHandler(func(line string) { fmt.Fprintln(logw, line) }))
	n, err := startNode(rdb, spec, log, nil)
	if err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	n.stop()
	return nil
}
