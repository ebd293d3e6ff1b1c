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

type allocs struct {
	Impl                string
	AllocsPerOp, BPerOp float64
}

type scenarioC struct {
	Duration time.Duration
	Results  []decRun
	Allocs   []allocs
	Ceiling  float64 // redis-benchmark pipelined EVALSHA requests/s
	// CeilingRedisRate is the same measure for redis_rate's script.
	CeilingRedisRate float64
	// ScriptUsec is the Redis time of one decide script call (commandstats).
	ScriptUsec, ScriptUsecRedisRate float64
	CeilingCmd                      string
	CeilingNote                     string
	ScriptMatches                   bool // the disk source's SHA is the script the library ran
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
	impls := []struct {
		name string
		op   func() (bool, error)
	}{
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

	// The machine is shared: alternate the two in short slices so that a
	// burst of outside load hits both alike.
	for _, g := range []int{1, 32, 128} {
		runs := make([]decRun, len(impls))
		for round := range cRounds {
			for i := range impls {
				im := impls[(i+round)%len(impls)]
				k := (i + round) % len(impls)
				r := measureDecisions(im.op, g, s.Duration/cRounds)
				runs[k].Impl, runs[k].Goroutines = im.name, g
				runs[k].Decisions += r.Decisions
				runs[k].Refused += r.Refused
				runs[k].Errors += r.Errors
				runs[k].Elapsed += r.Elapsed
			}
		}
		for _, r := range runs {
			r.PerSec = float64(r.Decisions) / r.Elapsed.Seconds()
			s.Results = append(s.Results, r)
		}
	}
	for _, im := range impls {
		s.Allocs = append(s.Allocs, measureAllocs(im.name, im.op, 2000))
	}
	if err := s.ceiling(ctx, e, rdb, sent[0], sent[1]); err != nil {
		s.CeilingNote = err.Error()
	}
	progress("C: done")
	s.print(w)
	return s, nil
}

// measureDecisions runs op from exactly g goroutines for d.
func measureDecisions(op func() (bool, error), g int, d time.Duration) decRun {
	var n, refused, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range g {
		wg.Go(func() {
			for !stop.Load() {
				ok, err := op()
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

// evalCapture records the first EVALSHA/EVAL the limiter sends, so that
// redis-benchmark replays exactly the keys and arguments of a Take.
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
	name := strings.ToLower(cmd.Name())
	if name != "evalsha" && name != "eval" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.args == nil {
		c.args = append([]any(nil), cmd.Args()...)
	}
}

// ceiling measures the pipelined EVALSHA throughput of our decide script
// with redis-benchmark: the script loaded from lua/lib.lua + lua/decide.lua
// on disk, replayed with the keys and arguments Take sent. For scale, it
// measures redis_rate's script (as captured from Allow) the same way.
func (s *scenarioC) ceiling(ctx context.Context, e *env, rdb *redis.Client, ours, theirs []any) error {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return fmt.Errorf("redis-benchmark not on PATH: %v", err)
	}
	dir, err := luaDir()
	if err != nil {
		return err
	}
	lib, err1 := os.ReadFile(filepath.Join(dir, "lib.lua"))
	dec, err2 := os.ReadFile(filepath.Join(dir, "decide.lua"))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	disk, err := rdb.ScriptLoad(ctx, string(lib)+string(dec)).Result()
	if err != nil {
		return fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	if len(ours) < 3 {
		return errors.New("no EVALSHA captured from Take")
	}
	// args: evalsha|eval, sha|source, numkeys, keys..., argv...
	// The script Take ran is in Redis' script cache since it ran; when the
	// files on disk are not that script (edited since the build), measure
	// the one the library runs.
	sha := scriptSHA(ours)
	s.ScriptMatches = sha == disk
	if !s.ScriptMatches {
		s.CeilingNote = fmt.Sprintf("lua/lib.lua+decide.lua on disk (sha %.12s) are not the script this build runs (sha %.12s, edited since the build?): measured the latter", disk, sha)
	}
	n := 100000
	if e.quick {
		n = 30000
	}
	// A ceiling is the best the server can do: best of two runs each.
	for range 2 {
		rps, usec, line, err := redisBenchmark(ctx, e, n, sha, ours[2:])
		if err != nil {
			return err
		}
		if rps > s.Ceiling {
			s.Ceiling, s.ScriptUsec, s.CeilingCmd = rps, usec, line
		}
		if len(theirs) < 3 {
			continue
		}
		rps, usec, _, err = redisBenchmark(ctx, e, n, scriptSHA(theirs), theirs[2:])
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

// redisBenchmark runs EVALSHA sha args... with redis-benchmark, pipelined
// (-P 16, 50 clients, n requests), and returns its requests/s and the
// Redis time per script call (INFO commandstats, inner commands included).
func redisBenchmark(ctx context.Context, e *env, n int, sha string, args []any) (rps, usec float64, line string, err error) {
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
	cmdArgs = append(cmdArgs, "EVALSHA", sha)
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
	if calls := after["evalsha"].calls - before["evalsha"].calls; calls > 0 {
		usec = float64(after["evalsha"].usec-before["evalsha"].usec) / float64(calls)
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
	targets := map[int]string{1: ">= 0.95x", 32: ">= 2x", 128: ""}
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
		t.row(strconv.Itoa(g), []string{fmt.Sprintf("%.0f", o.PerSec), fmt.Sprintf("%.0f", rr.PerSec),
			ratio(o.PerSec, rr.PerSec) + bad, targets[g], ceil})
	}
	t.print(w)
	for _, a := range s.Allocs {
		target := ""
		if a.Impl == vOurs {
			target = " (target <= 4)"
		}
		fmt.Fprintf(w, "allocations per decision, %-10s %5.1f allocs, %6.0f B%s\n", a.Impl+":", a.AllocsPerOp, a.BPerOp, target)
	}
	if s.Ceiling > 0 {
		fmt.Fprintf(w, "pipelined EVALSHA ceiling of our decide script (best of 2): %.0f requests/s, %.1f us of Redis time per call (redis_rate's script, same way: %.0f/s, %.1f us)\n  (%s)\n",
			s.Ceiling, s.ScriptUsec, s.CeilingRedisRate, s.ScriptUsecRedisRate, s.CeilingCmd)
	}
	if o := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == 128 }); o != nil && s.Ceiling > 0 && o.PerSec > s.Ceiling {
		fmt.Fprintln(w, "  (ours is above it: one script run decides for several callers, so a one-decision EVALSHA is no upper bound)")
	}
	o1 := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == 1 })
	rr1 := find(s.Results, func(r decRun) bool { return r.Impl == "redis_rate" && r.Goroutines == 1 })
	if o1 != nil && rr1 != nil && o1.PerSec > 0 && rr1.PerSec > 0 && s.ScriptUsec > 0 {
		// At one goroutine a decision is a round trip plus the script's run
		// in Redis: the gap between the two latencies against the gap
		// between the two scripts' Redis time shows where the time goes.
		lo, lr := 1e6/o1.PerSec, 1e6/rr1.PerSec
		fmt.Fprintf(w, "1 goroutine: %.1f us per decision, redis_rate %.1f us; of the %.1f us between them, %.1f us is the longer script run inside Redis\n",
			lo, lr, lo-lr, s.ScriptUsec-s.ScriptUsecRedisRate)
		need := lr / 0.95
		fmt.Fprintf(w, "  0.95x needs %.1f us per decision: our script would have to run in %.1f us instead of %.1f (redis_rate's: %.1f)\n",
			need, s.ScriptUsec-(lo-need), s.ScriptUsec, s.ScriptUsecRedisRate)
	}
	if s.CeilingNote != "" {
		fmt.Fprintf(w, "ceiling note: %s\n", s.CeilingNote)
	}
	if o := find(s.Results, func(r decRun) bool { return r.Impl == vOurs && r.Goroutines == 32 }); o != nil {
		rr := find(s.Results, func(r decRun) bool { return r.Impl == "redis_rate" && r.Goroutines == 32 })
		fmt.Fprintf(w, "ratio ours/redis_rate at 32 goroutines: %s\n", ratio(o.PerSec, rr.PerSec))
	}
}
