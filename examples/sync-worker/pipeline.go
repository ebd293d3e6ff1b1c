package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Config is one run of the pipeline. The zero value of a field means its
// default (see withDefaults).
type Config struct {
	// Jobs is the number of sync jobs per provider (default 40).
	Jobs int
	// Servers is how many asynq servers run in this process when Procs is 0
	// (default 3).
	Servers int
	// Concurrency is each asynq server's number of worker goroutines
	// (default 5).
	Concurrency int
	// Procs starts that many worker processes of Executable instead of
	// in-process servers; they need RedisURL.
	Procs int
	// Executable is the program -procs starts with the hidden -worker flag
	// (default os.Executable()).
	Executable string
	// RedisURL is a redis:// URL; "" runs an embedded miniredis.
	RedisURL string
	// Timeout bounds the wait for every job to be done (default 60 s).
	Timeout time.Duration
	// Live redraws the progress in place (out is a terminal); otherwise
	// progress is printed as plain lines.
	Live bool
	// Interval is the time between progress updates (default 250 ms live,
	// 2 s plain, where a provider's "done" line comes as soon as it is done).
	Interval time.Duration
	// Providers are the simulated APIs (default DefaultProviders()).
	Providers []ProviderSpec
	// Keep leaves the run's queue, limits and ledger in a real Redis (they
	// expire within ledgerTTL) instead of deleting them at the end.
	Keep bool
}

func (c Config) withDefaults() Config {
	if c.Jobs == 0 {
		c.Jobs = 40
	}
	if c.Servers == 0 {
		c.Servers = 3
	}
	if c.Concurrency == 0 {
		c.Concurrency = 5
	}
	if c.Timeout == 0 {
		c.Timeout = time.Minute
	}
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
		if c.Live {
			c.Interval = 250 * time.Millisecond
		}
	}
	if c.Providers == nil {
		c.Providers = DefaultProviders()
	}
	return c
}

// validate reports a configuration the run cannot work with.
func (c Config) validate() error {
	switch {
	case c.Jobs < 1:
		return fmt.Errorf("-jobs must be at least 1, got %d", c.Jobs)
	case c.Servers < 1:
		return fmt.Errorf("-servers must be at least 1, got %d", c.Servers)
	case c.Concurrency < 1:
		return fmt.Errorf("-concurrency must be at least 1, got %d", c.Concurrency)
	case c.Procs < 0:
		return fmt.Errorf("-procs must be 0 or more, got %d", c.Procs)
	case c.Procs > 0 && c.RedisURL == "":
		return errors.New("-procs needs a Redis that other processes can reach: give -redis redis://host:port (or set REDIS_URL)")
	case c.Timeout < 0:
		return fmt.Errorf("-timeout must be positive, got %v", c.Timeout)
	case len(c.Providers) == 0:
		return errors.New("no providers")
	}
	for _, p := range c.Providers {
		if len(p.Limits) == 0 && len(p.Guess) == 0 {
			return fmt.Errorf("provider %s has neither Limits nor a Guess", p.Name)
		}
	}
	return nil
}

// run runs the whole pipeline: providers, Redis, the worker fleet, the jobs;
// it shows progress on out, audits every task at the end and prints the
// summary table. The Summary tells whether every job was done exactly once;
// an error means the run could not be set up or audited.
func run(ctx context.Context, cfg Config, out io.Writer) (Summary, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Summary{}, err
	}
	runID := strconv.FormatUint(rand.Uint64()&0xffffff, 16)

	rdb, redisName, closeRedis, err := openRedis(ctx, cfg.RedisURL)
	if err != nil {
		return Summary{}, err
	}
	defer closeRedis()
	if cfg.RedisURL != "" && !cfg.Keep {
		// Deferred after closeRedis, so it runs before it; the fleet has
		// stopped by then.
		defer cleanup(context.WithoutCancel(ctx), rdb, runID)
	}

	providers, eps, err := startProviders(cfg.Providers)
	defer func() {
		for _, p := range providers {
			_ = p.Close()
		}
	}()
	if err != nil {
		return Summary{}, err
	}

	// Limits live in Redis: set once here, obeyed by every worker process.
	limiter := throttle.NewLimiter(rdb, limiterOptions(runID, eps)...)
	for _, spec := range cfg.Providers {
		if len(spec.Limits) > 0 {
			if err := limiter.SetLimits(ctx, spec.Name, spec.Limits...); err != nil {
				return Summary{}, err
			}
		}
	}

	sum := Summary{Run: runID, Redis: redisName}
	if cfg.Procs > 0 {
		sum.Workers = fmt.Sprintf("%d worker processes × %d goroutines", cfg.Procs, cfg.Concurrency)
	} else {
		sum.Workers = fmt.Sprintf("%d asynq servers × %d goroutines in this process", cfg.Servers, cfg.Concurrency)
	}
	writeHeader(out, cfg, sum)
	disp := newDisplay(out, cfg.Live, time.Now(), cfg.Interval)

	stopFleet, err := startFleet(cfg, rdb, nodeSpec{Run: runID, Concurrency: cfg.Concurrency, Endpoints: eps}, disp)
	if err != nil {
		return Summary{}, err
	}
	start := time.Now()
	ids, err := enqueue(ctx, rdb, runID, cfg.Providers, cfg.Jobs)
	if err != nil {
		_ = stopFleet()
		return Summary{}, err
	}

	m := monitor{ledger: ledger{rdb: rdb, ns: ledgerNS(runID)}, limiter: limiter, providers: providers, jobs: cfg.Jobs, start: start}
	end := m.watch(ctx, disp, min(cfg.Interval, pollInterval), cfg.Timeout)
	if err := stopFleet(); err != nil {
		disp.event("stopping workers: " + err.Error())
	}

	// The workers flushed their last counts as they stopped: audit now.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rows, err := m.rows(actx)
	if err != nil {
		return Summary{}, fmt.Errorf("audit: %w", err)
	}
	disp.finish(rows)
	if err := m.audit(actx, rdb, queueName(runID), ids, rows, &sum); err != nil {
		return Summary{}, err
	}
	sum.TimedOut, sum.Interrupted = end == timedOut, end == interrupted
	fmt.Fprintln(out)
	writeTable(out, sum)
	return sum, nil
}

// startProviders starts the simulated APIs; on error, the ones started are
// returned too, to be closed.
func startProviders(specs []ProviderSpec) ([]*Provider, []endpoint, error) {
	providers := make([]*Provider, 0, len(specs))
	eps := make([]endpoint, 0, len(specs))
	for _, spec := range specs {
		p, err := StartProvider(spec)
		if err != nil {
			return providers, nil, err
		}
		providers = append(providers, p)
		eps = append(eps, endpoint{Name: spec.Name, TaskType: spec.TaskType, URL: p.URL, Guess: spec.Guess, HeaderLimit: spec.HeaderLimit})
	}
	return providers, eps, nil
}

// startFleet starts the workers: asynq servers in this process, or -procs
// worker processes. It returns the function that stops them, letting running
// handlers finish.
func startFleet(cfg Config, rdb redis.UniversalClient, spec nodeSpec, disp *display) (func() error, error) {
	if cfg.Procs > 0 {
		spec.RedisURL, spec.Servers = cfg.RedisURL, 1
		f, err := startProcs(cfg.Executable, spec, cfg.Procs, disp)
		if err != nil {
			return nil, err
		}
		return f.stop, nil
	}
	spec.Name, spec.Servers = "s", cfg.Servers
	n, err := startNode(rdb, spec, slog.New(newLineHandler(disp.event)))
	if err != nil {
		return nil, err
	}
	return func() error { n.stop(); return nil }, nil
}

// openRedis connects to url, or starts an embedded miniredis when url is "".
func openRedis(ctx context.Context, rawURL string) (redis.UniversalClient, string, func(), error) {
	if rawURL == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, fmt.Errorf("start embedded Redis: %w", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return rdb, "embedded miniredis", func() { _ = rdb.Close(); mr.Close() }, nil
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("-redis: %w", err)
	}
	rdb := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, "", nil, fmt.Errorf("cannot reach Redis at %s: %w", redactURL(rawURL), err)
	}
	return rdb, redactURL(rawURL), func() { _ = rdb.Close() }, nil
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "redis"
	}
	return u.Redacted()
}

func writeHeader(out io.Writer, cfg Config, s Summary) {
	fmt.Fprintf(out, "sync-worker: %d jobs for each of %d providers · %s · %s · run %s\n\n",
		cfg.Jobs, len(cfg.Providers), s.Workers, s.Redis, s.Run)
	cells := make([][]string, len(cfg.Providers))
	for i, p := range cfg.Providers {
		quota, ours := formatLimits(p.Quota), formatLimits(p.Limits)
		if p.HeaderLimit {
			quota += ", published only in X-RateLimit-Limit"
		}
		if len(p.Limits) == 0 {
			ours = formatLimits(p.Guess) + " guessed (WithKeyLimits), then read from the header"
		}
		cells[i] = []string{p.Name, quota, ours}
	}
	writeAligned(out, []column{{"provider", true}, {"quota (enforced by the simulated API)", true}, {"our limit (Limiter.SetLimits)", true}}, cells)
	fmt.Fprintln(out)
}

// enqueue puts cfg.Jobs sync tasks per provider in the run's queue,
// interleaved, each with its provider as throttle key. Completed tasks are
// retained so that the audit can find every one of them.
func enqueue(ctx context.Context, rdb redis.UniversalClient, run string, specs []ProviderSpec, jobs int) (map[string][]string, error) {
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	ids := make(map[string][]string, len(specs))
	for i := range jobs {
		for _, spec := range specs {
			j := job{ID: fmt.Sprintf("%s-%03d", spec.Name, i+1), Account: fmt.Sprintf("acct-%d", i%7+1)}
			payload, _ := json.Marshal(j)
			t := throttle.NewTask(spec.TaskType, payload, throttle.Key(spec.Name))
			_, err := client.EnqueueContext(ctx, t,
				asynq.Queue(queueName(run)), asynq.TaskID(j.ID), asynq.Retention(ledgerTTL))
			if err != nil {
				return nil, fmt.Errorf("enqueue %s: %w", j.ID, err)
			}
			ids[spec.Name] = append(ids[spec.Name], j.ID)
		}
	}
	return ids, nil
}
