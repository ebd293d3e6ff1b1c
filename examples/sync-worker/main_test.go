package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

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
	redistest.RaiseParallel(4)
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

// steadyProviders are the default providers without Slack's load shedding.
func steadyProviders() []ProviderSpec {
	return []ProviderSpec{slackSpec(), githubSpec(), crmSpec()}
}

// At the providers' published numbers, the fleet draws no 429 (the
// middleware's headroom absorbs dispatch jitter). Not run in parallel with
// the package's other runs: on two shared cores, three fleets at once can
// delay a call past the 20 ms of headroom, which is a starved machine's
// limit the docs state, not a fault of the numbers.
func TestPipelineDoesEveryJobOnceWithoutA429(t *testing.T) {
	const jobs = 12
	lag := redistest.StartLagMeter()
	s := runPipeline(t, Config{Jobs: jobs, Providers: steadyProviders()})
	worst := lag.End()

	assertEveryJobDoneOnce(t, s, jobs)
	require.Len(t, s.Providers, len(steadyProviders()))
	for i, p := range s.Providers {
		// Our limits match each provider's quota: the fleet never trips it,
		// but for a call the machine held back past the middleware's
		// headroom while later ones went on time.
		late := lagAllowance(steadyProviders()[i], worst) + raceAllowance()
		assert.LessOrEqual(t, p.TooMany, late, "%s: 429s sent by the provider (quota %s, our limit %s; %d allowed for the process's worst lag, %v, and the race detector's)", p.Name, p.Quota, p.Limit, late, worst)
		assert.Equal(t, int64(p.TooMany), p.Suspended, "%s: every 429 suspends the key", p.Name)
	}
	// The throttle did hold tasks back: 12 jobs are more than slack's burst.
	assert.Positive(t, s.Providers[0].Deferred, "slack: deferred tasks")
	crm := s.Providers[2]
	require.Equal(t, "crm", crm.Name)
	assert.True(t, crm.Learned, "crm: its published quota learned (in force %s, configured %s)", crm.InForce, crm.Limit)
}

func TestPublishedQuotaIsLearnedBelowTheConfiguredLimit(t *testing.T) {
	t.Parallel()
	// crm is configured at its stale docs' 20/s and enforces 10/s: without
	// what Observe learns from its RateLimit-Policy, three workers calling
	// it back to back would draw 429s within half a second. With it, the
	// first response brings the fleet down to 10/s: no 429 at all.
	const jobs = 30
	spec := crmSpec()
	require.Equal(t, []throttle.Limit{throttle.PerSecond(20)}, spec.Limits, "crm's configured limit")
	require.Equal(t, []throttle.Limit{throttle.PerSecond(10)}, spec.Quota, "crm's quota")
	require.True(t, spec.Publish, "crm publishes its quota")

	// A Redis of the test's own, kept after the run, to read the limits back.
	mr := miniredis.RunT(t)
	var out bytes.Buffer
	s, err := run(t.Context(), Config{Jobs: jobs, Servers: 3, Concurrency: 1, Providers: []ProviderSpec{spec},
		RedisURL: "redis://" + mr.Addr(), Keep: true}, &out)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline output:\n%s", out.String())
		}
	})

	assertEveryJobDoneOnce(t, s, jobs)
	crm := s.Providers[0]
	assert.Zero(t, crm.TooMany, "429s sent by crm (quota %s, configured %s, in force at the end %s)", crm.Quota, crm.Limit, crm.InForce)
	assert.Zero(t, crm.Suspended, "crm: suspensions")

	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	limiter := throttle.NewLimiter(rdb, throttle.WithPrefix(limiterPrefix(s.Run)))
	st, err := limiter.Inspect(t.Context(), spec.Name)
	require.NoError(t, err, "Inspect(ctx, %q)", spec.Name)
	assert.Equal(t, []throttle.Limit{{N: 20, Per: time.Second, Burst: 20}}, st.Limits,
		"Inspect(ctx, %q).Limits after the run: the configured limit stays the ceiling", spec.Name)
	assert.Equal(t, []throttle.Limit{{N: 10, Per: time.Second, Burst: 10}}, st.InForce,
		"Inspect(ctx, %q).InForce after the run: the quota crm publishes", spec.Name)
	assert.Equal(t, learnedLimits(spec), st.InForce, "learnedLimits(crm) against what the library learned")
	require.Len(t, st.LearnedFor, 1)
	assert.Greater(t, st.LearnedFor[0], 9*time.Minute, "a learned quota lasts 10 minutes after crm last said it")

	assert.Equal(t, "20/s", crm.Limit, "summary: configured")
	assert.Equal(t, "10/s", crm.InForce, "summary: in force")
	assert.True(t, crm.Learned, "summary: learned")
	assert.Contains(t, out.String(), "crm: quota learned: 10/s in force fleet-wide for 10m (configured 20/s)",
		"the learned quota is shown as it happens")
	assert.Regexp(t, `\ncrm +10/s +10/s, learned \(configured 20/s\)\n`, out.String(), "the summary shows it")
}

func TestProviderPublishesItsQuotaInTheIETFFields(t *testing.T) {
	// Per minute, so that the calls' own refill does not show: 10 left
	// less each call, one token back every 6 s.
	spec := ProviderSpec{Name: "p", Quota: []throttle.Limit{throttle.PerMinute(10)}, Publish: true}
	p, err := StartProvider(spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	for i, want := range []string{`"default";r=9;t=6`, `"default";r=8;t=12`} {
		resp, err := http.Get(p.URL + "/sync/job-" + strconv.Itoa(i))
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `"default";q=10;w=60`, resp.Header.Get("RateLimit-Policy"), "call %d", i+1)
		assert.Equal(t, want, resp.Header.Get("RateLimit"), "call %d", i+1)
	}

	// Two tiers: one policy each, named.
	two := ProviderSpec{Name: "two", Quota: []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(100).WithBurst(30)}, Publish: true}
	p2, err := StartProvider(two)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p2.Close() })
	resp, err := http.Get(p2.URL + "/sync/x")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, `"tier1";q=5;w=1, "tier2";q=100;w=60`, resp.Header.Get("RateLimit-Policy"))
	// tier2: 29 of 30 left, 1 token back in 0.6 s: full again within 1 s.
	assert.Equal(t, `"tier1";r=4;t=1, "tier2";r=29;t=1`, resp.Header.Get("RateLimit"))

	// Without Publish, none.
	quiet, err := StartProvider(ProviderSpec{Name: "q", Quota: []throttle.Limit{throttle.PerSecond(10)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = quiet.Close() })
	resp, err = http.Get(quiet.URL + "/sync/x")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Empty(t, resp.Header.Get("RateLimit-Policy"))
	assert.Empty(t, resp.Header.Get("RateLimit"))
}

func TestLearnedLimitsTakeAQuotaOnlyBelowTheConfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec ProviderSpec
		want []throttle.Limit
	}{
		{"crm: the published quota below the configured one", crmSpec(), []throttle.Limit{{N: 10, Per: time.Second, Burst: 10}}},
		{"silent provider: as configured", slackSpec(), slackSpec().Limits},
		{"published quota above: as configured",
			ProviderSpec{Quota: []throttle.Limit{throttle.PerSecond(50)}, Limits: []throttle.Limit{throttle.PerSecond(20)}, Publish: true},
			[]throttle.Limit{throttle.PerSecond(20)}},
		{"burst kept when under the quota",
			ProviderSpec{Quota: []throttle.Limit{throttle.PerSecond(10)}, Limits: []throttle.Limit{throttle.PerSecond(20).WithBurst(4)}, Publish: true},
			[]throttle.Limit{{N: 10, Per: time.Second, Burst: 4}}},
		{"only the tier of the same period",
			ProviderSpec{Quota: []throttle.Limit{throttle.PerMinute(60)}, Limits: []throttle.Limit{throttle.PerSecond(20), throttle.PerMinute(600)}, Publish: true},
			[]throttle.Limit{throttle.PerSecond(20), {N: 60, Per: time.Minute, Burst: 60}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, learnedLimits(tc.spec), "learnedLimits(%+v)", tc.spec)
		})
	}
}

// The providers whose quota we know get exactly the published numbers, as
// docs/limits.md says to: no shaved burst (issue 35, item 3). The runs
// above (TestPipelineDoesEveryJobOnceWithoutA429, the default run) draw no
// 429 at them.
func TestConfiguredLimitsAreThePublishedNumbers(t *testing.T) {
	// A limit as its numbers: rate, period and burst (0 means the rate).
	numbers := func(ls []throttle.Limit) [][3]int {
		var out [][3]int
		for _, l := range ls {
			b := l.Burst
			if b == 0 {
				b = l.N
			}
			out = append(out, [3]int{l.N, int(l.Per / time.Millisecond), b})
		}
		return out
	}
	for _, spec := range []ProviderSpec{slackSpec(), githubSpec()} {
		assert.Equal(t, numbers(spec.Quota), numbers(spec.Limits), "%s: our limits are its published quota", spec.Name)
	}
}

func TestA429SuspendsTheProviderAndLosesNothing(t *testing.T) {
	// Limits set far above the provider's quota: the provider answers 429,
	// the handler returns throttle.Observe's error, and the middleware
	// suspends the key fleet-wide and defers the task, without spending its
	// retries. Both ways of saying when to come back: Retry-After (Slack)
	// and X-RateLimit-Remaining: 0 with X-RateLimit-Reset (GitHub).
	for _, tc := range []struct {
		name   string
		reject RejectStyle
	}{
		{"Retry-After", RetryAfterSeconds},
		{"X-RateLimit-Reset", ResetUnixTime},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const jobs = 15
			spec := ProviderSpec{
				Name:     "eager",
				TaskType: "eager:sync",
				Quota:    []throttle.Limit{throttle.PerSecond(5)},
				Limits:   []throttle.Limit{throttle.PerSecond(100)},
				Reject:   tc.reject,
				Latency:  [2]time.Duration{5 * time.Millisecond, 10 * time.Millisecond},
			}
			s := runPipeline(t, Config{Jobs: jobs, Providers: []ProviderSpec{spec}})

			assertEveryJobDoneOnce(t, s, jobs)
			p := s.Providers[0]
			assert.Positive(t, p.TooMany, "429s sent by a provider whose quota is below our limit")
			assert.Equal(t, int64(p.TooMany), p.Suspended, "every 429 suspends the key (429s vs suspensions)")
			assert.False(t, p.Learned, "a provider that publishes no quota teaches nothing: in force %s", p.InForce)
		})
	}
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

func TestCLIReportsJobsNotDoneAtTimeoutAsNotDone(t *testing.T) {
	t.Parallel()
	// Slack's quota cannot do 30 jobs in 1 s: the run times out with jobs
	// still queued in asynq, which are "not done", not lost.
	code, stdout, stderr := runCLI(t, "-redis", "", "-jobs", "30", "-timeout", "1s", "-json")
	require.Equal(t, exitAudit, code, "exit status of sync-worker -jobs 30 -timeout 1s -json; stderr:\n%s", stderr)

	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout must be the JSON summary alone:\n%s", stdout)
	assert.False(t, s.OK)
	assert.True(t, s.TimedOut)
	assert.Positive(t, s.NotDone, "jobs not done")
	assert.Zero(t, s.Lost, "jobs lost: asynq still has every job not done")
	assert.Equal(t, s.Jobs, s.Done+s.NotDone, "every job is done or not done: %+v", s)
	assert.Contains(t, string(stderr), "NOT DONE:", "verdict on stderr")
	assert.Contains(t, string(stderr), "timed out after 1s", "verdict on stderr")
}

func TestCLIRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string // REDIS_URL
		want []string
	}{
		{args: []string{"-jobs", "0"}, want: []string{"-jobs must be between 1 and 10000, got 0"}},
		{args: []string{"-jobs", "-3"}, want: []string{"-jobs must be between 1 and 10000, got -3"}},
		{args: []string{"-servers", "0"}, want: []string{"-servers must be between 1 and 64, got 0"}},
		{args: []string{"-concurrency", "0"}, want: []string{"-concurrency must be between 1 and 1000, got 0"}},
		{args: []string{"-procs", "-1"}, want: []string{"-procs must be between 0 and 64, got -1"}},
		{args: []string{"-timeout", "0"}, want: []string{"-timeout must be a positive duration such as 90s or 5m, got 0s"}},
		{args: []string{"-timeout", "-5s"}, want: []string{"-timeout must be a positive duration", "got -5s"}},
		{args: []string{"-redis", "notaurl"}, want: []string{`-redis "notaurl" is not a Redis URL`, "accepted forms:", "redis://[user:password@]host:port[/db]", "addr=host:port"}},
		{env: "notaurl", want: []string{`REDIS_URL "notaurl" is not a Redis URL`, "accepted forms:"}},
		{args: []string{"-redis", "http://u:secret@localhost:6379"}, want: []string{`-redis "http://u:xxxxx@localhost:6379" is not a Redis URL`}},
	} {
		t.Run(strings.Join(append(tc.args, tc.env), " "), func(t *testing.T) {
			t.Setenv("REDIS_URL", tc.env)
			code, _, stderr := runCLI(t, tc.args...)
			assert.Equal(t, exitSetup, code, "exit status of sync-worker %v (REDIS_URL=%q)", tc.args, tc.env)
			for _, w := range tc.want {
				assert.Contains(t, string(stderr), w)
			}
			assert.NotContains(t, string(stderr), "secret", "the password is not shown")
		})
	}
}

func TestCLIProcsNeedsRedis(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	code, _, stderr := runCLI(t, "-procs", "2")
	assert.Equal(t, exitSetup, code, "exit status of sync-worker -procs 2")
	assert.Contains(t, string(stderr), "-procs needs a Redis")
}

func TestProcsShareTheLimitsAcrossProcesses(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr

	lag := redistest.StartLagMeter()
	code, stdout, stderr := runCLI(t, "-redis", url, "-procs", "2", "-jobs", "12", "-json")
	worst := lag.End()
	require.Equal(t, exitOK, code, "exit status of sync-worker -procs 2; stderr:\n%s", stderr)

	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout:\n%s", stdout)
	assertEveryJobDoneOnce(t, s, 12)
	assertNoStorm(t, s, worst)
	assert.Positive(t, s.ByWorker["w1"], "jobs done by worker process w1: %v", s.ByWorker)
	assert.Positive(t, s.ByWorker["w2"], "jobs done by worker process w2: %v", s.ByWorker)
	// What one process learned from crm's responses is in force for all.
	crm := s.Providers[2]
	require.Equal(t, "crm", crm.Name)
	assert.True(t, crm.Learned, "crm: its published quota learned across processes")
	assert.Equal(t, "10/s", crm.InForce, "crm: in force at the end")

	// The run cleans up after itself in a shared Redis.
	rdb := srv.Client(t)
	left, err := rdb.Keys(t.Context(), "*"+s.Run+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, left, "keys of run %s left in Redis", s.Run)
}

// assertNoStorm checks that no provider answered a 429 it did not choose to
// send: every 429 suspended its key, none came over quota (after a
// suspension, say), and the load-shedding ones were few: the calls already
// on their way. Without the fleet-wide suspension the fleet would keep
// calling a shedding provider at its rate (Slack: 4-5/s for 3 s).
//
// A provider whose quota is below the limit set for it (the CRM's stale
// docs) may answer the fleet's first burst over its quota before the first
// response teaches the fleet its quota: the guarantee's stated limit ("a
// quota the provider cuts without notice costs one burst of 429s before
// Observe learns it"), and what a loaded machine shows when several calls
// leave before the first answer. At most the difference of the bursts.
func assertNoStorm(t *testing.T, s Summary, lag time.Duration) {
	t.Helper()
	for _, p := range s.Providers {
		allowed, late := 0, 0
		for _, spec := range DefaultProviders() {
			if spec.Name == p.Name {
				late = lagAllowance(spec, lag)
				if spec.Publish {
					allowed = burstOf(spec.Limits[0]) - burstOf(spec.Quota[0])
				}
			}
		}
		assert.LessOrEqual(t, p.OverQuota, max(allowed, 0)+late, "%s: 429s for calls over the quota (quota %s, our limit %s; %d allowed for the process's worst lag, %v)", p.Name, p.Quota, p.Limit, late, lag)
		assert.LessOrEqual(t, p.Shed, 8, "%s: load-shedding 429s (%d of them more than %v after the first)", p.Name, p.LateShed, shedGrace)
		assert.Equal(t, int64(p.TooMany), p.Suspended, "%s: every 429 suspends the key (429s vs suspensions)", p.Name)
	}
}

// raceAllowance is the over-quota 429s a run may draw under the race
// detector, per provider: 1 (see race_on_test.go; .ci/run's -race suite,
// beside the other packages, drew one at slack in two runs of three), 0
// without it, where the default `go test ./...` keeps this test strict.
func raceAllowance() int {
	if raceOn {
		return 1
	}
	return 0
}

// lagAllowance is how many calls over spec's quota a run may draw because
// the machine held this process back for lag: a call the middleware
// admitted reaches the provider that much later, and bunches with the
// calls admitted after it (the middleware's 20 ms of headroom covers
// dispatch on a machine with a CPU to spare). It is the quota's rate times
// the worst lag beyond the headroom, rounded up: 0 on an idle machine.
func lagAllowance(spec ProviderSpec, lag time.Duration) int {
	over := lag - 20*time.Millisecond
	if over <= 0 {
		return 0
	}
	return int(math.Ceil(ratePerSecond(spec.Quota[0]) * over.Seconds()))
}

// TestDefaultRunDoesEveryJobOnceWithin80Columns runs the demo as `go run ./examples/sync-worker` does
// (with -json, which moves the same text to stderr): Slack sheds load
// partway, the 429 becomes a fleet-wide suspension, and the run still ends
// with every job done once, no 429 but the ones Slack chose to send, and
// every line within 80 columns.
func TestDefaultRunDoesEveryJobOnceWithin80Columns(t *testing.T) {
	lag := redistest.StartLagMeter()
	code, stdout, stderr := runCLI(t, "-redis", "", "-json")
	worst := lag.End()
	require.Equal(t, exitOK, code, "exit status of sync-worker -json; stderr:\n%s", stderr)
	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout must be the JSON summary alone:\n%s", stdout)

	assertEveryJobDoneOnce(t, s, defaultJobs)
	assertNoStorm(t, s, worst)
	require.Equal(t, "slack", s.Providers[0].Name)
	slack := s.Providers[0]
	assert.Positive(t, slack.Shed, "slack: load-shedding 429s (it sheds from %v for %v)", shedAt, shedFor)
	assert.Positive(t, slack.Suspended, "slack: suspensions")

	text := string(stderr)
	// Our limits are the published numbers, the workers named in events
	// are introduced before them, and a rate above a quota is explained
	// (issue 35, item 3).
	assert.Regexp(t, `\nslack +5/s \+ 120/min burst 30 +5/s \+ 120/min burst 30\n`, text, "slack's limits are its quota")
	assert.Regexp(t, `\ngithub +20/s +20/s\n`, text, "github's limit is its quota")
	intro := strings.Index(text, "fleet: 3 asynq servers (s1, s2, s3)")
	first := regexp.MustCompile(`\n +[\d.]+s  s\d: `).FindStringIndex(text)
	require.NotNil(t, first, "an event names a worker")
	assert.True(t, intro >= 0 && intro < first[0], "the workers s1..s3 are introduced before an event names one")
	assert.Contains(t, text, "at first they exceed a quota by its burst", "a rate above the quota is explained")
	assert.Contains(t, text, "slack answered 429, Retry-After: 3", "the 429 is shown")
	assert.Contains(t, text, "slack: suspended fleet-wide for", "the suspension is shown")
	assert.Regexp(t, `slack: (\d/3 servers deferring its tasks|suspension over; \d/3 servers deferred its tasks)`, text,
		"how far the suspension reached is shown")
	assert.Contains(t, text, "crm: quota learned: 10/s in force fleet-wide for 10m (configured 20/s)",
		"crm's published quota is learned, and shown")
	crm := s.Providers[2]
	require.Equal(t, "crm", crm.Name)
	assert.True(t, crm.Learned, "crm: learned")
	assert.Equal(t, "10/s", crm.InForce, "crm: in force at the end")
	assert.Contains(t, text, "OK: 120/120 jobs done exactly once")

	// The CRM's jobs are two tenants': every job of each done, and shown.
	require.Len(t, crm.Tenants, 2, "crm: tenants in the summary")
	heavy, light := crm.Tenants[0], crm.Tenants[1]
	assert.Equal(t, TenantSummary{Name: heavyTenant, Jobs: defaultJobs - lightJobs, Done: defaultJobs - lightJobs},
		TenantSummary{Name: heavy.Name, Jobs: heavy.Jobs, Done: heavy.Done}, "crm: the heavy tenant's jobs")
	assert.Equal(t, TenantSummary{Name: lightTenant, Jobs: lightJobs, Done: lightJobs},
		TenantSummary{Name: light.Name, Jobs: light.Jobs, Done: light.Done}, "crm: the light tenant's jobs")
	// At lightAt, or later on a machine so busy that the enqueue waits
	// for a CPU (1.2 s beside a CPU hog).
	assert.GreaterOrEqual(t, light.Arrived, lightAt.Seconds()-0.05, "crm: when the light tenant's jobs arrived")
	assert.LessOrEqual(t, light.Arrived, lightAt.Seconds()+3, "crm: when the light tenant's jobs arrived")
	assert.Positive(t, light.FIFO, "crm: the estimate of the light tenant's wait first in, first out")
	assert.Contains(t, text, "crm: two tenants: acme has 36 jobs in the backlog, bolt's 4 arrive at 500ms")
	assert.Regexp(t, `crm: bolt's 4 jobs arrive behind \d+ of acme's`, text, "the light tenant's arrival is shown")
	assert.Regexp(t, `\n +[\d.]+s  crm     tenants: acme \d+/36`, text, "the tenants' progress is shown")
	assert.Regexp(t, `crm: bolt's 4 jobs done in [\d.]+s, (beside|behind) \d+ of acme's \(FIFO: ~[\d.]+s\)`, text,
		"the light tenant's last job is shown")
	assert.Regexp(t, `\ncrm bolt +4 +4 +[\d.]+s +[\d.]+s +[\d.]+s +~[\d.]+s\n`, text, "the tenants' table")
	for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		assert.LessOrEqual(t, utf8.RuneCountInString(line), 80, "line %d is wider than 80 columns: %q", i+1, line)
	}
}

// TestLightTenantIsNotQueuedBehindTheHeavyBacklog runs the CRM of the demo
// alone with 100 jobs: 96 of acme's in the backlog, and bolt's 4 that
// arrive half a second in, behind some 85 of acme's still waiting, 9 s of
// them at the CRM's 10/s. Tagged with their tenants (throttle.Tenant),
// bolt's jobs get half the rate while both wait, and are done in a second
// or two; first in, first out, they would wait for the backlog.
func TestLightTenantIsNotQueuedBehindTheHeavyBacklog(t *testing.T) {
	t.Parallel()
	const jobs = 100
	crm := DefaultProviders()[2]
	require.Equal(t, "crm", crm.Name)
	require.Equal(t, lightJobs, crm.Tenants.lightJobs(jobs), "the light tenant's jobs")
	// A light tenant is sometimes served behind the backlog in this shape
	// (a quota learned from 429s while the backlog drains; docs/tenants.md
	// says so): up to three runs, the first fair one passes. First in,
	// first out, every run would fail.
	for run := 1; ; run++ {
		s := runPipeline(t, Config{Jobs: jobs, Providers: []ProviderSpec{crm}})
		assertEveryJobDoneOnce(t, s, jobs)
		p := s.Providers[0]
		assert.LessOrEqual(t, p.OverQuota, burstOf(crm.Limits[0])-burstOf(crm.Quota[0]),
			"429s over quota: at most the first burst, before the quota is learned")
		require.Len(t, p.Tenants, 2, "tenants in the summary")
		heavy, light := p.Tenants[0], p.Tenants[1]
		assert.Equal(t, jobs-lightJobs, heavy.Done, "the heavy tenant's jobs done")
		assert.Equal(t, lightJobs, light.Done, "the light tenant's jobs done")
		require.Positive(t, light.Last, "the light tenant's last job was served")
		require.Equal(t, 10.0, light.Rate, "the CRM's rate in force when the light tenant's jobs arrived")
		// The scenario holds: a backlog of several seconds when they arrived.
		require.Greater(t, light.Behind, 50, "the heavy tenant's jobs not yet served when the light tenant's arrived")
		t.Logf("FIGURE tenants: run %d: %s's %d jobs done %.1fs after they arrived behind %d of %s's (FIFO estimate %.1fs); crm done in %.1fs, %d deferrals",
			run, light.Name, light.Jobs, light.Waited, light.Behind, heavy.Name, light.FIFO, p.Seconds, p.Deferred)
		// At half the rate, 4 jobs take under a second, and asynq brings a
		// deferred task back up to a second late; first in, first out they
		// would wait the backlog's 8 s or so. Half of that is a bound a busy
		// machine does not reach by its slowness, and a queue does by its order.
		if light.Waited < light.FIFO/2 || run == 3 {
			assert.Less(t, light.Waited, light.FIFO/2,
				"%s's %d jobs arrived at %.1fs behind %d of %s's: done %.1fs later; first in, first out: about %.1fs (estimate)",
				light.Name, light.Jobs, light.Arrived, light.Behind, heavy.Name, light.Waited, light.FIFO)
			return
		}
	}
}

func TestTenantsTableSaysWhetherTheLightTenantGotItsShare(t *testing.T) {
	p := ProviderSummary{Name: "crm", Tenants: []TenantSummary{
		{Name: "acme", Jobs: 36, Done: 36, Last: 4.1, Waited: 4.1},
		{Name: "bolt", Jobs: 4, Done: 4, Arrived: 0.5, Last: 1.8, Waited: 1.3, Behind: 26, FIFO: 3, Rate: 10},
	}}
	var b bytes.Buffer
	writeTenants(&b, p)
	assert.Equal(t, `tenant    jobs  done  arrived  last done  waited  FIFO wait (estimate)
crm acme    36    36     0.0s       4.1s    4.1s
crm bolt     4     4     0.5s       1.8s    1.3s                 ~3.0s
crm: bolt's 4 jobs arrived at 0.5s behind 26 of acme's and were all done 1.3s
later, served beside that backlog at their share of the rate
(throttle.Tenant). First in, first out they would have waited about 3.0s (an
estimate: 30 jobs at 10/s).
`, b.String())

	p.Tenants[1].Last, p.Tenants[1].Waited = 4.2, 3.7
	b.Reset()
	writeTenants(&b, p)
	assert.Contains(t, b.String(), "were all done 3.7s\nlater, no sooner than first in, first out: about 3.0s (an estimate: 30 jobs at\n10/s). They were not given their share of the rate.\n")
}

func TestTenantSplitIsChecked(t *testing.T) {
	crm := DefaultProviders()[2]
	require.NoError(t, crm.Tenants.check(crm))
	for jobs, want := range map[int]int{1: 0, 3: 0, 4: 1, 12: 3, 16: 4, 40: 4, 10000: 4} {
		assert.Equal(t, want, crm.Tenants.lightJobs(jobs), "light tenant's jobs of %d", jobs)
	}
	for _, tc := range []struct {
		split TenantSplit
		want  string
	}{
		{TenantSplit{Heavy: "acme", Light: "acme", LightJobs: 4}, `its two tenants are both "acme"`},
		{TenantSplit{Heavy: "acme", Light: "", LightJobs: 4}, `tenant ""`},
		{TenantSplit{Heavy: "acme", Light: "bolt"}, "tenant bolt has no jobs"},
	} {
		bad := crm
		bad.Tenants = tc.split
		assert.ErrorContains(t, Config{Providers: []ProviderSpec{bad}}.withDefaults().validate(), tc.want)
	}
	slack := DefaultProviders()[0]
	slack.Tenants = crm.Tenants
	assert.ErrorContains(t, Config{Providers: []ProviderSpec{slack}}.withDefaults().validate(), "a Stream and Tenants cannot be combined")
}

func TestLiveDisplayFitsIn80Columns(t *testing.T) {
	var b bytes.Buffer
	d := newDisplay(&b, true, time.Now(), time.Second)
	// The widest figures a long run shows.
	var rows []row
	for _, p := range DefaultProviders() {
		// -jobs 10000 takes slack 83 minutes at 2/s.
		r := row{Name: p.Name, Done: maxJobs - 1, Total: maxJobs, Finished: 9999 * time.Second,
			Limit: p.Limits, InForce: learnedLimits(p), Deferred: 9999999, Suspended: 9999, TooMany: 9999}
		if t := p.Tenants; t.Heavy != "" {
			r.Tenants = []tenantRow{{Name: t.Heavy, Done: maxJobs - 5, Total: maxJobs - 4, Share: 0.5},
				{Name: t.Light, Done: 3, Total: 4, Share: 0.5}}
		}
		rows = append(rows, r)
	}
	d.event("s1: an event line long enough to be cut at the edge of an 80-column terminal, and then some more")
	d.update(rows)
	assert.Contains(t, b.String(), "crm tenants: acme 9995/9996 (share 50%) · bolt 3/4 (share 50%)")

	ansi := regexp.MustCompile("\x1b\\[[0-9;?]*[A-Za-z]")
	for _, line := range strings.Split(ansi.ReplaceAllString(b.String(), ""), "\n") {
		assert.LessOrEqual(t, utf8.RuneCountInString(line), 80, "live line wider than 80 columns: %q", line)
	}

	// The plain tenants' line, too.
	b.Reset()
	d = newDisplay(&b, false, time.Now().Add(-9999*time.Second), 0)
	d.update(rows)
	tenants := regexp.MustCompile(`(?m)^.*tenants: .*$`).FindAllString(b.String(), -1)
	assert.Equal(t, []string{"9999.0s  crm     tenants: acme 9995/9996 (share 50%) · bolt 3/4 (share 50%)"}, tenants)
	for _, line := range tenants {
		assert.LessOrEqual(t, utf8.RuneCountInString(line), 80, "plain line wider than 80 columns: %q", line)
	}
}

func TestWrapBreaksLinesWithinTheWidth(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  []string
	}{
		{"short", 10, []string{"short"}},
		{"one two three four", 9, []string{"one two", "three", "four"}},
		{"abcdefghijkl", 5, []string{"abcde", "fgh", "ijk", "l"}},
		{"één twee", 4, []string{"één", "tw", "ee"}},
	} {
		assert.Equal(t, tc.want, wrap(tc.in, tc.width), "wrap(%q, %d)", tc.in, tc.width)
	}
}

func TestDefaultTimeoutFitsTheWork(t *testing.T) {
	for _, tc := range []struct {
		jobs     int
		expected time.Duration
	}{
		// Slack: 5/s burst 5 drains at 5/s after its burst; 120/min burst 30
		// at 2/s after its; plus 3 s of load shedding.
		{40, 7*time.Second + shedFor},
		{200, 85*time.Second + shedFor},
	} {
		cfg := Config{Jobs: tc.jobs}.withDefaults()
		assert.Equal(t, tc.expected, expectedDuration(cfg.Providers, tc.jobs), "expected run time of -jobs %d", tc.jobs)
		assert.Equal(t, 2*tc.expected+timeoutMargin, cfg.Timeout, "default timeout of -jobs %d", tc.jobs)
	}
}

func TestDemoRunsOnARedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)

	// go-redis's cluster URL form gives a cluster client.
	clusterURL := "redis://" + cluster.Addrs[0] + "?addr=" + cluster.Addrs[1] + "&addr=" + cluster.Addrs[2]
	rdb, name, err := dialRedis(t.Context(), clusterURL, "-redis")
	require.NoError(t, err, "dialRedis(%q)", clusterURL)
	assert.IsType(t, &redis.ClusterClient{}, rdb, "client for %q", clusterURL)
	assert.Contains(t, name, "Redis Cluster")
	require.NoError(t, rdb.Close())

	// The URL of one node: recognised as a cluster, and the whole demo
	// (asynq, limits, ledger, audit, cleanup) runs on it.
	url := "redis://" + cluster.Addrs[1]
	lag := redistest.StartLagMeter()
	code, stdout, stderr := runCLI(t, "-redis", url, "-jobs", "20", "-json")
	worst := lag.End()
	require.Equal(t, exitOK, code, "exit status of sync-worker -redis %s -jobs 20 -json; stderr:\n%s", url, stderr)
	var s Summary
	require.NoError(t, json.Unmarshal(stdout, &s), "stdout:\n%s", stdout)
	assertEveryJobDoneOnce(t, s, 20)
	assertNoStorm(t, s, worst)
	assert.Equal(t, "Redis Cluster of node "+url, s.Redis)
	assert.Positive(t, s.Providers[0].Suspended, "slack sheds load from %v: suspensions on the cluster", shedAt)

	// The run cleaned up after itself on every node.
	cc := cluster.Client(t)
	keys, err := scanKeys(t.Context(), cc, "*"+s.Run+"*")
	require.NoError(t, err)
	assert.Empty(t, keys, "keys of run %s left in the cluster", s.Run)
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestDemoExitsSoonAfterItsRedisDies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)

	// The run's output through a pipe, read as it comes.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	var out syncBuffer
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(&out, r)
		close(copied)
	}()
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)

	code := make(chan int, 1)
	go func() {
		code <- cli(t.Context(), []string{"-redis", "redis://" + srv.Addr, "-jobs", "40"}, nil, w, stderr)
		_ = w.Close()
	}()
	// Well under way: every job enqueued, and progress shown.
	progress := regexp.MustCompile(`slack +\d+/40 `)
	require.Eventually(t, func() bool { return progress.MatchString(out.String()) },
		30*time.Second, 20*time.Millisecond, "the run never started; output:\n%s", &out)
	srv.Stop()
	killed := time.Now()

	var got int
	select {
	case got = <-code:
	case <-time.After(30 * time.Second):
		t.Fatalf("sync-worker still running 30s after its Redis died; output:\n%s", out.String())
	}
	took := time.Since(killed)
	<-copied
	errText, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)

	assert.Equal(t, exitRedis, got, "exit status after Redis died; stderr:\n%s\noutput:\n%s", errText, out.String())
	// redisLostAfter to notice, lostStopTimeout at most to stop the fleet,
	// and room for a busy machine.
	assert.Less(t, took, redisLostAfter+lostStopTimeout+5*time.Second, "time from Redis's death to the exit")
	assert.Contains(t, out.String(), "Redis has not answered for", "the display says why the run stops")
	assert.Contains(t, string(errText), "lost Redis mid-run: Redis redis://"+srv.Addr+" stopped answering")
	assert.Less(t, strings.Count(out.String(), "asynq:"), 20, "asynq's errors do not scroll")
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}
