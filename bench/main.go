// Command bench measures asynq-throttle against what Go teams use today, in
// one process run, on one Redis:
//
//	go run ./bench                 # all scenarios, on a redis-server it starts
//	go run ./bench -scenario A     # one scenario (A to G, S; comma-separated; A3 alone)
//	go run ./bench -quick          # a short smoke run
//	go run ./bench -redis redis://127.0.0.1:6379/0
//
// Scenarios (see issues 5 and 13 to 16): A backlog drain, B head of line, C
// decisions/s, D middleware overhead, E quota fidelity, F slots in flight;
// and, only when named, G many keys (bytes per key, decisions/s against
// one key) and S a 60 s soak checked window by window. Variants: sleep
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
	redisURL := flag.String("redis", "", "use this Redis (redis://...) instead of starting a redis-server")
	scenarios := flag.String("scenario", "A,B,C,D,E,F", "scenarios to run, comma-separated: A, B, C, D, E, F; G (many keys) and S (soak) run only when named; A3 alone (small rates, part of A) when named")
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
	flag.Parse()
	if *bRounds < 1 {
		fmt.Fprintf(os.Stderr, "bench: -b-rounds must be at least 1, got %d\n", *bRounds)
		return 2
	}
	if *eRounds < 1 {
		fmt.Fprintf(os.Stderr, "bench: -e-rounds must be at least 1, got %d\n", *eRounds)
		return 2
	}
	if *fShort < 1 || *fLong < 1 {
		fmt.Fprintf(os.Stderr, "bench: -f-short and -f-long must be at least 1, got %d and %d\n", *fShort, *fLong)
		return 2
	}
	if *fLongTime < 100*time.Millisecond || *fLongTime > time.Minute {
		fmt.Fprintf(os.Stderr, "bench: -f-long-time must be from 100ms to 1m, got %v\n", *fLongTime)
		return 2
	}
	if *ePhase != -1 && (*ePhase < 0 || *ePhase >= 1) {
		fmt.Fprintf(os.Stderr, "bench: -e-phase must be from 0 to 1 (or -1), got %v\n", *ePhase)
		return 2
	}
	var eVarList []string
	for _, v := range strings.Split(*eVars, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		if !slices.Contains(eVariants, v) {
			fmt.Fprintf(os.Stderr, "bench: -e-variants: unknown variant %q (want %s)\n", v, strings.Join(eVariants, ", "))
			return 2
		}
		eVarList = append(eVarList, v)
	}
	var fVarList []string
	for _, v := range strings.Split(*fVars, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		if !slices.Contains(fVariants, v) {
			fmt.Fprintf(os.Stderr, "bench: -f-variants: unknown variant %q (want %s)\n", v, strings.Join(fVariants, ", "))
			return 2
		}
		fVarList = append(fVarList, v)
	}
	if *fSemaRetry < time.Second {
		fmt.Fprintf(os.Stderr, "bench: -f-sema-retry must be at least 1s (asynq's resolution), got %v\n", *fSemaRetry)
		return 2
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick && !set["e-rounds"] {
		*eRounds = 1
	}
	if *quick && !set["f-short"] {
		*fShort = 60
	}
	if *quick && !set["f-long"] {
		*fLong = 8
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	e := &env{quick: *quick, verbose: *verbose, bRounds: *bRounds, eRounds: *eRounds, eVariants: eVarList, eTrace: *eTrace, ePhase: *ePhase,
		fShort: *fShort, fLong: *fLong, fLongTime: *fLongTime, fSemaRetry: *fSemaRetry, fVariants: fVarList, runID: strconv.FormatInt(time.Now().Unix()%100000, 10)}
	if *redisURL != "" {
		opts, err := redis.ParseURL(*redisURL)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -redis: %v\n", err)
			return 2
		}
		e.opts = opts
	} else {
		srv, err := startRedis()
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return 1
		}
		defer srv.Stop()
		e.opts, e.own = &redis.Options{Addr: srv.Addr}, true
	}
	e.ctl = e.newClient(64)
	defer e.ctl.Close()
	if err := e.ctl.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: redis %s: %v\n", e.opts.Addr, err)
		return 1
	}
	if e.own {
		if err := e.ctl.FlushAll(ctx).Err(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return 1
		}
	}
	e.prov = newProvider()
	defer e.prov.Close()

	w := os.Stdout
	printHeader(ctx, e, w)
	results := map[string]any{}
	type scenario struct {
		name string
		run  func(context.Context, *env, io.Writer) (any, error)
	}
	all := []scenario{
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
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.ToUpper(strings.TrimSpace(s))
		if find(all, func(sc scenario) bool { return sc.name == s }) == nil {
			fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (want A, A3, B, C, D, E, F, G or S)\n", s)
			return 2
		}
		want[s] = true
	}
	status := 0
	began := time.Now()
	for _, sc := range all {
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
	fmt.Fprintf(w, "\ntotal wall time %v\n", time.Since(began).Round(time.Second))
	if *jsonOut != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -json: %v\n", err)
			status = 1
		}
	}
	if ctx.Err() != nil {
		return 130
	}
	return status
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
