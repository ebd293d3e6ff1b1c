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

// maxQuickStartLines keeps the README's quick start the smallest change to
// an existing asynq program (style.md item 11).
const maxQuickStartLines = 40

// TestREADMEQuickStartIsAnExcerptOfThisProgram keeps the README's quick
// start honest: at most maxQuickStartLines lines, each of them (but blank
// ones) a line of this program, in the program's order (indentation aside),
// so that what a reader copies is code the tests build and run.
func TestREADMEQuickStartIsAnExcerptOfThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	require.True(t, ok, "README.md has no \"## Quick start\" section")
	section, _, _ = strings.Cut(section, "\n## ")
	m := goBlock.FindStringSubmatch(section)
	require.NotNil(t, m, "the Quick start section of README.md has no ```go block")
	excerpt := strings.Split(strings.TrimSuffix(m[1], "\n"), "\n")
	assert.LessOrEqual(t, len(excerpt), maxQuickStartLines, "lines in the quick start's Go block")

	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	program := strings.Split(string(src), "\n")
	at := 0 // the program's lines before at are used up
	for i, line := range excerpt {
		want := strings.TrimSpace(line)
		if want == "" {
			continue
		}
		found := false
		for ; at < len(program); at++ {
			if strings.TrimSpace(program[at]) == want {
				found, at = true, at+1
				break
			}
		}
		if !assert.True(t, found, "README.md quick start, line %d: %q is not a line of examples/quickstart/main.go after the ones before it: change the program, or the excerpt", i+1, want) {
			return
		}
	}
}

func TestQuickstartRunsItsTasks(t *testing.T) {
	srv := redistest.Start(t)
	start := time.Now()
	require.NoError(t, run(t.Context(), srv.Addr, 6), "run(ctx, %q, 6)", srv.Addr)

	// 6 tasks at 2/s with a burst of 2 cannot all run in under 2 s: the
	// limit was applied.
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "6 tasks at 2/s burst 2")
}
