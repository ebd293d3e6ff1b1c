package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// goBlock finds the first Go code block of a section of the README.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestREADMEUsageIsThisProgram keeps the README's Usage section and this
// program the same text, so that what a reader pastes is what the tests
// build and run.
func TestREADMEUsageIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, usage, ok := strings.Cut(string(readme), "\n## Usage\n")
	require.True(t, ok, "README.md has no \"## Usage\" section")
	usage, _, _ = strings.Cut(usage, "\n## ")
	m := goBlock.FindStringSubmatch(usage)
	require.NotNil(t, m, "the Usage section of README.md has no ```go block")

	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	assert.Equal(t, string(src), m[1],
		"the Go block of README.md's Usage section must be examples/quickstart/main.go verbatim: copy the file into the README")
}

func TestQuickstartRunsItsTasks(t *testing.T) {
	srv := redistest.Start(t)
	start := time.Now()
	require.NoError(t, run(t.Context(), "redis://"+srv.Addr, 6), "run(ctx, %q, 6)", srv.Addr)

	// 6 tasks at 2/s with a burst of 2 cannot all run in under 2 s: the
	// limit was applied.
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "6 tasks at 2/s burst 2")
}
