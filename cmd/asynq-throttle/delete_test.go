package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// terminal is stdin as a person at a terminal types it: isTerminal takes it
// for one (its Stat is /dev/zero's, a character device), and what is read
// is echoed to echo, if any, as a terminal shows it.
type terminal struct {
	r    io.Reader
	echo io.Writer
}

func (t terminal) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if t.echo != nil {
		t.echo.Write(p[:n])
	}
	return n, err
}

func (terminal) Stat() (os.FileInfo, error) { return os.Stat("/dev/zero") }

// noRead is stdin that must not be read.
type noRead struct{ t *testing.T }

func (r noRead) Read([]byte) (int, error) {
	r.t.Error("stdin was read")
	return 0, io.EOF
}

// delete shows the key and asks before deleting it, unless --yes; without
// a terminal and without --yes it refuses instead of waiting (issue 20, D8:
// it asked nothing).
func TestDeleteAsksForConfirmation(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	lim := throttle.NewLimiter(srv.Client(t))
	exists := func(key string) bool {
		t.Helper()
		keys, err := lim.Keys(context.Background())
		require.NoError(t, err)
		for _, k := range keys {
			if k == key {
				return true
			}
		}
		return false
	}
	var session strings.Builder
	for _, tc := range []struct {
		name    string
		tty     bool   // stdin is a terminal
		typed   string // stdin; "-": must not be read
		args    []string
		code    int
		deleted bool
	}{
		{"no terminal, no --yes", false, "yes\n", []string{"delete", "crm"}, exitUsage, false},
		{"answered n", true, "n\n", []string{"delete", "crm"}, exitFailed, false},
		{"answered nothing", true, "\n", []string{"delete", "crm"}, exitFailed, false},
		{"stdin closed", true, "", []string{"delete", "crm"}, exitFailed, false},
		{"answered yess", true, "yess\n", []string{"delete", "crm"}, exitFailed, false},
		{"answered yes", true, "yes\n", []string{"delete", "crm"}, exitOK, true},
		{"answered Y", true, " Y \n", []string{"delete", "crm", "-o", "json"}, exitOK, true},
		{"--yes", false, "-", []string{"delete", "crm", "--yes"}, exitOK, true},
		{"-y on a terminal", true, "-", []string{"delete", "crm", "-y"}, exitOK, true},
		{"unknown key", false, "-", []string{"delete", "crn", "--yes"}, exitFailed, false},
		{"unknown key, --force", false, "-", []string{"delete", "nothing", "--yes", "--force"}, exitOK, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, lim.Delete(context.Background(), "crm"))
			r := cli(t, url, "set", "crm", "100/1500ms", "2:inflight")
			require.Equal(t, exitOK, r.code, r.stderr)
			// A terminal shows stdout, stderr and what is typed as they
			// come: one buffer.
			var out bytes.Buffer
			var stdin io.Reader = strings.NewReader(tc.typed)
			if tc.typed == "-" {
				stdin = noRead{t}
			}
			if tc.tty {
				stdin = terminal{stdin, &out}
			}
			code := run(context.Background(), tc.args, redisEnv(url), stdin, &out, &out)
			fmt.Fprintf(&session, "$ asynq-throttle %s\n%s", strings.Join(tc.args, " "), out.String())
			if code != exitOK {
				fmt.Fprintf(&session, "(exit %d)\n", code)
			}
			session.WriteString("\n")
			assert.Equal(t, tc.code, code, out.String())
			assert.Equal(t, !tc.deleted, exists("crm"), "crm kept")
		})
	}
	golden(t, "delete", session.String())
}

// An interrupt (Ctrl-C cancels the context) ends the question: the key is
// kept and the command does not hang on stdin.
func TestDeleteQuestionEndsOnInterrupt(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	require.Equal(t, exitOK, cli(t, url, "set", "crm", "10/s").code)
	pr, pw := io.Pipe() // nobody types
	t.Cleanup(func() { pw.Close() })
	asked := &firstWrite{seen: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"delete", "crm"}, redisEnv(url), terminal{pr, nil}, io.Discard, io.MultiWriter(asked, &stderr))
	}()
	select {
	case <-asked.seen:
	case code := <-done:
		t.Fatalf("delete ended with exit code %d before asking", code)
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitFailed, code)
		assert.Contains(t, stderr.String(), "interrupted; crm is unchanged")
	case <-time.After(10 * time.Second):
		t.Fatal("delete still waits for an answer after the interrupt")
	}
	r := cli(t, url, "get", "crm")
	assert.Equal(t, exitOK, r.code, "crm kept: %s", r.stderr)
}

// Run as cron runs it, stdin the null device (a character device too),
// delete refuses at once instead of asking.
func TestDeleteRefusesWithStdinFromDevNull(t *testing.T) {
	cmd := exec.Command(os.Args[0], "delete", "crm") // Stdin nil: os.DevNull
	cmd.Env = append(os.Environ(), envRunMain+"=1", "REDIS_URL=redis://"+redistest.ClosedAddr(t))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stdout %q, stderr %q", out.String(), errb.String())
	assert.Equal(t, exitUsage, exit.ExitCode())
	assert.Contains(t, errb.String(), "no terminal on stdin to confirm on: pass --yes")
	assert.Empty(t, out.String())
}
