package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// goBlock finds the first Go code block of a section of the README.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// readmeQuickStart returns the Go block of the README's Quick start.
func readmeQuickStart(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	require.True(t, ok, "README.md has no \"## Quick start\" section")
	section, _, _ = strings.Cut(section, "\n## ")
	m := goBlock.FindStringSubmatch(section)
	require.NotNil(t, m, "the Quick start section of README.md has no ```go block")
	return m[1]
}

// TestREADMEQuickStartCompiles builds the README's Quick start as a reader
// pastes it: a whole program, imports and all, that go build and go vet
// take (issue 35, item 1: the excerpt it was did not compile: "declared and
// not used: srv"). It is built in a directory of its own, against this
// module's packages.
func TestREADMEQuickStartCompiles(t *testing.T) {
	src := readmeQuickStart(t)
	require.True(t, strings.HasPrefix(src, "package main\n"), "the Quick start is a whole program")
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, args := range [][]string{
		append([]string{"build", "-o", filepath.Join(dir, "quickstart")}, raceFlag...),
		{"vet"},
	} {
		cmd := exec.Command(goTool, append(args, file)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s README.md's Quick start:\n%s\n%s", args[0], out, numbered(src))
	}
	// What a reader needs and a fragment would leave out.
	for _, want := range []string{`"github.com/asynq-throttle/asynq-throttle/throttle"`, `"github.com/asynq-throttle/asynq-throttle/worker"`,
		"ContextTimeoutEnabled: true", "srv.Run(mux)", "lim.Close()", "throttle.Observe(ctx, resp)"} {
		assert.Contains(t, src, want)
	}
}

// numbered is src with line numbers, for a compiler's errors.
func numbered(src string) string {
	var b strings.Builder
	for i, line := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, line)
	}
	return b.String()
}

func TestQuickstartRunsItsTasks(t *testing.T) {
	srv := redistest.Start(t)
	start := time.Now()
	require.NoError(t, run(t.Context(), srv.Addr, 6), "run(ctx, %q, 6)", srv.Addr)

	// 6 tasks at 2/s with a burst of 2 cannot all run in under 2 s: the
	// limit was applied.
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "6 tasks at 2/s burst 2")
}
