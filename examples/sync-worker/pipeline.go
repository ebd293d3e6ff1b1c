package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
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
	// RedisURL is a Redis URL (see acceptedRedisURLs); "" runs an embedded
	// miniredis.
	RedisURL string
	// RedisFrom names where RedisURL came from in messages (default
	// "-redis").
	RedisFrom string
	// Timeout bounds the wait for every job to be done (default: twice the
	// expected run time, plus timeoutMargin; see expectedDuration).
	Timeout time.Duration
	// Dashboard, when set, is the address to serve the web view (package
	// dashboard) and Prometheus metrics (/metrics) on during the run.
	Dashboard string
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

// Defaults of the flags.
const (
	defaultJobs        = 40
	defaultServers     = 3
	defaultConcurrency = 5
	// timeoutMargin is added to twice the expected run time to make the
	// default timeout: room for a slow or busy machine.
	timeoutMargin = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Jobs == 0 {
		c.Jobs = defaultJobs
	}
	if c.Servers == 0 {
		c.Servers = defaultServers
	}
	if c.Concurrency == 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.RedisFrom == "" {
		c.RedisFrom = "-redis"
	}
	if c.Providers == nil {
		c.Providers = DefaultProviders()
	}
	if c.Timeout == 0 {
		c.Timeout = 2*expectedDuration(c.Providers, c.Jobs) + timeoutMargin
	}
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
		if c.Live {
			c.Interval = 250 * time.Millisecond
		}
	}
	return c
}

// Accepted ranges of the flags.
const (
	maxJobs        = 10_000
	maxServers     = 64
	maxConcurrency = 1_000
	maxProcs       = 64
)

// checkCounts reports a count flag out of its range, naming the flag and
// the range.
func (c Config) checkCounts() error {
	for _, f := range []struct {
		name        string
		v, min, max int
	}{
		{"jobs", c.Jobs, 1, maxJobs},
		{"servers", c.Servers, 1, maxServers},
		{"concurrency", c.Concurrency, 1, maxConcurrency},
		{"procs", c.Procs, 0, maxProcs},
	} {
		if f.v < f.min || f.v > f.max {
			return fmt.Errorf("-%s must be between %d and %d, got %d", f.name, f.min, f.max, f.v)
		}
	}
	return nil
}

// checkTimeout reports a -timeout that is not positive.
func checkTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("-timeout must be a positive duration such as 90s or 5m, got %v", d)
	}
	return nil
}

// validate reports a configuration the run cannot work with.
func (c Config) validate() error {
	if err := c.checkCounts(); err != nil {
		return err
	}
	if err := checkTimeout(c.Timeout); err != nil {
		return err
	}
	switch {
	case c.Procs > 0 && c.RedisURL == "":
		return errors.New("-procs needs a Redis that other processes can reach: give -redis redis://host:port (or set REDIS_URL)")
	case len(c.Providers) == 0:
		return errors.New("no providers")
	}
	for _, p := range c.Providers {
		if len(p.Limits) == 0 {
			return fmt.Errorf("provider %s has no Limits", p.Name)
		}
		if err := p.Tenants.check(p); err != nil {
			return err
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

	rdb, redisName, closeRedis, err := openRedis(ctx, cfg.RedisURL, cfg.RedisFrom)
	if err != nil {
		return Summary{}, err
	}
	defer closeRedis()
	lostRedis := false
	if cfg.RedisURL != "" && !cfg.Keep {
		// Deferred after closeRedis, so it runs before it; the fleet has
		// stopped by then.
		defer func() {
			if !lostRedis {
				cleanupWithin(ctx, 30*time.Second, rdb, runID)
			}
		}()
	}

	providers, eps, err := startProviders(cfg.Providers)
	defer closeProviders(providers)
	if err != nil {
		return Summary{}, err
	}
	limiter := throttle.NewLimiter(rdb, limiterOptions(runID)...)
	if err := setProviderLimits(ctx, limiter, cfg.Providers); err != nil {
		return Summary{}, err
	}

	sum := Summary{Run: runID, Redis: redisName, Workers: workersLine(cfg), Timeout: cfg.Timeout.Seconds()}
	writeHeader(out, cfg, sum)
	// The backlog is in the queue before the fleet starts: the run's clock,
	// the providers' shedding and the event streams count from then.
	prod := newProducer(rdb, runID, cfg.Providers, cfg.Jobs)
	if err := prod.enqueueBacklog(ctx); err != nil {
		return Summary{}, err
	}
	disp := newDisplay(out, cfg.Live, time.Now(), cfg.Interval)
	shown := limiter // the dashboard's: the first server's in this process
	stopFleet, err := startFleet(cfg, rdb, nodeSpec{Run: runID, Concurrency: cfg.Concurrency, Endpoints: eps}, disp,
		func(l *throttle.Limiter) { shown = l })
	if err != nil {
		return Summary{}, err
	}
	if cfg.Dashboard != "" {
		stop, err := serveDashboard(cfg.Dashboard, shown, out)
		if err != nil {
			_ = stopFleet()
			return Summary{}, err
		}
		defer stop()
	}
	start, stopProducing, produced := startProducing(ctx, providers, prod)
	defer stopProducing()

	m := newMonitor(ledger{rdb: rdb, ns: ledgerNS(runID)}, limiter, providers, prod, cfg.Jobs, fleetSize(cfg), start)
	end, lostErr := m.watch(ctx, disp, min(cfg.Interval, pollInterval), cfg.Timeout)
	if end == redisLost {
		disp.mute()
		stopProducing()
		// Nothing can be audited (and nothing cleaned up).
		lostRedis = true
		abandonFleet(stopFleet)
		return Summary{}, fmt.Errorf("%w: %s stopped answering: %v", errRedisLost, redisName, lostErr)
	}
	stopWork(stopProducing, produced, stopFleet, disp)

	// The workers flushed their last counts as they stopped: audit now.
	if err := m.auditRun(ctx, rdb, queueName(runID), prod, disp, &sum); err != nil {
		return Summary{}, err
	}
	sum.TimedOut, sum.Interrupted = end == timedOut, end == interrupted
	fmt.Fprintln(out)
	writeTable(out, sum)
	return sum, nil
}

// startProducing starts the run's clock (the providers' shedding counts
// from it) and streams the jobs due after the backlog. stop ends the
// stream; produced then says how it ended.
func startProducing(ctx context.Context, providers []*Provider, prod *producer) (start time.Time, stop context.CancelFunc, produced <-chan error) {
	start = time.Now()
	for _, p := range providers {
		p.StartClock(start)
	}
	pctx, stop := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() { ch <- prod.stream(pctx, start) }()
	return start, stop, ch
}

// stopWork stops the producer, then the fleet (running handlers finish),
// and shows on disp what went wrong.
func stopWork(stopProducing func(), produced <-chan error, stopFleet func() error, disp *display) {
	stopProducing()
	if err := <-produced; err != nil {
		disp.event("producer: " + err.Error())
	}
	if err := stopFleet(); err != nil {
		disp.event("stopping workers: " + err.Error())
	}
}

// cleanupWithin removes the run's keys from Redis (see cleanup), taking at
// most d even when ctx has ended.
func cleanupWithin(ctx context.Context, d time.Duration, rdb redis.UniversalClient, runID string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	cleanup(cctx, rdb, runID)
}

func closeProviders(providers []*Provider) {
	for _, p := range providers {
		_ = p.Close()
	}
}

// setProviderLimits sets each provider's limits. Limits live in Redis: set
// once here, obeyed by every worker process, and the ceiling of what the
// fleet learns from the providers.
func setProviderLimits(ctx context.Context, limiter *throttle.Limiter, specs []ProviderSpec) error {
	for _, spec := range specs {
		if err := limiter.SetLimits(ctx, spec.Name, spec.Limits...); err != nil {
			return err
		}
	}
	return nil
}

// workersLine says what the fleet is made of, and names its workers as the
// events name them (s1: "s1: slack answered 429").
func workersLine(cfg Config) string {
	if cfg.Procs > 0 {
		return fmt.Sprintf("%d worker processes (%s) × %d goroutines", cfg.Procs, names("w", cfg.Procs), cfg.Concurrency)
	}
	if cfg.Servers == 1 {
		return fmt.Sprintf("1 asynq server (s) × %d goroutines in this process", cfg.Concurrency)
	}
	return fmt.Sprintf("%d asynq servers (%s) × %d goroutines in this process", cfg.Servers, names("s", cfg.Servers), cfg.Concurrency)
}

// names lists n workers named prefix1 to prefixn: "s1, s2, s3", "s1..s8".
func names(prefix string, n int) string {
	if n > 3 {
		return fmt.Sprintf("%s1..%s%d", prefix, prefix, n)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return strings.Join(out, ", ")
}

// abandonFleet stops a fleet whose Redis went away: its workers cannot
// finish cleanly, so it gives them lostStopTimeout, then leaves.
func abandonFleet(stopFleet func() error) {
	stopped := make(chan struct{})
	go func() {
		_ = stopFleet()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(lostStopTimeout):
	}
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
		eps = append(eps, endpoint{Name: spec.Name, TaskType: spec.TaskType, URL: p.URL})
	}
	return providers, eps, nil
}

// startFleet starts the workers: asynq servers in this process, or -procs
// worker processes. It returns the function that stops them, letting running
// handlers finish.
func startFleet(cfg Config, rdb redis.UniversalClient, spec nodeSpec, disp *display, first func(*throttle.Limiter)) (func() error, error) {
	if cfg.Procs > 0 {
		spec.RedisURL, spec.Servers = cfg.RedisURL, 1
		f, err := startProcs(cfg.Executable, spec, cfg.Procs, disp)
		if err != nil {
			return nil, err
		}
		return f.stop, nil
	}
	spec.Name, spec.Servers = "s", cfg.Servers
	n, err := startNode(rdb, spec, slog.New(newLineHandler(disp.event)), first)
	if err != nil {
		return nil, err
	}
	return func() error { n.stop(); return nil }, nil
}

// lostStopTimeout bounds how long a run whose Redis went away waits for its
// workers to stop.
const lostStopTimeout = 5 * time.Second

// fleetSize is the number of asynq servers in the run.
func fleetSize(cfg Config) int {
	if cfg.Procs > 0 {
		return cfg.Procs
	}
	return cfg.Servers
}

// openRedis connects to rawURL, or starts an embedded miniredis when rawURL
// is "". from names where rawURL came from, for messages.
func openRedis(ctx context.Context, rawURL, from string) (redis.UniversalClient, string, func(), error) {
	if rawURL == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, fmt.Errorf("start embedded Redis: %w", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return rdb, "embedded miniredis", func() { _ = rdb.Close(); mr.Close() }, nil
	}
	rdb, name, err := dialRedis(ctx, rawURL, from)
	if err != nil {
		return nil, "", nil, err
	}
	return rdb, name, func() { _ = rdb.Close() }, nil
}

// rateNote explains the progress lines' rates, which start above the
// quotas: each provider's bucket starts full, and its burst goes at once.
const rateNote = "rates are over the last 2s; at first they exceed a quota by its burst,\nwhich a full bucket admits at once, and the provider accepts too\n\n"

// writeHeader prints what the run does, in at most 80 columns.
func writeHeader(out io.Writer, cfg Config, s Summary) {
	fmt.Fprintf(out, "sync-worker: %d jobs for each of %d providers, run %s\n", cfg.Jobs, len(cfg.Providers), s.Run)
	fmt.Fprintf(out, "fleet: %s\n", s.Workers)
	fmt.Fprintf(out, "redis: %s\n", s.Redis)
	fmt.Fprintf(out, "expected: about %s; gives up after %s (-timeout)\n\n",
		expectedDuration(cfg.Providers, cfg.Jobs).Round(time.Second), cfg.Timeout.Round(time.Second))
	defer fmt.Fprint(out, rateNote)
	cells := make([][]string, len(cfg.Providers))
	for i, p := range cfg.Providers {
		quota, ours := formatLimits(p.Quota), formatLimits(p.Limits)
		if p.Publish {
			quota += " in RateLimit-Policy"
			ours += " (stale docs)"
		}
		cells[i] = []string{p.Name, quota, ours}
	}
	writeAligned(out, []column{{"provider", true}, {"quota (enforced by the API)", true}, {"our limit (Limiter.SetLimits)", true}}, cells)
	for _, p := range cfg.Providers {
		if p.Publish {
			fmt.Fprintf(out, "%s: says its quota in every response; the fleet learns it (Observe)\n", p.Name)
		}
		if st := p.Stream; st.Rate > 0 {
			fmt.Fprintf(out, "%s: half its jobs arrive as events from %s on, %g/s\n", p.Name, st.From, st.Rate)
		}
		if sh := p.Shed; sh.For > 0 {
			fmt.Fprintf(out, "%s: from %s on, sheds load for %s: 429 with Retry-After\n", p.Name, sh.At, sh.For)
		}
		if t := p.Tenants; t.lightJobs(cfg.Jobs) > 0 {
			light := t.lightJobs(cfg.Jobs)
			fmt.Fprintf(out, "%s: two tenants: %s has %d jobs in the backlog, %s's %d arrive at %s\n",
				p.Name, t.Heavy, cfg.Jobs-light, t.Light, light, t.LightAt)
		}
	}
	fmt.Fprintln(out)
}

// expectedDuration is how long jobs jobs per provider take at best: the
// slowest provider's drain time under our limits (for a provider that
// publishes its quota, the limits the fleet learns), or the arrival of its
// last streamed job if later, plus its load shedding.
func expectedDuration(specs []ProviderSpec, jobs int) time.Duration {
	var worst time.Duration
	for _, p := range specs {
		d := drainTime(learnedLimits(p), jobs)
		if st := p.Stream; st.Rate > 0 {
			d = max(d, st.From+time.Duration(float64(streamed(p, jobs)-1)/st.Rate*float64(time.Second)))
		}
		worst = max(worst, d+p.Shed.For)
	}
	return worst
}

// learnedLimits are the limits in force once the fleet has learned what p
// publishes, as throttle.Observe learns it: each tier of p.Limits lowered
// to the published quota of the same period (its burst no higher than the
// quota), never raised.
func learnedLimits(p ProviderSpec) []throttle.Limit {
	out := slices.Clone(p.Limits)
	if !p.Publish {
		return out
	}
	for i, l := range out {
		for _, q := range p.Quota {
			if q.Per == l.Per && q.N < l.N {
				out[i] = throttle.Limit{N: q.N, Per: l.Per, Burst: min(burstOf(l), q.N)}
			}
		}
	}
	return out
}

// drainTime is how long n tasks take under limits, ideally: every tier
// gives its burst at once, then its rate, but at most its burst per second,
// since asynq brings deferred tasks back once a second.
func drainTime(limits []throttle.Limit, n int) time.Duration {
	var worst float64
	for _, l := range limits {
		b := burstOf(l)
		if n <= b {
			continue
		}
		rate := min(ratePerSecond(l), float64(b))
		worst = max(worst, float64(n-b)/rate)
	}
	return time.Duration(worst * float64(time.Second))
}
