package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario G, many keys: one key per tenant ("slack:T00042"), each with two
// tiers, as WithKeyFunc makes them. It measures what a key costs in Redis
// while it only has limits (idle) and once it has bucket state (active),
// where those bytes go, how many decisions per second many keys get against
// one key, and what a process keeps per key once the keys go idle.

// gTenantLimits are every tenant key's limits.
var gTenantLimits = []throttle.Limit{throttle.PerSecond(50), throttle.PerMinute(1000)}

// gHotLimits never bind (the one-key and 32-key comparisons): every
// decision is admitted, as the tenants' are.
var gHotLimits = []throttle.Limit{throttle.PerSecond(cRate), throttle.PerMinute(60 * cRate)}

// gRun is one decisions/s point of scenario G.
type gRun struct {
	Variant    string
	Goroutines int
	Decisions  int64
	Errors     int64
	Refused    int64
	Elapsed    time.Duration
	PerSec     float64
	CPUPerDec  time.Duration // Redis CPU (INFO cpu) per decision
	Migrations int64         // first-touch migrations during the runs (EXISTS calls)
	ScriptRuns int64         // FCALL/EVALSHA/EVAL calls
	ScriptUsec int64         // their Redis time (commandstats)
}

// memRow is one line of the byte breakdown.
type memRow struct {
	What   string
	PerKey float64
	Note   string
}

type scenarioG struct {
	Keys    int
	Prefix  string
	Example string // one tenant key's Redis key

	SetLimitsTime, TakeTime time.Duration

	// Redis bytes per key: INFO used_memory delta / keys, and MEMORY USAGE
	// (SAMPLES 0) averaged over a sample.
	IdleInfo, IdleUsage     float64
	ActiveInfo, ActiveUsage float64
	BusyUsage               float64
	IdleEnc, ActiveEnc      map[string]int
	BusyEnc                 map[string]int
	Sample, BusySample      int
	IdleFields, ActiveField map[string]string // a sample key's hash
	BusyT                   string
	Breakdown               []memRow

	Runs []gRun

	// Process heap (runtime.MemStats.HeapAlloc after GC).
	Heap0, HeapOp, HeapLive, HeapIdle uint64
	IdleWait                          time.Duration
	IdleSwept                         bool
	IdleSkipped                       bool
}

func runG(ctx context.Context, e *env, w io.Writer) (*scenarioG, error) {
	s := &scenarioG{Keys: 100_000, Sample: 1000, BusySample: 1000}
	slice := 750 * time.Millisecond
	if e.quick {
		s.Keys, s.Sample, s.BusySample, slice = 10_000, 200, 200, 250*time.Millisecond
		s.IdleSkipped = true
	}
	// Production key names on the harness's own Redis; a run prefix on a
	// shared one (then the figures include the longer names).
	_, s.Prefix = e.names("g", "keys")
	if e.own {
		s.Prefix = "throttle" // the default prefix
	}
	fmt.Fprintf(w, "\n== G. many keys: %d tenant keys (slack:T00000 ...), each %v + %v, against one key and 32 keys (%v each, never binding); %v slices\n",
		s.Keys, gTenantLimits[0], gTenantLimits[1], gHotLimits[0], slice)
	defer func() { _ = e.cleanup(context.Background(), "", s.Prefix) }()

	rdb := e.newClient(256)
	defer rdb.Close()
	k := newGKeys(s.Keys, s.Prefix)
	s.Example = k.redisKey(k.names[0])

	// Two Limiters, as two processes would have: an operator's that sets the
	// limits, a worker's that decides.
	op := throttle.NewLimiter(rdb, throttle.WithPrefix(s.Prefix))
	lim := throttle.NewLimiter(rdb, throttle.WithPrefix(s.Prefix))
	if err := warmUp(ctx, op, lim, k.hot); err != nil {
		return s, err
	}
	s.Heap0 = heapAfterGC()
	used0, err := usedMemory(ctx, rdb)
	if err != nil {
		return s, err
	}
	if err := s.measureIdle(ctx, rdb, op, k, used0); err != nil {
		return s, err
	}
	if err := s.measureActive(ctx, rdb, lim, k, used0); err != nil {
		return s, err
	}
	if err := s.measureRates(ctx, e, lim, k, slice); err != nil {
		return s, err
	}
	if err := s.measureBusy(ctx, rdb, lim, k); err != nil {
		return s, err
	}
	// Where the bytes go: the same key names and field values written by
	// hand, one element at a time, on another database.
	if s.Breakdown, err = breakdown(ctx, e, s, k.names, k.redisKey); err != nil {
		return s, err
	}
	if !s.IdleSkipped {
		s.waitIdle(ctx)
	}
	runtime.KeepAlive(op)
	runtime.KeepAlive(lim)
	s.print(w)
	return s, nil
}

// gKeys are scenario G's keys: the tenants', the 32 hot ones, and the
// Redis key of a name under the run's prefix.
type gKeys struct {
	names, hot []string
	redisKey   func(name string) string
}

func newGKeys(n int, prefix string) gKeys {
	k := gKeys{names: make([]string, n), hot: make([]string, 32)}
	for i := range k.names {
		k.names[i] = fmt.Sprintf("slack:T%05d", i)
	}
	for i := range k.hot {
		k.hot[i] = fmt.Sprintf("hot-%02d", i)
	}
	k.redisKey = func(name string) string { return prefix + ":{" + name + "}:b" }
	return k
}

// warmUp sets the hot keys' limits and decides on them, each Limiter on
// keys of its own, so that the connection pool and buffers exist before
// the first heap figure.
func warmUp(ctx context.Context, op, lim *throttle.Limiter, hot []string) error {
	for _, k := range append([]string{"one"}, hot...) {
		if err := op.SetLimits(ctx, k, gHotLimits...); err != nil {
			return fmt.Errorf("SetLimits %s: %w", k, err)
		}
	}
	return parallel(64, 20_000, func(i int) error {
		_, err := lim.Take(ctx, hot[i%len(hot)])
		return err
	})
}

// measureIdle sets every tenant key's limits and measures what an idle key
// (limits only) costs, from used_memory at used0.
func (s *scenarioG) measureIdle(ctx context.Context, rdb *redis.Client, op *throttle.Limiter, k gKeys, used0 int64) error {
	start := time.Now()
	if err := parallel(64, s.Keys, func(i int) error { return op.SetLimits(ctx, k.names[i], gTenantLimits...) }); err != nil {
		return fmt.Errorf("SetLimits: %w", err)
	}
	s.SetLimitsTime = time.Since(start)
	s.HeapOp = heapAfterGC()
	used1, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	s.IdleInfo = float64(used1-used0) / float64(s.Keys)
	s.IdleUsage, s.IdleEnc, err = memoryUsage(ctx, rdb, sampleKeys(k.names[:], s.Sample, k.redisKey))
	if err != nil {
		return err
	}
	if s.IdleFields, err = rdb.HGetAll(ctx, k.redisKey(k.names[0])).Result(); err != nil {
		return err
	}
	progress("G: limits on %d keys in %v: %.0f B/key (INFO), %.0f B/key (MEMORY USAGE)", s.Keys, s.SetLimitsTime.Round(time.Millisecond), s.IdleInfo, s.IdleUsage)
	return nil
}

// measureActive makes one decision on each tenant key, which writes its
// bucket state, and measures what an active key costs.
func (s *scenarioG) measureActive(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, k gKeys, used0 int64) error {
	start := time.Now()
	var refused atomic.Int64
	if err := parallel(64, s.Keys, func(i int) error {
		d, err := lim.Take(ctx, k.names[i])
		if err == nil && !d.Allowed {
			refused.Add(1)
		}
		return err
	}); err != nil {
		return fmt.Errorf("Take: %w", err)
	}
	s.TakeTime = time.Since(start)
	if refused.Load() > 0 {
		return fmt.Errorf("%d first decisions refused", refused.Load())
	}
	s.HeapLive = heapAfterGC()
	used2, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	s.ActiveInfo = float64(used2-used0) / float64(s.Keys)
	s.ActiveUsage, s.ActiveEnc, err = memoryUsage(ctx, rdb, sampleKeys(k.names, s.Sample, k.redisKey))
	if err != nil {
		return err
	}
	if s.ActiveField, err = rdb.HGetAll(ctx, k.redisKey(k.names[0])).Result(); err != nil {
		return err
	}
	progress("G: one decision on each key in %v: %.0f B/key (INFO), %.0f B/key (MEMORY USAGE)", s.TakeTime.Round(time.Millisecond), s.ActiveInfo, s.ActiveUsage)
	return nil
}

// gVariant is a way of spreading decisions over keys: key names the key of
// goroutine g's n-th decision.
type gVariant struct {
	name string
	key  func(g int, n int64) string
}

// measureRates measures decisions/s on one key, 32 keys (one per goroutine
// of 32) and all keys in turn, in alternating slices, so that outside load
// hits all alike. It runs within a minute of the decisions above, so the
// worker's Limiter still knows every key (a key it forgot costs one
// migration check again).
func (s *scenarioG) measureRates(ctx context.Context, e *env, lim *throttle.Limiter, k gKeys, slice time.Duration) error {
	variants := []gVariant{
		{"one key", func(int, int64) string { return "one" }},
		{"32 keys", func(g int, _ int64) string { return k.hot[g%len(k.hot)] }},
		{fmt.Sprintf("%d keys", s.Keys), func(_ int, n int64) string { return k.names[n%int64(len(k.names))] }},
	}
	var next atomic.Int64
	for _, g := range []int{1, 32} {
		runs := make([]gRun, len(variants))
		for round := range cRounds {
			for i := range variants {
				j := (i + round) % len(variants)
				if err := runs[j].measure(ctx, e, lim, variants[j], g, slice, &next); err != nil {
					return err
				}
			}
		}
		for _, r := range runs {
			r.PerSec = float64(r.Decisions) / r.Elapsed.Seconds()
			if r.Decisions > 0 {
				r.CPUPerDec /= time.Duration(r.Decisions)
			}
			s.Runs = append(s.Runs, r)
			progress("G: %s, %d goroutines: %.0f decisions/s", r.Variant, r.Goroutines, r.PerSec)
		}
	}
	return nil
}

// measure adds to r one slice of decisions by g goroutines spread over keys
// as v says, and the Redis CPU and commands they cost. next counts the
// decisions of every slice.
func (r *gRun) measure(ctx context.Context, e *env, lim *throttle.Limiter, v gVariant, g int, slice time.Duration, next *atomic.Int64) error {
	before, err := redisStats(ctx, e)
	if err != nil {
		return err
	}
	m := measureKeyed(g, slice, func(g int) (bool, error) {
		d, err := lim.Take(ctx, v.key(g, next.Add(1)))
		return d.Allowed, err
	})
	after, err := redisStats(ctx, e)
	if err != nil {
		return err
	}
	r.Variant, r.Goroutines = v.name, g
	r.Decisions += m.Decisions
	r.Errors += m.Errors
	r.Refused += m.Refused
	r.Elapsed += m.Elapsed
	r.CPUPerDec += time.Duration((after.cpu - before.cpu) * float64(time.Second))
	r.Migrations += after.cmds["exists"].calls - before.cmds["exists"].calls
	for _, c := range []string{"fcall", "evalsha", "eval"} {
		r.ScriptRuns += after.cmds[c].calls - before.cmds[c].calls
		r.ScriptUsec += after.cmds[c].usec - before.cmds[c].usec
	}
	return nil
}

// measureBusy measures busy keys: a key whose minute tier owes more writes
// a longer T.
func (s *scenarioG) measureBusy(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, k gKeys) error {
	busy := k.names[len(k.names)-s.BusySample:]
	if err := parallel(64, len(busy), func(i int) error {
		_, err := lim.Take(ctx, busy[i], throttle.Cost(20))
		return err
	}); err != nil {
		return fmt.Errorf("TakeN: %w", err)
	}
	var err error
	s.BusyUsage, s.BusyEnc, err = memoryUsage(ctx, rdb, sampleKeys(busy, len(busy), k.redisKey))
	if err != nil {
		return err
	}
	s.BusyT, err = rdb.HGet(ctx, k.redisKey(busy[0]), "T").Result()
	return err
}

// waitIdle measures the process's memory once the keys go idle: a Limiter
// forgets a key a minute after its last use, at its next sweep (every
// minute).
func (s *scenarioG) waitIdle(ctx context.Context) {
	progress("G: waiting up to 150s for both Limiters to forget the idle keys")
	start := time.Now()
	target := s.Heap0 + (s.HeapLive-s.Heap0)/10
	for {
		s.HeapIdle = heapAfterGC()
		if s.HeapIdle <= target {
			s.IdleSwept = true
			break
		}
		if time.Since(start) > 150*time.Second || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Second)
	}
	s.IdleWait = time.Since(start)
}

// memStep is one element the breakdown writes to every key: cmd writes it
// to the i-th.
type memStep struct {
	what, note string
	cmd        func(p redis.Pipeliner, i int)
}

// measureSteps empties c's database, writes each step to n keys in turn,
// and reports what each step adds to used_memory per key.
func measureSteps(ctx context.Context, c *redis.Client, n int, steps ...memStep) ([]memRow, error) {
	if err := c.FlushDB(ctx).Err(); err != nil {
		return nil, err
	}
	var rows []memRow
	prev, err := usedMemory(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		for lo := 0; lo < n; lo += 1000 {
			p := c.Pipeline()
			for i := lo; i < min(lo+1000, n); i++ {
				st.cmd(p, i)
			}
			if _, err := p.Exec(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", st.what, err)
			}
		}
		used, err := usedMemory(ctx, c)
		if err != nil {
			return nil, err
		}
		rows = append(rows, memRow{What: st.what, PerKey: float64(used-prev) / float64(n), Note: st.note})
		prev = used
	}
	return rows, nil
}

// parallel runs fn(0..n-1) on g goroutines and returns the first error.
// A call that times out (a shared machine under load) is tried again, up
// to three times.
func parallel(g, n int, fn func(i int) error) error {
	once := fn
	fn = func(i int) error {
		err := once(i)
		for try := 1; try < 3 && errors.Is(err, context.DeadlineExceeded); try++ {
			err = once(i)
		}
		return err
	}
	var next atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range g {
		wg.Go(func() {
			for first.Load() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}

// measureKeyed is measureEach as a gRun.
func measureKeyed(g int, d time.Duration, op func(g int) (bool, error)) gRun {
	r := measureEach(g, d, op)
	return gRun{Goroutines: g, Decisions: r.Decisions, Refused: r.Refused, Errors: r.Errors, Elapsed: r.Elapsed}
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// usedMemory reads used_memory from INFO memory.
func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory without used_memory")
}

// sampleKeys picks n of names, evenly spread, as Redis keys.
func sampleKeys(names []string, n int, redisKey func(string) string) []string {
	n = min(n, len(names))
	out := make([]string, n)
	for i := range n {
		out[i] = redisKey(names[i*len(names)/n])
	}
	return out
}

// memoryUsage averages MEMORY USAGE (SAMPLES 0: every element counted) over
// keys and counts their OBJECT ENCODINGs.
func memoryUsage(ctx context.Context, c *redis.Client, keys []string) (float64, map[string]int, error) {
	pipe := c.Pipeline()
	usage := make([]*redis.IntCmd, len(keys))
	enc := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		usage[i] = pipe.MemoryUsage(ctx, k, 0)
		enc[i] = pipe.ObjectEncoding(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, nil, fmt.Errorf("MEMORY USAGE / OBJECT ENCODING: %w", err)
	}
	var sum int64
	encs := map[string]int{}
	for i := range keys {
		sum += usage[i].Val()
		encs[enc[i].Val()]++
	}
	return float64(sum) / float64(len(keys)), encs, nil
}

// breakdown writes the keys' elements by hand on another database, one
// step at a time, and reports each step's used_memory delta per key.
func breakdown(ctx context.Context, e *env, s *scenarioG, names []string, redisKey func(string) string) ([]memRow, error) {
	o := *e.opts
	o.DB = e.opts.DB + 1
	o.PoolSize = 8
	c := redis.NewClient(&o)
	defer c.Close()
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		return nil, fmt.Errorf("breakdown needs an empty db %d (DBSIZE %d, %v)", o.DB, n, err)
	}
	defer c.FlushDB(context.Background())
	n := len(names)
	L, T, busyT := s.IdleFields["L"], s.ActiveField["T"], s.BusyT
	short := func(name string) string { return "t:{" + name + "}:b" }
	fresh := func(steps ...memStep) ([]memRow, error) { return measureSteps(ctx, c, n, steps...) }
	ttl := 7 * 24 * time.Hour
	rows, err := fresh(
		memStep{"key: dict entry, name, a 1-byte string", fmt.Sprintf("%q (%d B)", redisKey(names[0]), len(redisKey(names[0]))),
			func(p redis.Pipeliner, i int) { p.Set(ctx, redisKey(names[i]), "x", 0) }},
		memStep{"  the string -> a hash holding L (listpack)", fmt.Sprintf("L = %q (%d B)", L, len(L)),
			func(p redis.Pipeliner, i int) {
				p.Del(ctx, redisKey(names[i]))
				p.HSet(ctx, redisKey(names[i]), "L", L)
			}},
		memStep{"  + its TTL (expires dict entry)", "every key expires after WithIdleExpiry",
			func(p redis.Pipeliner, i int) { p.Expire(ctx, redisKey(names[i]), ttl) }},
		memStep{"  + T, the bucket state (active)", fmt.Sprintf("T = %q (%d B)", T, len(T)),
			func(p redis.Pipeliner, i int) { p.HSet(ctx, redisKey(names[i]), "T", T) }},
		memStep{"  T of a busier key (> 64 B: hashtable)", fmt.Sprintf("T = %q (%d B)", busyT, len(busyT)),
			func(p redis.Pipeliner, i int) { p.HSet(ctx, redisKey(names[i]), "T", busyT) }},
	)
	if err != nil {
		return nil, err
	}
	alt, err := fresh(
		memStep{"the three steps above at once, shorter name", fmt.Sprintf("%q (%d B)", short(names[0]), len(short(names[0]))),
			func(p redis.Pipeliner, i int) {
				p.HSet(ctx, short(names[i]), "L", L)
				p.Expire(ctx, short(names[i]), ttl)
			}},
		memStep{"  + T", "",
			func(p redis.Pipeliner, i int) { p.HSet(ctx, short(names[i]), "T", T) }},
	)
	if err != nil {
		return nil, err
	}
	noTTL, err := fresh(
		memStep{"the first two steps at once (no TTL)", "", func(p redis.Pipeliner, i int) { p.HSet(ctx, redisKey(names[i]), "L", L) }},
	)
	if err != nil {
		return nil, err
	}
	return slices.Concat(rows, alt, noTTL), nil
}

func (s *scenarioG) print(w io.Writer) {
	perKey := func(a, b uint64) string {
		if a < b {
			return "0"
		}
		return fmt.Sprintf("%.0f", float64(a-b)/float64(s.Keys))
	}
	enc := func(m map[string]int) string {
		var parts []string
		for k, v := range m {
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
		slices.Sort(parts)
		return strings.Join(parts, ", ")
	}
	fmt.Fprintf(w, "  Redis memory per key (%s ...):\n", s.Example)
	t := newTable("  key state", "INFO used_memory delta", "MEMORY USAGE (sample)", "target", "encodings (sample)")
	t.row("  idle: limits only", []string{fmt.Sprintf("%.0f B", s.IdleInfo), fmt.Sprintf("%.0f B", s.IdleUsage), "< 200 B", enc(s.IdleEnc)})
	t.row("  active: limits + state", []string{fmt.Sprintf("%.0f B", s.ActiveInfo), fmt.Sprintf("%.0f B", s.ActiveUsage), "< 350 B", enc(s.ActiveEnc)})
	t.row(fmt.Sprintf("  busy: minute tier owing 21 (%d keys)", s.BusySample), []string{"-", fmt.Sprintf("%.0f B", s.BusyUsage), "< 350 B", enc(s.BusyEnc)})
	t.print(w)
	fmt.Fprintf(w, "  hash of an idle key: %s; active: %s\n", fields(s.IdleFields), fields(s.ActiveField))
	fmt.Fprintf(w, "  SetLimits on %d keys: %v (64 goroutines); one Take on each: %v\n", s.Keys, s.SetLimitsTime.Round(time.Millisecond), s.TakeTime.Round(time.Millisecond))
	fmt.Fprintln(w, "  where the bytes go (INFO used_memory delta per key, each step written by hand on another db):")
	bt := newTable("    step", "B/key", "what")
	for _, r := range s.Breakdown {
		bt.row("    "+r.What, []string{fmt.Sprintf("%.0f", r.PerKey), r.Note})
	}
	bt.print(w)

	fmt.Fprintln(w, "  decisions/s (Limiter.Take, every decision admitted):")
	dt := newTable("  goroutines", "variant", "decisions/s", "vs one key", "Redis CPU/decision", "decisions/script run", "us/script run", "errors", "refused", "migration checks")
	for _, r := range s.Runs {
		one := find(s.Runs, func(o gRun) bool { return o.Goroutines == r.Goroutines && o.Variant == "one key" })
		rel := "-"
		if one != nil {
			rel = ratio(r.PerSec, one.PerSec)
		}
		perRun, usec := "-", "-"
		if r.ScriptRuns > 0 {
			perRun = fmt.Sprintf("%.2f", float64(r.Decisions)/float64(r.ScriptRuns))
			usec = fmt.Sprintf("%.1f", float64(r.ScriptUsec)/float64(r.ScriptRuns))
		}
		dt.row("  "+strconv.Itoa(r.Goroutines), []string{r.Variant, fmt.Sprintf("%.0f", r.PerSec), rel,
			r.CPUPerDec.Round(100 * time.Nanosecond).String(), perRun, usec, strconv.FormatInt(r.Errors, 10),
			strconv.FormatInt(r.Refused, 10), strconv.FormatInt(r.Migrations, 10)})
	}
	dt.print(w)
	fmt.Fprintln(w, "  notes: one key: decisions in flight together share one script run; 32 keys, one per goroutine, and")
	fmt.Fprintln(w, "         the tenant keys in turn never do (one script run each, pipelined): the second isolates what")
	fmt.Fprintln(w, "         the number of keys costs from what sharing a run saves. Target: tenant keys within 10 % of one key.")
	fmt.Fprintln(w, "         Redis CPU = used_cpu_user+sys delta (I/O included); us/script run = commandstats of FCALL (Lua only).")

	fmt.Fprintln(w, "  process heap (HeapAlloc after GC), two Limiters (the operator's set the limits, the worker's decided):")
	fmt.Fprintf(w, "    per key while in use: %s B (worker, after one Take), %s B (operator, after SetLimits)\n",
		perKey(s.HeapLive, s.HeapOp), perKey(s.HeapOp, s.Heap0))
	switch {
	case s.IdleSkipped:
		fmt.Fprintln(w, "    after the keys go idle: skipped (-quick); BenchmarkIdleKeysRetained measures it")
	case s.IdleSwept:
		fmt.Fprintf(w, "    after the keys go idle: %s B per key retained (both Limiters, %.1f MB in all), %v after the last decision\n",
			perKey(s.HeapIdle, s.Heap0), float64(max(s.HeapIdle, s.Heap0)-s.Heap0)/1e6, s.IdleWait.Round(time.Second))
	default:
		fmt.Fprintf(w, "    after the keys go idle: NOT released within %v: %s B per key still held\n", s.IdleWait.Round(time.Second), perKey(s.HeapIdle, s.Heap0))
	}
}

// fields formats a hash sorted by field.
func fields(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
