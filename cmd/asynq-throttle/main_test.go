package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files from this run")

// envRunMain makes the test binary act as the command (for exit codes and
// stderr as a separate process sees them).
const envRunMain = "ASYNQ_THROTTLE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		main()
		return
	}
	redis.SetLogger(&logging.VoidLogger{})
	os.Exit(m.Run())
}

// result is one run of the command.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the command in-process against redisURL, with nothing on stdin.
func cli(t *testing.T, redisURL string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, redisEnv(redisURL), nil, &out, &errb)
	return result{out.String(), errb.String(), code}
}

// redisEnv is an environment with only REDIS_URL.
func redisEnv(redisURL string) func(string) string {
	return func(k string) string {
		if k == "REDIS_URL" {
			return redisURL
		}
		return ""
	}
}

// transcript records commands and their output like a terminal session.
type transcript struct {
	t        *testing.T
	redisURL string
	b        strings.Builder
}

func (tr *transcript) run(args ...string) result {
	tr.t.Helper()
	r := cli(tr.t, tr.redisURL, args...)
	fmt.Fprintf(&tr.b, "$ asynq-throttle %s\n%s%s", strings.Join(args, " "), r.stdout, r.stderr)
	if r.code != 0 {
		fmt.Fprintf(&tr.b, "(exit %d)\n", r.code)
	}
	tr.b.WriteString("\n")
	return r
}

var (
	reRFC3339 = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	reClock   = regexp.MustCompile(`\b\d\d:\d\d:\d\d\b`)
	reDur     = regexp.MustCompile(`(^|[^/\d.])(\d+(\.\d+)?(ns|µs|us|ms|s|m|h))+\b`)
	reSeconds = regexp.MustCompile(`"(suspended_seconds|queued_seconds)": [0-9.e+-]+`)
	rePort    = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	reColumns = regexp.MustCompile(`(\S)  +`)
)

// normalise hides what changes from run to run: clock times, durations
// measured from now, ports, and so the width of table columns (runs of
// spaces become two). Command lines ("$ ...") are kept as typed.
func normalise(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "$ ") {
			lines[i] = rePort.ReplaceAllString(l, "127.0.0.1:PORT")
			continue
		}
		l = reRFC3339.ReplaceAllString(l, "<time>")
		l = reClock.ReplaceAllString(l, "HH:MM:SS")
		l = reSeconds.ReplaceAllString(l, `"$1": <n>`)
		l = reDur.ReplaceAllString(l, "$1<dur>")
		l = reColumns.ReplaceAllString(l, "$1  ")
		lines[i] = rePort.ReplaceAllString(l, "127.0.0.1:PORT")
	}
	return strings.Join(lines, "\n")
}

// golden compares got with testdata/name.golden, or writes it with
// -update. Ports are normalised; pass output with times through normalise.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	got = rePort.ReplaceAllString(got, "127.0.0.1:PORT")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/asynq-throttle -update to create it")
	assert.Equal(t, string(want), got, "output differs from %s (go test ./cmd/asynq-throttle -run %s -update rewrites it)", path, t.Name())
}

func TestNormaliseMasksPortsDurationsAndTimes(t *testing.T) {
	in := "$ asynq-throttle suspend slack 30s --redis redis://127.0.0.1:4242\n" +
		"slack    100/1.5s 5/s:burst=8  8.0/8  29.9s  1m30s  at 15:04:05 (in 250ms) 2026-11-30T15:04:05.123Z \"queued_seconds\": 12.5 127.0.0.1:4242\n"
	want := "$ asynq-throttle suspend slack 30s --redis redis://127.0.0.1:PORT\n" +
		"slack  100/1.5s 5/s:burst=8  8.0/8  <dur>  <dur>  at HH:MM:SS (in <dur>) <time> \"queued_seconds\": <n> 127.0.0.1:PORT\n"
	assert.Equal(t, want, normalise(in))
}

// A Redis the command cannot reach is one line on stderr and exit code 1,
// as a separate process prints it (go-redis's own log of the failed dial
// is that line).
func TestUnreachableRedisIsOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"list"},
		{"--redis", "redis+cluster://" + redistest.ClosedAddr(t), "list"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), envRunMain+"=1", "REDIS_URL=redis://"+redistest.ClosedAddr(t)+"/0")
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			assert.Equal(t, exitFailed, exit.ExitCode())
			assert.Empty(t, out.String())
			lines := strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n")
			require.Len(t, lines, 1, "stderr: %q", errb.String())
			assert.Regexp(t, `^asynq-throttle: cannot reach Redis at redis(\+cluster)?://127\.0\.0\.1:\d+(/0)? \(from (REDIS_URL|--redis)\): .*connection refused`, lines[0])
		})
	}
}

// Bad input: a message naming the accepted forms, exit code 2, before
// Redis is even asked.
func TestBadUsageExitsWith2NamingTheAcceptedForms(t *testing.T) {
	tr := &transcript{t: t, redisURL: "redis://" + redistest.ClosedAddr(t)}
	for _, args := range [][]string{
		{"set", "slack", "10/fortnight"},
		{"set", "slack", "10/sec"},
		{"set", "slack", "10/min"},
		{"set", "slack", "10/31d"},
		{"set", "slack", "99999999/1ms"},
		{"set", "slack", "10/s", "20/s"},
		{"set", "slack", "10/s:burst=2000000000"},
		{"serve", "--addr", "nonsense"},
		{"serve", "--addr", "127.0.0.1:99999"},
		{"set", "slack", "10/s:b=20"},
		{"set", "slack", "inflight:4"},
		{"set", "slack", "4/s:inflight"},
		{"set", "slack", "5000/h:window:burst=10"},
		{"set", "openai", "500/m", "30000/m:windwo"},
		{"set", "openai", "30000/m:Tokens"},
		{"set", "openai", "30000/m:tokens:window"},
		{"set", "openai", "16:inflight:tokens"},
		{"set", "slack"},
		{"get"},
		{"get", "a{b}"},
		{"suspend", "slack", "forever"},
		{"suspend", "slack", "48h"},
		{"suspend", "slack", "-5s"},
		{"suspend", "slack", "-1h30m", "-o", "json"},
		{"suspend", "slack", "0s"},
		{"suspend", "slack", "--", "-5s"},
		{"set", "slack", "-5/s"},
		{"watch", "--interval", "0s"},
		{"list", "-o", "yaml"},
		{"list", "--nope"},
		{"frobnicate"},
		{"--redis", "http://localhost:6379", "list"},
		{"--redis", "redis+sentinel://127.0.0.1:26379", "list"},
		{"--prefix", "a{b", "list"},
		{"serve", "--allowed-hosts", "https://throttle.example.com"},
		{"serve", "--allowed-hosts", "*.example.com"},
		{"weights", "llm"},
		{"weights", "llm", "gold"},
		{"weights", "llm", "gold=0"},
		{"weights", "llm", "gold=1.5"},
		{"weights", "llm", "gold=1000001"},
		{"weights", "llm", "=3"},
		{"weights", "llm", "a{b}=3"},
		{"weights", "llm", "gold=3", "gold=4"},
		{"weights", "llm", "--reset", "gold=3"},
	} {
		r := tr.run(args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		assert.Empty(t, r.stdout, "%v", args)
		// The fault first, in the CLI's words, then where the forms are
		// (issue 35: Go field names, and a grammar after every error).
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		require.Len(t, lines, 2, "%v: %q", args, r.stderr)
		assert.LessOrEqual(t, len(lines[0]), 300, "%v: %q", args, lines[0])
		assert.NotContains(t, r.stderr, "limits[", "%v: Go field names", args)
		assert.Regexp(t, `^Run 'asynq-throttle( \w+)? --help' for usage\.$`, lines[1], "%v", args)
	}
	golden(t, "usage", tr.b.String())
}

// What go-redis logs reaches stderr, but for the failed dials the command
// reports itself.
func TestGoRedisLogShowsAllButFailedDials(t *testing.T) {
	var b bytes.Buffer
	l := redisLog{&b}
	l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 1, "refused")
	assert.Empty(t, b.String(), "a failed dial is the command's own 'cannot reach Redis'")
	l.Printf(context.Background(), "Unexpected conn[%d] state changed by hook to %s", 1, "CLOSED")
	assert.Equal(t, "asynq-throttle: go-redis: Unexpected conn[1] state changed by hook to CLOSED\n", b.String())
}

// No credential of a Redis URL reaches a message (issue 35): the password
// of user:password@, and a Sentinel master's password or the Sentinels'
// own given in the query, whether the URL parses or not.
func TestRedisURLCredentialsAreRedacted(t *testing.T) {
	closed := redistest.ClosedAddr(t)
	for _, url := range []string{
		"redis://user:s3cret-a@" + closed + "/0",
		"redis://:s3cret-a@" + closed,
		"redis://" + closed + "?password=s3cret-a",
		"redis+sentinel://" + closed + "?master_name=m&password=s3cret-a&sentinel_password=s3cret-b",
		"redis+sentinel://:s3cret-b@" + closed + "?master_name=m&sentinel_username=u&sentinel_password=s3cret-a",
		"redis+cluster://u:s3cret-a@" + closed + "?addr=" + closed + "&password=s3cret-b",
		"user:s3cret-a@" + closed,
		"redis://user:s3cret-a@[::1:bad/0?password=s3cret-b",
		"http://user:s3cret-a@" + closed + "?password=s3cret-b",
	} {
		r := cli(t, url, "list")
		assert.NotEqual(t, exitOK, r.code, url)
		assert.NotContains(t, r.stderr+r.stdout, "s3cret", "%s: %s", url, r.stderr)
		if strings.Contains(r.stderr, closed) {
			assert.Contains(t, r.stderr, redacted, "%s: the message shows where a credential was: %s", url, r.stderr)
		}
	}
}

// --redis takes host:port as redis-cli and asynq's RedisClientOpt do.
func TestRedisAddressWithoutSchemeIsAccepted(t *testing.T) {
	srv := redistest.Start(t)
	r := cli(t, "", "--redis", srv.Addr, "list")
	require.Equal(t, exitOK, r.code, "--redis %s: %s", srv.Addr, r.stderr)
	assert.Contains(t, r.stdout, "no keys under prefix")
	r = cli(t, srv.Addr, "list")
	assert.Equal(t, exitOK, r.code, "REDIS_URL=%s: %s", srv.Addr, r.stderr)
}
