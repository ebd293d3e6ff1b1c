// Command sync-worker is a background sync pipeline that shows what
// asynq-throttle is for: a fleet of asynq workers syncing data from
// rate-limited third-party APIs without tripping their quotas.
//
//	go run ./examples/sync-worker
//
// It needs no setup: the providers are simulated over HTTP on 127.0.0.1 by
// the program itself (each enforces its quota and answers excess with 429),
// Redis is an embedded miniredis, and the fleet is several asynq servers in
// one process. The CRM-like provider is configured from stale docs at twice
// its real quota, which it publishes in the IETF RateLimit-Policy field: the
// handlers pass every response to throttle.Observe, and the fleet learns the
// quota on the first responses. Partway through, the Slack-like provider
// sheds load (429 with Retry-After), and the fleet suspends it, every server
// at once. The CRM's jobs are two customers' (throttle.Tenant): a heavy
// one's backlog, and a light one's few jobs that arrive behind it; while
// both wait, each gets its share of the CRM's rate, and the report compares
// the light customer's wait with what first in, first out would have made
// it (an estimate). With -redis it uses a real Redis or Redis Cluster, and
// with -procs it starts worker processes of itself against it, to show the
// limits holding across processes. It audits every task at the end and
// exits 1 if any job was lost, archived, done twice or not done in time,
// and 3 if Redis stops answering mid-run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK    = 0
	exitAudit = 1 // a job lost, archived, done twice, or not done in time
	exitSetup = 2 // bad flags, or the run could not be set up
	exitRedis = 3 // Redis stopped answering mid-run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cli(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// hiddenFlags are left out of -help: they are for the program itself.
var hiddenFlags = map[string]bool{"worker": true}

// cli parses args and runs the pipeline, or the hidden -worker mode.
func cli(ctx context.Context, args []string, stdin io.Reader, stdout, stderr *os.File) int {
	fs, f := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitSetup
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sync-worker: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return exitSetup
	}
	if f.workerJS != "" {
		return workerMode(ctx, f.workerJS, stdin, stderr)
	}
	if err := f.cfg.fromFlags(fs); err != nil {
		fmt.Fprintf(stderr, "sync-worker: %v\n", err)
		return exitSetup
	}
	return runAndReport(ctx, f.cfg, f.asJSON, stdout, stderr)
}

// cliFlags are the values of sync-worker's flags.
type cliFlags struct {
	cfg      Config
	asJSON   bool
	workerJS string
}

// newFlagSet defines sync-worker's flags, reporting to stderr.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *cliFlags) {
	fs := flag.NewFlagSet("sync-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &cliFlags{}
	cfg := &f.cfg
	fs.IntVar(&cfg.Jobs, "jobs", defaultJobs, fmt.Sprintf("sync jobs per provider, 1 to %d", maxJobs))
	fs.IntVar(&cfg.Servers, "servers", defaultServers, fmt.Sprintf("asynq servers in this process (without -procs), 1 to %d", maxServers))
	fs.IntVar(&cfg.Concurrency, "concurrency", defaultConcurrency, fmt.Sprintf("worker goroutines per asynq server (per process with -procs), 1 to %d", maxConcurrency))
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL: redis://host:port[/db], rediss://, unix://, or a Redis Cluster\n"+
		"    \t(redis://host:port?addr=host:port&addr=..., or any node's URL)\n"+
		"    \t(default $REDIS_URL, else an embedded miniredis)")
	fs.IntVar(&cfg.Procs, "procs", 0, fmt.Sprintf("start this many worker processes of this program instead of in-process servers (needs -redis), 0 to %d", maxProcs))
	fs.BoolVar(&f.asJSON, "json", false, "print the summary as JSON on stdout (progress goes to stderr)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "give up waiting for the jobs after this long (default: twice the expected run time + 30s)")
	fs.StringVar(&cfg.Dashboard, "dashboard", "", "serve the web view and Prometheus metrics on this address during the run, e.g. 127.0.0.1:8080 (read-only)")
	fs.BoolVar(&cfg.Keep, "keep", false, "with -redis: leave the run's queue, limits and ledger in Redis for inspection (they expire in an hour)")
	fs.StringVar(&f.workerJS, "worker", "", "run as one worker process of a -procs run (internal)")
	fs.Usage = func() { writeUsage(stderr, fs) }
	return fs, f
}

// writeUsage writes -help: what the program does, its exit codes, and
// its flags but the hidden ones.
func writeUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: sync-worker [flags]\n\n"+
		"Runs a background sync pipeline against simulated rate-limited APIs, throttled\n"+
		"fleet-wide by asynq-throttle, and audits every task. Exit status 1 if a job was\n"+
		"lost, archived, done twice or not done in time; 2 for bad flags or a setup\n"+
		"error; 3 if Redis stopped answering mid-run.\n\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		if hiddenFlags[f.Name] {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(w, "  -%s%s\n    \t%s", f.Name, name, usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// workerMode runs this process as one worker of a -procs run, as spec (JSON)
// says.
func workerMode(ctx context.Context, specJSON string, stdin io.Reader, stderr io.Writer) int {
	var spec nodeSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(stderr, "sync-worker: -worker: %v\n", err)
		return exitSetup
	}
	if err := runWorkerProcess(ctx, spec, stdin, stderr); err != nil {
		fmt.Fprintf(stderr, "sync-worker: %v\n", err)
		return exitSetup
	}
	return exitOK
}

// fromFlags completes c from the flags fs parsed: zero and negative values
// are refused, not replaced by defaults, and without -redis the Redis is
// $REDIS_URL's.
func (c *Config) fromFlags(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	err := c.checkCounts()
	if err == nil && set["timeout"] {
		err = checkTimeout(c.Timeout)
	}
	c.RedisFrom = "-redis"
	if !set["redis"] {
		c.RedisURL, c.RedisFrom = os.Getenv("REDIS_URL"), "REDIS_URL"
	}
	if err == nil && c.RedisURL != "" {
		err = checkRedisURL(c.RedisURL, c.RedisFrom)
	}
	return err
}

// runAndReport runs the pipeline, prints its summary (as JSON on stdout
// with asJSON, progress then going to stderr) and returns the exit code.
func runAndReport(ctx context.Context, cfg Config, asJSON bool, stdout, stderr *os.File) int {
	out := stdout
	if asJSON {
		out = stderr
	}
	cfg.Live = isTerminal(out)
	sum, err := run(ctx, cfg, out)
	if errors.Is(err, errRedisLost) {
		fmt.Fprintf(stderr, "sync-worker: %v\n", err)
		return exitRedis
	}
	if err != nil {
		fmt.Fprintf(stderr, "sync-worker: %v\n", err)
		return exitSetup
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return exitSetup
		}
	}
	if !sum.OK {
		return exitAudit
	}
	return exitOK
}
