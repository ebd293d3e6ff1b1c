package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// decRun is one decisions/s measurement of scenario C.
type decRun struct {
	Impl       string
	Goroutines int
	Decisions  int64
	Refused    int64
	Errors     int64
	Elapsed    time.Duration
	PerSec     float64
}

// cRounds is how many alternating slices each decisions/s point is made of.
const cRounds = 4

// cRuns1 is how many times the one-goroutine point is made (its target is
// on the median ratio).
const cRuns1 = 5

type allocs struct {
	Impl                string
	AllocsPerOp, BPerOp float64
}

type scenarioC struct {
	Duration time.Duration
	Results  []decRun
	Allocs   []allocs
	Ceiling  float64 // redis-benchmark pipelined requests/s of one decide call
	// CeilingVerb is how Take called the script: FCALL or EVALSHA.
	CeilingVerb string
	// CeilingRedisRate is the same measure for redis_rate's script.
	CeilingRedisRate float64
	// ScriptUsec is the Redis time of one decide script call (commandstats).
	ScriptUsec, ScriptUsecRedisRate float64
	CeilingCmd                      string
	CeilingNote                     string
	ScriptMatches                   bool // the disk source's SHA is the script the library ran
	// Ratios1 are ours/redis_rate of each one-goroutine run; Median1 their
	// median.
	Ratios1 []float64
	Median1 float64
}

const cRate = 1_000_000 // never binds: every call takes the full path

func runC(ctx context.Context, e *env, w io.Writer) (*scenarioC, error) {
	s := &scenarioC{Duration: 1500 * time.Millisecond}
	if e.quick {
		s.Duration = 500 * time.Millisecond
	}
	fmt.Fprintf(w, "\n== C. decisions/s: Limiter.Take vs redis_rate.Allow on one key, limit %d/s (never binds), one client with PoolSize 256, %v per point in %d alternating slices\n", cRate, s.Duration, cRounds)
	_, prefix := e.names("c", "take")
	defer func() { _ = e.cleanup(context.Background(), "", prefix) }()

	rdb := e.newClient(256)
	defer rdb.Close()
	capture := &evalCapture{}
	rdb.AddHook(capture)
	lim := throttle.NewLimiter(rdb, throttle.WithPrefix(prefix))
	if err := lim.SetLimits(ctx, "c", throttle.PerSecond(cRate)); err != nil {
		return s, err
	}
	rr := redis_rate.NewLimiter(rdb)
	rrLimit := redis_rate.PerSecond(cRate)
	impls := []decImpl{
		{vOurs, func() (bool, error) {
			d, err := lim.Take(ctx, "c")
			return d.Allowed, err
		}},
		{"redis_rate", func() (bool, error) {
			r, err := rr.Allow(ctx, prefix+":c", rrLimit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}},
	}
	// Warm up: load both scripts, record the exact command each sends.
	var sent [][]any
	for _, im := range impls {
		capture.start()
		if _, err := im.op(); err != nil {
			return s, fmt.Errorf("%s: %w", im.name, err)
		}
		sent = append(sent, capture.stop())
	}

	for _, g := range []int{1, 32, 128} {
		s.measurePoint(impls, g)
	}
	if len(s.Ratios1) > 0 {
		sorted := slices.Clone(s.Ratios1)
		slices.Sort(sorted)
		s.Median1 = sorted[len(sorted)/2]
	}
	for _, im := range impls {
		s.Allocs = append(s.Allocs, measureAllocs(im.name, im.op, 2000))
	}
	// The harness's ctx can be cancelled (SIGINT), as a handler's can; a
	// context that cannot (context.Background()) takes another path in the
	// flight's timeout.
	bg := context.Background()
	s.Allocs = append(s.Allocs, measureAllocs(vOurs+", context.Background()", func() (bool, error) {
		d, err := lim.Take(bg, "c")
		return d.Allowed, err
	}, 2000))
	if err := s.ceiling(ctx, e, sent[0], sent[1]); err != nil {
		s.CeilingNote = err.Error()
	}
	progress("C: done")
	s.print(w)
	return s, nil
}

// decImpl is one of the rate limiters scenario C compares: op makes one
// decision.
type decImpl struct {
	name string
	op   func() (bool, error)
}

// measurePoint measures impls' decisions/s at g goroutines. The machine is
// shared: it alternates them in short slices so that a burst of outside
// load hits all alike. At one goroutine, where the ratio is closest to its
// target, the point is made cRuns1 times and each run's ratio kept.
func (s *scenarioC) measurePoint(impls []decImpl, g int) {
	runs := make([]decRun, len(impls))
	nRuns := 1
	if g == 1 {
		nRuns = cRuns1
	}
	for range nRuns {
		one := make([]decRun, len(impls))
		for round := range cRounds {
			for i := range impls {
				k := (i + round) % len(impls)
				r := measureDecisions(impls[k].op, g, s.Duration/cRounds)
				for _, acc := range []*decRun{&one[k], &runs[k]} {
					acc.Impl, acc.Goroutines = impls[k].name, g
					acc.Decisions += r.Decisions
					acc.Refused += r.Refused
					acc.Errors += r.Errors
					acc.Elapsed += r.Elapsed
				}
			}
		}
		if g == 1 {
			s.Ratios1 = append(s.Ratios1, (float64(one[0].Decisions)/one[0].Elapsed.Seconds())/
				(float64(one[1].Decisions)/one[1].Elapsed.Seconds()))
		}
	}
	for _, r := range runs {
		r.PerSec = float64(r.Decisions) / r.Elapsed.Seconds()
		s.Results = append(s.Results, r)
	}
}

// measureDecisions runs op from exactly g goroutines for d.
func measureDecisions(op func() (bool, error), g int, d time.Duration) decRun {
	return measureEach(g, d, func(int) (bool, error) { return op() })
}

// measureEach runs op from exactly g goroutines for d, passing each its
// index.
func measureEach(g int, d time.Duration, op func(g int) (bool, error)) decRun {
	var n, refused, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for i := range g {
		wg.Go(func() {
			for !stop.Load() {
				ok, err := op(i)
				switch {
				case err != nil:
					errs.Add(1)
				case !ok:
					refused.Add(1)
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	return decRun{Goroutines: g, Decisions: n.Load(), Refused: refused.Load(), Errors: errs.Load(),
		Elapsed: el, PerSec: float64(n.Load()) / el.Seconds()}
}

// measureAllocs counts heap allocations per serial call: a MemStats delta,
// which also counts whatever else the process does meanwhile (the fleets of
// earlier scenarios winding down), so the fewest of three rounds is kept.
func measureAllocs(name string, op func() (bool, error), n int) allocs {
	best := allocs{Impl: name, AllocsPerOp: math.Inf(1)}
	for range 3 {
		runtime.GC()
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		for range n {
			_, _ = op()
		}
		runtime.ReadMemStats(&b)
		if per := float64(b.Mallocs-a.Mallocs) / float64(n); per < best.AllocsPerOp {
			best.AllocsPerOp = per
			best.BPerOp = float64(b.TotalAlloc-a.TotalAlloc) / float64(n)
		}
	}
	return best
}

// evalCapture records the first script call (FCALL, EVALSHA or EVAL) a
// limiter sends, so that redis-benchmark replays exactly the keys and
// arguments of a Take.
type evalCapture struct {
	on   atomic.Bool
	mu   sync.Mutex
	args []any
}

func (c *evalCapture) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *evalCapture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.record(cmd)
		}
		return next(ctx, cmds)
	}
}
func (c *evalCapture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.record(cmd)
		return next(ctx, cmd)
	}
}

func (c *evalCapture) start() {
	c.mu.Lock()
	c.args = nil
	c.mu.Unlock()
	c.on.Store(true)
}

func (c *evalCapture) stop() []any {
	c.on.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.args
}

func (c *evalCapture) record(cmd redis.Cmder) {
	if !c.on.Load() {
		return
	}
	switch strings.ToLower(cmd.Name()) {
	case "fcall", "evalsha", "eval":
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.args == nil {
		c.args = append([]any(nil), cmd.Args()...)
	}
}

// ceiling measures the pipelined throughput of one call of our decide
// script, as Take sent it (FCALL of the library's function on Redis 7,
// EVALSHA where functions are not available), with redis-benchmark. For
// scale, it measures redis_rate's script (as captured from Allow) the same
// way.
func (s *scenarioC) ceiling(ctx context.Context, e *env, ours, theirs []any) error {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return fmt.Errorf("redis-benchmark not on PATH: %v", err)
	}
	if len(ours) < 3 {
		return errors.New("no script call captured from Take")
	}
	// args: fcall|evalsha|eval, name|sha|source, numkeys, keys..., argv...
	verb, id := strings.ToLower(fmt.Sprint(ours[0])), fmt.Sprint(ours[1])
	s.ScriptMatches = true
	if verb != "fcall" {
		verb, id = "evalsha", scriptSHA(ours)
		// The script Take ran is in Redis' script cache since it ran; say
		// when the files on disk are not that script (edited since the build).
		dir, err := luaDir()
		if err != nil {
			return err
		}
		lib, err1 := os.ReadFile(filepath.Join(dir, "lib.lua"))
		dec, err2 := os.ReadFile(filepath.Join(dir, "decide.lua"))
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		h := sha1.Sum([]byte(string(lib) + "\n" + string(dec)))
		if s.ScriptMatches = hex.EncodeToString(h[:]) == id; !s.ScriptMatches {
			s.CeilingNote = fmt.Sprintf("lua/lib.lua+decide.lua on disk are not the script this build runs (sha %.12s, edited since the build?): measured the latter", id)
		}
	}
	s.CeilingVerb = strings.ToUpper(verb)
	n := 100000
	if e.quick {
		n = 30000
	}
	// A ceiling is the best the server can do: best of two runs each.
	for range 2 {
		rps, usec, line, err := redisBenchmark(ctx, e, n, verb, id, ours[2:])
		if err != nil {
			return err
		}
		if rps > s.Ceiling {
			s.Ceiling, s.ScriptUsec, s.CeilingCmd = rps, usec, line
		}
		if len(theirs) < 3 {
			continue
		}
		rps, usec, _, err = redisBenchmark(ctx, e, n, "evalsha", scriptSHA(theirs), theirs[2:])
		if err != nil {
			return err
		}
		if rps > s.CeilingRedisRate {
			s.CeilingRedisRate, s.ScriptUsecRedisRate = rps, usec
		}
	}
	return nil
}

// scriptSHA returns the SHA1 of the script of a captured EVAL or EVALSHA.
func scriptSHA(args []any) string {
	if strings.EqualFold(fmt.Sprint(args[0]), "eval") {
		h := sha1.Sum([]byte(fmt.Sprint(args[1])))
		return hex.EncodeToString(h[:])
	}
	return fmt.Sprint(args[1])
}

// redisBenchmark runs VERB id args... (FCALL name or EVALSHA sha) with
// redis-benchmark, pipelined (-P 16, 50 clients, n requests), and returns
// its requests/s and the Redis time per script call (INFO commandstats,
// inner commands included).
func redisBenchmark(ctx context.Context, e *env, n int, verb, id string, args []any) (rps, usec float64, line string, err error) {
	host, port, _ := strings.Cut(e.opts.Addr, ":")
	cmdArgs := []string{"-h", host, "-p", port, "-P", "16", "-c", "50", "-n", strconv.Itoa(n), "--csv"}
	if e.opts.Password != "" {
		cmdArgs = append(cmdArgs, "-a", e.opts.Password)
		if e.opts.Username != "" {
			cmdArgs = append(cmdArgs, "--user", e.opts.Username)
		}
	}
	if e.opts.DB != 0 {
		cmdArgs = append(cmdArgs, "--dbnum", strconv.Itoa(e.opts.DB))
	}
	cmdArgs = append(cmdArgs, strings.ToUpper(verb), id)
	for _, a := range args {
		cmdArgs = append(cmdArgs, fmt.Sprint(a))
	}
	shown := make([]string, len(cmdArgs))
	for i, a := range cmdArgs {
		if a == "" {
			a = `""`
		}
		shown[i] = a
	}
	line = "redis-benchmark " + strings.Join(shown, " ")
	before, err := commandStats(ctx, e.ctl)
	if err != nil {
		return 0, 0, line, err
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "redis-benchmark", cmdArgs...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, 0, line, fmt.Errorf("redis-benchmark: %v: %s", err, errOut.String())
	}
	after, err := commandStats(ctx, e.ctl)
	if err != nil {
		return 0, 0, line, err
	}
	name := strings.ToLower(verb)
	if calls := after[name].calls - before[name].calls; calls > 0 {
		usec = float64(after[name].usec-before[name].usec) / float64(calls)
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[1]) < 2 {
		return 0, 0, line, fmt.Errorf("cannot parse redis-benchmark output %q", out.String())
	}
	rps, err = strconv.ParseFloat(recs[1][1], 64)
	return rps, usec, line, err
}

// luaDir finds the module's lua/ directory: next to this source file when
// built from a checkout, else ./lua.
func luaDir() (string, error) {
	cands := []string{"lua"}
	if _, file, _, ok := runtime.Caller(0); ok {
		cands = append([]string{filepath.Join(filepath.Dir(file), "..", "lua")}, cands...)
	}
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, "decide.lua")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("cannot find lua/decide.lua: run from the module root")
}

func (s *scenarioC) print(w io.Writer) {
	t := newTable("goroutines", "ours/s", "redis_rate/s", "ours/redis_rate", "target", "ours/ceiling")
	targets := map[int]string{1: ">= 0.95x (median)", 32: ">= 2x", 128: ""}
	for _, g := range []int{1, 32, 128} {
		o := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == g })
		rr := find(s.Results, func(r decRun) bool { return r.Impl == "redis_rate" && r.Goroutines == g })
		if o == nil || rr == nil {
			continue
		}
		ceil := "-"
		if s.Ceiling > 0 {
			ceil = fmt.Sprintf("%.0f%%", 100*o.PerSec/s.Ceiling)
			if g == 128 {
				ceil += " (>= 60%)"
			}
		}
		bad := ""
		if o.Errors+o.Refused+rr.Errors+rr.Refused > 0 {
			bad = fmt.Sprintf(" [errors %d/%d refused %d/%d]", o.Errors, rr.Errors, o.Refused, rr.Refused)
		}
		r := ratio(o.PerSec, rr.PerSec)
		if g == 1 && s.Median1 > 0 {
			r = fmt.Sprintf("%.2fx", s.Median1)
		}
		t.row(strconv.Itoa(g), []string{fmt.Sprintf("%.0f", o.PerSec), fmt.Sprintf("%.0f", rr.PerSec),
			r + bad, targets[g], ceil})
	}
	t.print(w)
	if len(s.Ratios1) > 0 {
		l := make([]string, len(s.Ratios1))
		for i, r := range s.Ratios1 {
			l[i] = fmt.Sprintf("%.2fx", r)
		}
		fmt.Fprintf(w, "1 goroutine, ours/redis_rate in each of %d runs: %s; median %.2fx %s (target >= 0.95x)\n",
			len(s.Ratios1), strings.Join(l, " "), s.Median1, verdict(s.Median1 >= 0.95))
	}
	for _, a := range s.Allocs {
		target := ""
		if a.Impl == vOurs {
			target = " (target <= 2, the figure before issue 16; ctx cancellable, as a handler's)"
		}
		fmt.Fprintf(w, "allocations per decision, %-33s %5.1f allocs, %6.0f B%s\n", a.Impl+":", a.AllocsPerOp, a.BPerOp, target)
	}
	if s.Ceiling > 0 {
		fmt.Fprintf(w, "pipelined %s ceiling of our decide script (best of 2): %.0f requests/s, %.1f us of Redis time per call (redis_rate's script, EVALSHA: %.0f/s, %.1f us)\n  (%s)\n",
			s.CeilingVerb, s.Ceiling, s.ScriptUsec, s.CeilingRedisRate, s.ScriptUsecRedisRate, s.CeilingCmd)
	}
	if o := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == 128 }); o != nil && s.Ceiling > 0 && o.PerSec > s.Ceiling {
		fmt.Fprintln(w, "  (ours is above it: one script run decides for several callers, so a one-decision call is no upper bound)")
	}
	o1 := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == 1 })
	rr1 := find(s.Results, func(r decRun) bool { return r.Impl == "redis_rate" && r.Goroutines == 1 })
	if o1 != nil && rr1 != nil && o1.PerSec > 0 && rr1.PerSec > 0 && s.ScriptUsec > 0 {
		// At one goroutine a decision is a round trip plus the script's run
		// in Redis: the gap between the two latencies against the gap
		// between the two scripts' Redis time shows where the time goes.
		lo, lr := 1e6/o1.PerSec, 1e6/rr1.PerSec
		fmt.Fprintf(w, "1 goroutine, all runs: %.1f us per decision, redis_rate %.1f us; between them %.1f us, and our script runs %.1f us longer inside Redis\n",
			lo, lr, lo-lr, s.ScriptUsec-s.ScriptUsecRedisRate)
	}
	if s.CeilingNote != "" {
		fmt.Fprintf(w, "ceiling note: %s\n", s.CeilingNote)
	}
	for _, g := range []int{32, 128} {
		if o := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == g }); o != nil {
			rr := find(s.Results, func(r decRun) bool { return r.Impl == "redis_rate" && r.Goroutines == g })
			fmt.Fprintf(w, "ratio ours/redis_rate at %d goroutines: %s (before issue 16: %s)\n", g, ratio(o.PerSec, rr.PerSec), map[int]string{32: "3.06x", 128: "6.17x"}[g])
		}
	}
}
