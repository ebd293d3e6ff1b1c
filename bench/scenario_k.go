package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/metrics"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Scenario K, operator views (issue 35, item 8): what one Prometheus scrape
// (metrics.New's Collect) and one web-view poll (the dashboard's GET
// api/keys, every second per open tab) cost Redis when the limiter's 20
// keys sit beside a large database: N other keys, hashes shaped as asynq's
// tasks (N = 200,000; -quick 20,000; -k-others). Variants, on the same
// Redis, in one run:
//
//   - index: this build: Keys reads the index of the limiter's keys and
//     checks which still exist, InspectKeys reads their state in one script
//     call.
//   - scan: what every scrape and poll did before the index: SCAN MATCH
//     <prefix>:{*}:* over the whole keyspace (COUNT 1000), then one Inspect
//     per key found.
//
// Per view: the commands Redis ran (INFO commandstats delta, commands run
// inside scripts counted, INFO excluded), the commands the client sent,
// the SCAN calls, and Redis CPU (INFO cpu, used_cpu_user+sys), averaged
// over -k-rounds views; the target is at most 5 ms of Redis CPU and 50
// commands per view.

// kConf is scenario K's flags.
var kConf = struct{ others, rounds int }{200_000, 20}

// declareKFlags declares scenario K's flags; the function it returns checks
// them once flag.Parse has run.
func declareKFlags() func(quick bool, set map[string]bool) error {
	others := flag.Int("k-others", kConf.others, "scenario K: other keys in the Redis beside the limiter's 20 (-quick: 20000 unless given)")
	rounds := flag.Int("k-rounds", kConf.rounds, "scenario K: views measured per variant, averaged (-quick: 5 unless given)")
	return func(quick bool, set map[string]bool) error {
		kConf.others, kConf.rounds = *others, *rounds
		if quick && !set["k-others"] {
			kConf.others = 20_000
		}
		if quick && !set["k-rounds"] {
			kConf.rounds = 5
		}
		if kConf.others < 0 || kConf.rounds < 1 {
			return fmt.Errorf("-k-others must be at least 0 and -k-rounds at least 1, got %d and %d", kConf.others, kConf.rounds)
		}
		return nil
	}
}

// kKeys is the limiter's keys in scenario K.
const kKeys = 20

// Targets of issue 35, item 8, per view.
const (
	kMaxCPU      = 5 * time.Millisecond
	kMaxCommands = 50
)

// kRow is one view under one variant.
type kRow struct {
	View, Variant string
	Commands      float64 // commands Redis ran per view (scripts' own included)
	Sent          float64 // commands the client sent per view
	Scans         float64 // SCAN calls per view
	Scripts       float64 // script calls (FCALL, EVALSHA, EVAL) per view
	CPU           time.Duration
	Wall          time.Duration
	Keys          int // keys the view showed
}

type scenarioK struct {
	Others, Keys, Rounds int
	Rows                 []kRow
}

func runK(ctx context.Context, e *env, w io.Writer) (*scenarioK, error) {
	s := &scenarioK{Others: kConf.others, Keys: kKeys, Rounds: kConf.rounds}
	_, prefix := e.names("k", "keys")
	if e.own {
		prefix = keyspace.DefaultPrefix
	}
	others := prefix + "-others"
	fmt.Fprintf(w, "\n== K. operator views: one /metrics scrape and one web-view poll (api/keys), %d limiter keys beside %d other keys; %d views per variant\n",
		kKeys, s.Others, s.Rounds)
	defer func() { _ = e.cleanup(context.Background(), "", prefix) }()
	if !e.own {
		defer func() { _ = e.cleanup(context.Background(), "", others) }()
	}

	// The other keys: asynq's backlog of tasks, as hashes.
	fmt.Fprintf(os.Stderr, "K: writing %d other keys\n", s.Others)
	for start := 0; start < s.Others; start += 10_000 {
		p := e.ctl.Pipeline()
		for i := start; i < min(start+10_000, s.Others); i++ {
			p.HSet(ctx, fmt.Sprintf("asynq:{%s}:t:%08d", others, i), "msg", "task payload of a typical size, a few dozen bytes", "state", "pending")
		}
		if _, err := p.Exec(ctx); err != nil {
			return s, err
		}
	}

	var sent atomic.Int64
	rdb := e.newClient(16)
	defer rdb.Close()
	rdb.AddHook(sendCounter{&sent})
	lim := throttle.NewLimiter(rdb, throttle.WithPrefix(prefix))
	for i := range kKeys {
		key := fmt.Sprintf("provider%02d", i)
		if err := lim.SetLimits(ctx, key, throttle.PerSecond(10), throttle.PerMinute(300)); err != nil {
			return s, err
		}
		if _, err := lim.Take(ctx, key); err != nil {
			return s, err
		}
	}
	_ = lim.Close() // (records the keys its decisions touched)

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(lim))
	dash := dashboard.New(lim)
	scrape := func(context.Context) (int, error) {
		mfs, err := reg.Gather()
		if err != nil {
			return 0, err
		}
		for _, mf := range mfs {
			if mf.GetName() == "asynq_throttle_state_keys" {
				return int(mf.GetMetric()[0].GetGauge().GetValue()), nil
			}
		}
		return 0, fmt.Errorf("no asynq_throttle_state_keys in the scrape")
	}
	poll := func(context.Context) (int, error) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/keys", nil)
		req.Host = "localhost"
		dash.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			return 0, fmt.Errorf("api/keys: %d %s", rec.Code, rec.Body.String())
		}
		var v struct {
			Keys []json.RawMessage `json:"keys"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			return 0, err
		}
		return len(v.Keys), nil
	}
	// Before the index: a walk of the keyspace, then each key's state.
	scan := func(ctx context.Context) (int, error) {
		pattern := keyspace.ScanPattern(prefix)
		found := map[string]bool{}
		var cursor uint64
		for {
			batch, next, err := rdb.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return 0, err
			}
			for _, k := range batch {
				if name, ok := keyspace.NameOf(prefix, k); ok {
					found[name] = true
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		for name := range found {
			if _, err := lim.Inspect(ctx, name); err != nil {
				return 0, err
			}
		}
		return len(found), nil
	}
	// Warm up: the index's first listing, the script library.
	if _, err := lim.Keys(ctx); err != nil {
		return s, err
	}
	for _, v := range []struct {
		view, variant string
		run           func(context.Context) (int, error)
	}{
		{"/metrics scrape", "index", scrape},
		{"/metrics scrape", "scan", scan},
		{"web-view poll", "index", poll},
		{"web-view poll", "scan", scan},
	} {
		row, err := measureK(ctx, e, &sent, s.Rounds, v.run)
		if err != nil {
			return s, fmt.Errorf("%s, %s: %w", v.view, v.variant, err)
		}
		row.View, row.Variant = v.view, v.variant
		if row.Keys != kKeys {
			return s, fmt.Errorf("%s, %s: %d keys shown, want %d", v.view, v.variant, row.Keys, kKeys)
		}
		s.Rows = append(s.Rows, row)
	}
	printK(w, s)
	return s, nil
}

// measureK runs view rounds times between two readings of Redis's
// counters, and returns the cost of one.
func measureK(ctx context.Context, e *env, sent *atomic.Int64, rounds int, view func(context.Context) (int, error)) (kRow, error) {
	var row kRow
	cmd0, err := commandStats(ctx, e.ctl)
	if err != nil {
		return row, err
	}
	cpu0, err := redisCPU(ctx, e.ctl)
	if err != nil {
		return row, err
	}
	sent0 := sent.Load()
	start := time.Now()
	for range rounds {
		if row.Keys, err = view(ctx); err != nil {
			return row, err
		}
	}
	wall := time.Since(start)
	cpu1, err := redisCPU(ctx, e.ctl)
	if err != nil {
		return row, err
	}
	cmd1, err := commandStats(ctx, e.ctl)
	if err != nil {
		return row, err
	}
	n := float64(rounds)
	for name, st := range cmd1 {
		d := float64(st.calls - cmd0[name].calls)
		switch name {
		case "info":
			continue // the readings' own
		case "scan":
			row.Scans += d / n
		case "eval", "evalsha", "fcall", "fcall_ro", "eval_ro", "evalsha_ro":
			row.Scripts += d / n
		}
		row.Commands += d / n
	}
	row.Sent = float64(sent.Load()-sent0) / n
	row.CPU = time.Duration((cpu1 - cpu0) / n * float64(time.Second))
	row.Wall = wall / time.Duration(rounds)
	return row, nil
}

func printK(w io.Writer, s *scenarioK) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "view\tvariant\tRedis commands\tsent\tSCAN calls\tscript calls\tRedis CPU\twall\tkeys\t")
	for _, r := range s.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%v\t%v\t%d\t\n", r.View, r.Variant, r.Commands, r.Sent, r.Scans, r.Scripts,
			r.CPU.Round(10*time.Microsecond), r.Wall.Round(10*time.Microsecond), r.Keys)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "       per view, averaged over %d views: Redis commands = INFO commandstats delta (commands run inside scripts counted, INFO excluded);\n", s.Rounds)
	fmt.Fprintln(w, "       sent = commands the client sent; Redis CPU = used_cpu_user+sys delta (INFO cpu); scan = what every scrape and poll did before the index.")
	for _, r := range s.Rows {
		if r.Variant != "index" {
			continue
		}
		verdict := "meets"
		if r.CPU > kMaxCPU || r.Commands > kMaxCommands {
			verdict = "MISSES"
		}
		fmt.Fprintf(w, "  %s %s the target (at most %v of Redis CPU and %d commands at %d other keys): %.1f commands, %v\n",
			r.View, verdict, kMaxCPU, kMaxCommands, s.Others, r.Commands, r.CPU.Round(10*time.Microsecond))
	}
}

// sendCounter counts the commands a client sends, pipelined ones each.
type sendCounter struct{ n *atomic.Int64 }

func (h sendCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h sendCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h sendCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
