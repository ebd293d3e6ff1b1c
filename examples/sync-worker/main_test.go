package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// TestMain lets the test binary act as a -procs worker process: a -procs run
// starts worker processes of the running program, which in a test is this
// binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-worker" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// runPipeline runs cfg in-process and logs its output when the test fails.
func runPipeline(t *testing.T, cfg Config) Summary {
	t.Helper()
	var out bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline output:\n%s", out.String())
		}
	})
	s, err := run(t.Context(), cfg, &out)
	require.NoError(t, err, "run(%+v)", cfg)
	return s
}

// assertEveryJobDoneOnce checks the audit of every provider of s.
func assertEveryJobDoneOnce(t *testing.T, s Summary, jobs int) {
	t.Helper()
	assert.True(t, s.OK, "summary verdict: %s", verdict(s))
	assert.False(t, s.TimedOut, "run timed out")
	for _, p := range s.Providers {
		assert.Equal(t, jobs, p.Jobs, "%s: jobs enqueued", p.Name)
		assert.Equal(t, jobs, p.Done, "%s: jobs done (handlers' ledger)", p.Name)
		assert.Equal(t, jobs, p.Served, "%s: 200s sent (provider's own count)", p.Name)
		assert.Zero(t, p.Duplicates, "%s: jobs done twice", p.Name)
		assert.Zero(t, p.Archived, "%s: tasks archived", p.Name)
		assert.Zero(t, p.Lost, "%s: jobs lost (not done, or task not completed in asynq)", p.Name)
	}
}

func TestPipelineDoesEveryJobOnceWithoutA429(t *testing.T) {
	const jobs = 12
	s := runPipeline(t, Config{Jobs: jobs})

	assertEveryJobDoneOnce(t, s, jobs)
	require.Len(t, s.Providers, len(DefaultProviders()))
	for _, p := range s.Providers {
		// Our limits match each provider's quota: the fleet never trips it.
		assert.Zero(t, p.TooMany, "%s: 429s sent by the provider (quota %s, our limit %s)", p.Name, p.Quota, p.Limit)
		assert.Zero(t, p.Suspended, "%s: suspensions", p.Name)
	}
	// The throttle did hold tasks back: 12 jobs are more than slack's burst.
	assert.Positive(t, s.Providers[0].Deferred, "slack: deferred tasks")
}

func TestHeaderOnlyProviderLimitIsAdoptedAtRunTime(t *testing.T) {
	const jobs = 12
	spec := crmSpec()
	published := spec.Quota[0].Rate
	require.Less(t, spec.Guess[0].Rate, published, "the guess must be below the published limit for this test to show anything")

	// A Redis of the test's own, kept after the run, to read the limits back.
	mr := miniredis.RunT(t)
	var out bytes.Buffer
	s, err := run(t.Context(), Config{Jobs: jobs, Providers: []ProviderSpec{spec}, RedisURL: "redis://" + mr.Addr(), Keep: true}, &out)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline output:\n%s", out.String())
		}
	})

	assertEveryJobDoneOnce(t, s, jobs)

	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	limiter := throttle.NewLimiter(rdb, throttle.WithPrefix(limiterPrefix(s.Run)))
	limits, err := limiter.Limits(t.Context(), spec.Name)
	require.NoError(t, err, "Limits(ctx, %q)", spec.Name)
	assert.Equal(t, []throttle.Limit{{Rate: published, Per: time.Second, Burst: published}}, limits,
		"Limits(ctx, %q) after the run: the X-RateLimit-Limit header's limit", spec.Name)
	assert.Equal(t, "10/s", s.Providers[0].Limit)
	assert.NotEmpty(t, s.Providers[0].Adopted, "summary reports the adopted limit")
	assert.Contains(t, out.String(), "crm: X-RateLimit-Limit: 10; limit 2/s -> 10/s (SetLimits)",
		"the adoption is shown, from the guess to the published limit")
}

func TestA429SuspendsTheProviderAndLosesNothing(t *testing.T) {
	// Limits set far above the provider's quota: the provider answers 429,
	// the handler returns throttle.FromResponse, and the middleware suspends
	// the key fleet-wide and defers the task, without spending its retries.
	const jobs = 15
	spec := ProviderSpec{
		Name:     "eager",
		TaskType: "eager:sync",
		Quota:    []throttle.Limit{throttle.PerSecond(5)},
		Limits:   []throttle.Limit{throttle.PerSecond(100)},
		Reject:   RetryAfterSeconds,
		Latency:  [2]time.Duration{5 * time.Millisecond, 10 * time.Millisecond},
	}
	s := runPipeline(t, Config{Jobs: jobs, Providers: []ProviderSpec{spec}})

	assertEveryJobDoneOnce(t, s, jobs)
	p := s.Providers[0]
	assert.Positive(t, p.TooMany, "429s sent by a provider whose quota is below our limit")
	assert.Equal(t, int64(p.TooMany), p.Suspended, "every 429 suspends the key (429s vs suspensions)")
}

// runCLI runs the command line with args and returns its exit status,
// stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, []byte, []byte) {
	t.Helper()
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	require.NoError(t, err)
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	require.NoError(t, err)
	code := cli(t.Context(), args, nil, stdout, stderr)
	require.NoError(t, stdout.Close())
	require.NoError(t, stderr.Close())
	o, err := os.ReadFile(stdout.Name())
	require.NoError(t, err)
	e, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)
	return code, o, e
}

func TestCLIExitsNonZeroWhenJobsAreLost(t *testing.T) {
	// Slack's quota cannot do 30 jobs in 1 s: the run times out with jobs
	// still waiting, which the audit must report as lost.
	code, stdout, stderr := runCLI(t, "-jobs", "30", "-timeout", "1s", "-json")
	require.Equal(t, exitAudit, code, "exit status of sync-worker -jobs 30 -timeout 1s -json; stderr:\n%s", stderr)

	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout must be the JSON summary alone:\n%s", stdout)
	assert.False(t, s.OK)
	assert.True(t, s.TimedOut)
	assert.Positive(t, s.Lost, "lost jobs")
	assert.Equal(t, s.Jobs, s.Done+s.Lost, "every job is done or lost: %+v", s)
	assert.Contains(t, string(stderr), "FAILED:", "verdict on stderr")
}

func TestCLIProcsNeedsRedis(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	code, _, stderr := runCLI(t, "-procs", "2")
	assert.Equal(t, exitSetup, code, "exit status of sync-worker -procs 2")
	assert.Contains(t, string(stderr), "-procs needs a Redis")
}

func TestProcsShareTheLimitsAcrossProcesses(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr

	code, stdout, stderr := runCLI(t, "-redis", url, "-procs", "2", "-jobs", "12", "-json")
	require.Equal(t, exitOK, code, "exit status of sync-worker -procs 2; stderr:\n%s", stderr)

	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout:\n%s", stdout)
	assertEveryJobDoneOnce(t, s, 12)
	for _, p := range s.Providers {
		assert.Zero(t, p.TooMany, "%s: 429s sent by the provider", p.Name)
	}
	assert.Positive(t, s.ByWorker["w1"], "jobs done by worker process w1: %v", s.ByWorker)
	assert.Positive(t, s.ByWorker["w2"], "jobs done by worker process w2: %v", s.ByWorker)

	// The run cleans up after itself in a shared Redis.
	rdb := srv.Client(t)
	left, err := rdb.Keys(t.Context(), "*"+s.Run+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, left, "keys of run %s left in Redis", s.Run)
}
