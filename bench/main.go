// Command bench measures asynq-throttle against what Go teams use today, in
// one process run, on one Redis:
//
//	go run ./bench                 # all scenarios, on a redis-server it starts
//	go run ./bench -scenario A     # one scenario (A to G, S, T, L, K, M; comma-separated; A3 alone)
//	go run ./bench -quick          # a short smoke run
//	go run ./bench -redis redis://127.0.0.1:6379/0
//
// Scenarios (see issues 5 and 13 to 16): A backlog drain, B head of line, C
// decisions/s, D middleware overhead, E quota fidelity, F slots in flight;
// and, only when named, G many keys (bytes per key, decisions/s against
// one key), S a 60 s soak checked window by window, and T tenants (issue
// 23: fair shares among the tenants of one key, against first come first
// served and per-tenant caps, about 3.5 minutes), and L LLM quotas (issue
// 24: requests and tokens against a strict provider, the OpenAI cookbook's
// parallel processor as baseline, and ours, about 60 s), and K operator
// views (issue 35: what a /metrics scrape and a web-view poll cost Redis
// beside 200,000 other keys, against the SCAN walk they did before the
// index of the limiter's keys), and M stacked limits (issue 30: two
// workspace keys under one app key, each task carrying both, against a
// strict provider metering both, on one Redis and on a 3-master Cluster).
// Variants: sleep
// (redis_rate Allow + sleep), wiki (asynq wiki's per-process x/time/rate +
// RateLimitError), naive (ours without reservations; in F, a leased
// semaphore with a blind backoff), semaphore (F: asynq's x/rate.Semaphore),
// ours (worker.NewServer + throttle.ByProvider).
//
// Tables go to stdout, progress to stderr. With a Redis the harness started
// itself, it runs FLUSHALL between runs; with -redis it only deletes its own
// queues and keys (and commandstats then include other clients' traffic).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run())
}

func run() int {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	e := o.env
	closeRedis, code := e.connect(ctx, o.redisURL)
	if closeRedis == nil {
		return code
	}
	defer closeRedis()
	e.prov = newProvider()
	defer e.prov.Close()

	w := os.Stdout
	printHeader(ctx, e, w)
	want, err := chosenScenarios(o.scenarios)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 2
	}
	began := time.Now()
	results, status := runScenarios(ctx, e, w, want)
	fmt.Fprintf(w, "\ntotal wall time %v\n", time.Since(began).Round(time.Second))
	if o.jsonOut != "" {
		if err := writeResults(o.jsonOut, results); err != nil {
			fmt.Fprintf(os.Stderr, "bench: -json: %v\n", err)
			status = 1
		}
	}
	if ctx.Err() != nil {
		return 130
	}
	return status
}

// options are the command line: where Redis is, which scenarios to run,
// where the JSON goes, and the env the scenarios run in (without Redis).
type options struct {
	redisURL, scenarios, jsonOut string
	env                          *env
}

// parseFlags reads and checks the flags; an error names the bad flag.
func parseFlags() (*options, error) {
	redisURL := flag.String("redis", "", "use this Redis (redis://...) instead of starting a redis-server")
	scenarios := flag.String("scenario", "A,B,C,D,E,F", "scenarios to run, comma-separated: A, B, C, D, E, F; G (many keys), S (soak), T (tenants' fair shares, about 3.5 minutes), L (LLM quotas, about 60 s) and K (what a /metrics scrape and a web-view poll cost Redis beside 200,000 other keys, about 30 s) and M (stacked limits, issue 30: two workspace keys under an app key, on one Redis and on a 3-master Cluster, about 3.5 minutes) run only when named; A3 alone (small rates, part of A) when named")
	quick := flag.Bool("quick", false, "short smoke run (fewer tasks, shorter measurements)")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file")
	verbose := flag.Bool("v", false, "show asynq warnings and errors on stderr")
	bRounds := flag.Int("b-rounds", defaultBRounds, "scenario B: rounds of one solo and one mixed run per variant (more rounds, less noise)")
	eRounds := flag.Int("e-rounds", defaultERounds, "scenario E: rounds of one run per variant (-quick: 1 unless given)")
	eVars := flag.String("e-variants", strings.Join(eVariants, ","), "scenario E: variants to run, comma-separated")
	ePhase := flag.Float64("e-phase", -1, "scenario E: start each run at this fraction of a wall-clock second (0 to 1; -1: whenever), to reproduce a phase of asynq's forwarder ticks and the providers' windows")
	eTrace := flag.String("e-trace", "", "scenario E: write each run's calls, decisions and key state (every 100 ms), one file per run and provider, into this directory")
	fShort := flag.Int("f-short", defaultFShort, "scenario F: tasks of 200 ms in the backlog (-quick: 60 unless given)")
	fLong := flag.Int("f-long", defaultFLong, "scenario F: tasks of 3 s in the backlog (-quick: 8 unless given)")
	fLongTime := flag.Duration("f-long-time", defaultFLongTime, "scenario F: run time of the long tasks (a whole number of seconds phase-locks a 1 s retry to the releases)")
	fSemaRetry := flag.Duration("f-sema-retry", defaultFSemaRetry, "scenario F: how long the semaphore variant defers a task refused a slot")
	fVars := flag.String("f-variants", strings.Join(fVariants, ","), "scenario F: variants to run, comma-separated")
	tVars := flag.String("t-variants", strings.Join(tVariants, ","), "scenario T: variants to run, comma-separated (the ratios need fifo)")
	tCaseList := flag.String("t-cases", strings.Join(tCaseNames, ","), "scenario T: cases to run, comma-separated")
	lParse := declareLFlags()
	kParse := declareKFlags()
	flag.Parse()

	e := &env{quick: *quick, verbose: *verbose, bRounds: *bRounds, eRounds: *eRounds, eTrace: *eTrace, ePhase: *ePhase,
		fShort: *fShort, fLong: *fLong, fLongTime: *fLongTime, fSemaRetry: *fSemaRetry, runID: strconv.FormatInt(time.Now().Unix()%100000, 10)}
	if err := e.checkCounts(); err != nil {
		return nil, err
	}
	var err error
	if e.eVariants, err = variantList("-e-variants", *eVars, eVariants); err != nil {
		return nil, err
	}
	if e.fVariants, err = variantList("-f-variants", *fVars, fVariants); err != nil {
		return nil, err
	}
	if e.tVariants, err = variantList("-t-variants", *tVars, tVariants); err != nil {
		return nil, err
	}
	if e.tCases, err = variantList("-t-cases", *tCaseList, tCaseNames); err != nil {
		return nil, err
	}
	if err := lParse(); err != nil {
		return nil, err
	}
	if e.fSemaRetry < time.Second {
		return nil, fmt.Errorf("-f-sema-retry must be at least 1s (asynq's resolution), got %v", e.fSemaRetry)
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	e.quickDefaults(set)
	if err := kParse(e.quick, set); err != nil {
		return nil, err
	}
	return &options{redisURL: *redisURL, scenarios: *scenarios, jsonOut: *jsonOut, env: e}, nil
}

// checkCounts checks the rounds, backlogs, run time and phase the flags set.
func (e *env) checkCounts() error {
	switch {
	case e.bRounds < 1:
		return fmt.Errorf("-b-rounds must be at least 1, got %d", e.bRounds)
	case e.eRounds < 1:
		return fmt.Errorf("-e-rounds must be at least 1, got %d", e.eRounds)
	case e.fShort < 1 || e.fLong < 1:
		return fmt.Errorf("-f-short and -f-long must be at least 1, got %d and %d", e.fShort, e.fLong)
	case e.fLongTime < 100*time.Millisecond || e.fLongTime > time.Minute:
		return fmt.Errorf("-f-long-time must be from 100ms to 1m, got %v", e.fLongTime)
	case e.ePhase != -1 && (e.ePhase < 0 || e.ePhase >= 1):
		return fmt.Errorf("-e-phase must be from 0 to 1 (or -1), got %v", e.ePhase)
	}
	return nil
}

// variantList reads a comma-separated list of variants, each one of known.
func variantList(flagName, list string, known []string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(list, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		if !slices.Contains(known, v) {
			return nil, fmt.Errorf("%s: unknown variant %q (want %s)", flagName, v, strings.Join(known, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

// quickDefaults shortens what a -quick run measures, where the flags in
// set did not say otherwise.
func (e *env) quickDefaults(set map[string]bool) {
	if !e.quick {
		return
	}
	if !set["e-rounds"] {
		e.eRounds = 1
	}
	if !set["f-short"] {
		e.fShort = 60
	}
	if !set["f-long"] {
		e.fLong = 8
	}
}

// connect opens the control client on the Redis of redisURL, or on a
// redis-server it starts (and empties: it is the harness's own). close
// closes both; it is nil, with the exit code, when there is no Redis.
func (e *env) connect(ctx context.Context, redisURL string) (close func(), code int) {
	stopServer := func() {}
	if redisURL != "" {
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -redis: %v\n", err)
			return nil, 2
		}
		e.opts = opts
	} else {
		srv, err := startRedis()
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return nil, 1
		}
		stopServer = srv.Stop
		e.opts, e.own = &redis.Options{Addr: srv.Addr}, true
	}
	e.ctl = e.newClient(64)
	close = func() {
		e.ctl.Close()
		stopServer()
	}
	if err := e.ctl.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: redis %s: %v\n", e.opts.Addr, err)
		close()
		return nil, 1
	}
	if e.own {
		if err := e.ctl.FlushAll(ctx).Err(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			close()
			return nil, 1
		}
	}
	return close, 0
}

// scenario is one of the harness's measurements.
type scenario struct {
	name string
	run  func(context.Context, *env, io.Writer) (any, error)
}

// allScenarios are the scenarios in the order they run.
func allScenarios() []scenario {
	return []scenario{
		{"A", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runA(ctx, e, w) }},
		{"A3", func(ctx context.Context, e *env, w io.Writer) (any, error) {
			small, err := runA3(ctx, e)
			printA3(w, small)
			return small, err
		}},
		{"B", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runB(ctx, e, w) }},
		{"C", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runC(ctx, e, w) }},
		{"D", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runD(ctx, e, w) }},
		{"E", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runE(ctx, e, w) }},
		{"F", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runF(ctx, e, w) }},
		{"G", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runG(ctx, e, w) }},
		{"S", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runS(ctx, e, w) }},
		{"T", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runT(ctx, e, w) }},
		{"L", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runL(ctx, e, w) }},
		{"K", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runK(ctx, e, w) }},
		{"M", func(ctx context.Context, e *env, w io.Writer) (any, error) { return runM(ctx, e, w) }},
	}
}

// chosenScenarios reads -scenario's comma-separated names.
func chosenScenarios(list string) (map[string]bool, error) {
	all := allScenarios()
	want := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.ToUpper(strings.TrimSpace(s))
		if find(all, func(sc scenario) bool { return sc.name == s }) == nil {
			return nil, fmt.Errorf("unknown scenario %q (want A, A3, B, C, D, E, F, G, S, T, L, K or M)", s)
		}
		want[s] = true
	}
	return want, nil
}

// runScenarios runs the scenarios in want, in order, until ctx ends, and
// returns their results and the exit status (1 when one failed).
func runScenarios(ctx context.Context, e *env, w io.Writer, want map[string]bool) (map[string]any, int) {
	results := map[string]any{}
	status := 0
	for _, sc := range allScenarios() {
		if !want[sc.name] || ctx.Err() != nil {
			continue
		}
		r, err := sc.run(ctx, e, w)
		results[sc.name] = r
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: scenario %s: %v\n", sc.name, err)
			status = 1
		}
	}
	return results, status
}

// writeResults writes the results as indented JSON to path.
func writeResults(path string, results map[string]any) error {
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func printHeader(ctx context.Context, e *env, w io.Writer) {
	ver := "?"
	if info, err := e.ctl.Info(ctx, "server").Result(); err == nil {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				ver = v
			}
		}
	}
	where := "started by the harness"
	if !e.own {
		where = "given by -redis"
	}
	mode := "full"
	if e.quick {
		mode = "quick"
	}
	fmt.Fprintf(w, "asynq-throttle bench (%s run): %s %s/%s, GOMAXPROCS %d, NumCPU %d; redis %s at %s (%s)\n",
		mode, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), ver, e.opts.Addr, where)
}
