package throttle_test

// The documentation's own tests: README.md and docs/*.md are read by users
// who follow their links and run the tests they name, so both must exist.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docPages are the pages whose links and cited tests are checked.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages, "docs/*.md")
	return append([]string{"README.md", "bench/README.md"}, pages...)
}

// maxREADMELines keeps README.md a front page (style.md item 11): what it
// is, install, a quick start, concepts, guarantees, figures and links. The
// rest belongs in docs/.
const maxREADMELines = 300

func TestREADMEIsAFrontPage(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	assert.LessOrEqual(t, lines, maxREADMELines,
		"README.md has %d lines: move detail into docs/ and link to it", lines)
}

// prose is a Markdown page without its fenced code blocks and inline code
// spans, where links are not links; line breaks are kept.
type prose struct {
	text     string   // the page, code blanked out
	headings []string // the text of every heading, in order
}

var (
	fence      = regexp.MustCompile("(?m)^ {0,3}(```|~~~)")
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	mdLink     = regexp.MustCompile(`!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRe  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	linkInText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

func readProse(t *testing.T, path string) prose {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var p prose
	var b strings.Builder
	inFence := false
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			b.WriteString("\n")
			continue
		}
		if inFence {
			b.WriteString("\n")
			continue
		}
		if m := headingRe.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			p.headings = append(p.headings, m[1])
		}
		b.WriteString(line)
	}
	p.text = b.String()
	return p
}

// anchors are the fragment identifiers GitHub gives a page's headings:
// lower case, punctuation dropped, spaces as hyphens, a repeat suffixed
// -1, -2, ...
func anchors(headings []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headings {
		h = linkInText.ReplaceAllString(h, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsLinksResolve follows every relative link of README.md,
// bench/README.md and docs/*.md: the file or directory must exist, and a
// #fragment into a Markdown page must name one of its headings.
func TestDocsLinksResolve(t *testing.T) {
	pages := map[string]prose{}
	page := func(path string) prose {
		p, ok := pages[path]
		if !ok {
			p = readProse(t, path)
			pages[path] = p
		}
		return p
	}
	for _, path := range docPages(t) {
		text := codeSpan.ReplaceAllString(page(path).text, "")
		links := mdLink.FindAllStringSubmatch(text, -1)
		for _, m := range links {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), filepath.FromSlash(file))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %s does not exist", path, target, dest)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: link %q: a #fragment into %s, which is not a Markdown page", path, target, dest)
				continue
			}
			if !anchors(page(dest).headings)[frag] {
				t.Errorf("%s: link %q: %s has no heading whose anchor is #%s (headings: %q)", path, target, dest, frag, page(dest).headings)
			}
		}
	}
}

// citedTest matches a test, fuzz target, benchmark or example named in
// the docs, as `TestX`, `pkg/TestX` or `TestX_*` (a family).
var citedTest = regexp.MustCompile(`\b((?:Test|Fuzz|Benchmark|Example)[A-Z0-9_][A-Za-z0-9_]*)(\*)?`)

var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark|Example)[A-Za-z0-9_]*)\(`)

// TestDocsCiteTestsThatExist checks that every test README.md and
// docs/*.md name as the evidence of a claim is a function of some
// _test.go file of the module: a renamed or deleted test must take its
// citations with it.
func TestDocsCiteTestsThatExist(t *testing.T) {
	defined := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	require.True(t, defined["TestDocsCiteTestsThatExist"], "the walk found this test's own file")

	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	for _, path := range append([]string{"README.md"}, pages...) {
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range citedTest.FindAllStringSubmatch(string(src), -1) {
			name, family := m[1], m[2] == "*"
			if family {
				found := false
				for d := range defined {
					found = found || strings.HasPrefix(d, name)
				}
				if !found {
					t.Errorf("%s cites %s*, but no test's name starts with %s", path, name, name)
				}
				continue
			}
			if !defined[name] {
				t.Errorf("%s cites %s, which no _test.go file defines: rename or drop the citation", path, name)
			}
		}
	}
}

// CHANGELOG.md keeps what a user upgrading must know (issue 35, item 11):
// its first section is Unreleased, or a version, newest first, each with
// entries.
func TestChangelogOpensWithTheUnreleasedSection(t *testing.T) {
	b, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err, "CHANGELOG.md")
	var sections []string
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			sections = append(sections, h)
		}
	}
	require.NotEmpty(t, sections, "CHANGELOG.md has no ## section")
	assert.Equal(t, "Unreleased", sections[0], "the first section holds what is not released yet")
	_, unreleased, _ := strings.Cut(string(b), "\n## Unreleased\n")
	unreleased, _, _ = strings.Cut(unreleased, "\n## ")
	assert.Contains(t, unreleased, "\n- ", "the Unreleased section lists its changes")
}
