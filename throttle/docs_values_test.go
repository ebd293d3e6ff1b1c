package throttle

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
)

// docs returns the doc comment of every exported func, method and type of
// the package, by name ("Limiter.SetLimits" for a method).
func docs(t *testing.T) map[string]string {
	t.Helper()
	p := docPackage(t)
	out := map[string]string{}
	for _, f := range p.Funcs {
		out[f.Name] = f.Doc
	}
	for _, ty := range p.Types {
		out[ty.Name] = ty.Doc
		for _, f := range ty.Funcs {
			out[f.Name] = f.Doc
		}
		for _, m := range ty.Methods {
			out[ty.Name+"."+m.Name] = m.Doc
		}
	}
	return out
}

// docPackage is the package as godoc reads it.
func docPackage(t *testing.T) *doc.Package {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	require.NoError(t, err)
	files := []*ast.File{}
	for _, f := range pkgs["throttle"].Files {
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/asynq-throttle/asynq-throttle/throttle")
	require.NoError(t, err)
	return p
}

// sourceFiles are the package's files, parsed whole (go/doc drops what is
// not exported from those it reads).
func sourceFiles(t *testing.T) []*ast.File {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	var files []*ast.File
	for _, f := range pkgs["throttle"].Files {
		files = append(files, f)
	}
	return files
}

// short writes a duration as the docs do: "1s", "1m", "20ms", "7 days".
func short(d time.Duration) string {
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// Each option's doc, and each doc that states a fixed duration, states the
// value the code uses: change one and this fails until the other follows.
func TestOptionDocsStateTheDefaults(t *testing.T) {
	d := docs(t)
	require.Equal(t, "1m", short(time.Minute))
	require.Equal(t, "1h", short(time.Hour))
	require.Equal(t, "20ms", short(20*time.Millisecond))
	require.Equal(t, "7 days", short(7*24*time.Hour))
	require.Equal(t, "10m", short(10*time.Minute))
	tests := []struct {
		doc, says string
	}{
		{"WithPrefix", `(default "` + newOptions(nil).prefix + `")`},
		{"WithTimeout", "(default " + short(defaultTimeout) + ")"},
		{"WithReservationHorizon", "(default " + short(defaultHorizon) + ")"},
		{"WithLease", fmt.Sprintf("(defaults %d and %s)", defaultLease, short(defaultLeaseFor))},
		{"WithHeadroom", "(default " + short(defaultHeadroom) + ")"},
		{"WithPacing", fmt.Sprintf("(default %v)", newOptions(nil).pacing)},
		{"WithFailureDelay", "(default " + short(defaultFailureDelay) + ", plus jitter)"},
		{"WithMaxSuspension", "(default " + short(defaultMaxSuspension) + ")"},
		{"WithSlotExpiry", "(default " + short(defaultSlotExpiry) + ","},
		{"WithDefaultLimits", "asks Redis again after " + short(noLimitsCacheFor)},
		{"Limiter.SetLimits", "They stay until Delete"},
		{"Limiter.Resume", "within " + strings.TrimSuffix(short(suspensionCacheMax), "s") + " s"},
		{"RateLimited", "suspends for " + short(defaultSuspension)},
		{"Observe", fmt.Sprintf("said it for %d minutes", defaultLearnFor/time.Minute)},
		{"Observe", fmt.Sprintf("every %v minutes (to keep a learned one in force for its %d)", (defaultLearnFor / 4).Minutes(), defaultLearnFor/time.Minute)},
	}
	for _, tt := range tests {
		text, ok := d[tt.doc]
		if !assert.True(t, ok, "no doc for %s", tt.doc) {
			continue
		}
		assert.Contains(t, strings.Join(strings.Fields(text), " "), tt.says, "%s's doc does not state the value the code uses", tt.doc)
	}
}

// The Limit doc states the bounds SetLimits enforces, and the scripts
// enforce the same ones on limits read from Redis.
func TestLimitDocsStateTheBounds(t *testing.T) {
	text := strings.Join(strings.Fields(docs(t)["Limit"]), " ")
	for _, says := range []string{
		fmt.Sprintf("at most %d rate tiers", maxTiers),
		fmt.Sprintf("Per is at most %s", short(maxPer)),
		fmt.Sprintf("at most %d calls per second", maxRatePerSecond),
		fmt.Sprintf("Burst and a window's N are at most %d", maxBurst),
		fmt.Sprintf("InFlight's N is at most %d", maxInFlight),
	} {
		assert.Contains(t, text, says, "the Limit doc does not state a bound the code enforces")
	}

	lib, err := os.ReadFile("../internal/lua/lib.lua")
	require.NoError(t, err)
	num := func(expr string) float64 { // "30 * 24 * 3600 * 1000", "1e6"
		v := 1.0
		for _, f := range strings.Split(expr, "*") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			require.NoError(t, err, "lib.lua: %q", expr)
			v *= x
		}
		return v
	}
	constant := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^\s*(?:local )?` + name + ` = ([0-9e.* ]+)`).FindSubmatch(lib)
		require.NotNil(t, m, "lib.lua has no %s", name)
		return num(string(m[1]))
	}
	assert.Equal(t, float64(maxTiers), constant("MAX_TIERS"), "lib.lua's MAX_TIERS")
	assert.Equal(t, float64(maxPer.Milliseconds()), constant("MAX_PER_MS"), "lib.lua's MAX_PER_MS")
	assert.Equal(t, float64(maxRatePerSecond), constant("MAX_RATE_PER_SEC"), "lib.lua's MAX_RATE_PER_SEC")
	assert.Equal(t, float64(maxBurst), constant("MAX_BURST"), "lib.lua's MAX_BURST")
	m := regexp.MustCompile(`'limits\.InFlight', 1, ([0-9e.]+),`).FindSubmatch(lib)
	require.NotNil(t, m, "lib.lua's check of an in-flight limit")
	assert.Equal(t, float64(maxInFlight), num(string(m[1])), "lib.lua's in-flight bound")
}

// godoc shows what a user reads: a constant's value, not the internal name
// it is copied from; no doc names an unexported identifier (a reader cannot
// look it up); the main entry point says what it does.
func TestGodocShowsValuesNotInternals(t *testing.T) {
	p := docPackage(t)

	var headerKey ast.Expr
	for _, c := range append(p.Consts, p.Types[0].Consts...) {
		for _, spec := range c.Decl.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if n.Name == "HeaderKey" && i < len(vs.Values) {
					headerKey = vs.Values[i]
				}
			}
		}
	}
	require.NotNil(t, headerKey, "no const HeaderKey")
	lit, ok := headerKey.(*ast.BasicLit)
	if assert.True(t, ok, "HeaderKey = %T: godoc shows an expression, not the header's name", headerKey) {
		assert.Equal(t, strconv.Quote(keyspace.Key), lit.Value, "HeaderKey is the header the middleware reads")
	}

	// Unexported top-level names in mixedCase (maxBurst, defaultTimeout):
	// words no reader of godoc can look up.
	internal := map[string]bool{}
	mixed := regexp.MustCompile(`^[a-z]+[A-Z][A-Za-z0-9]*$`)
	for _, f := range sourceFiles(t) {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && mixed.MatchString(d.Name.Name) {
					internal[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if mixed.MatchString(n.Name) {
								internal[n.Name] = true
							}
						}
					case *ast.TypeSpec:
						if mixed.MatchString(s.Name.Name) {
							internal[s.Name.Name] = true
						}
					}
				}
			}
		}
	}
	require.True(t, internal["maxBurst"], "the walk found the unexported names")
	word := regexp.MustCompile(`[A-Za-z][A-Za-z0-9]*`)
	for name, text := range docs(t) {
		for _, w := range word.FindAllString(text, -1) {
			assert.False(t, internal[w], "the doc of %s names the unexported %s: say what it is", name, w)
		}
	}

	mw := strings.Join(strings.Fields(docs(t)["Limiter.Middleware"]), " ")
	for _, says := range []string{"worker.NewServer", "RateLimited", "spends none of the task's retries", "WithTimeout", "ErrCostTooHigh"} {
		assert.Contains(t, mw, says, "Limiter.Middleware, the main entry point, says what it does")
	}
}

// Every runnable example builds its Redis client as the README insists:
// with ContextTimeoutEnabled, so that each call ends by its deadline.
func TestExamplesEnableContextTimeouts(t *testing.T) {
	files, err := filepath.Glob("../*/example_test.go")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 4, "example_test.go files")
	opts := regexp.MustCompile(`redis\.(?:Options|ClusterOptions|FailoverOptions|UniversalOptions)\{[^}]*\}`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range opts.FindAllString(string(src), -1) {
			assert.Contains(t, m, "ContextTimeoutEnabled: true", "%s: %s", f, m)
		}
	}
}

// docText is README.md and every page of docs/, each with its lines
// joined (a claim may wrap), by path.
func docText(t *testing.T) map[string]string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	out := map[string]string{}
	for _, p := range append([]string{"../README.md"}, pages...) {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out[p] = strings.Join(strings.Fields(string(b)), " ")
	}
	return out
}

// docDuration reads a duration as the docs write it: "1 s", "50 ms",
// "1 min", "1 h", "30 days".
func docDuration(t *testing.T, n, unit string) time.Duration {
	t.Helper()
	v, err := strconv.ParseFloat(n, 64)
	require.NoError(t, err)
	d := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour}[unit]
	require.NotZero(t, d, "unit %q", unit)
	return time.Duration(v * float64(d))
}

// Every number README.md and docs/ state about a limit's bounds or an
// option's default is the code's: the docs once said 4 tiers where the code
// takes 8. Each claim is found by its wording; a claim that no page makes
// any more fails too, so that a rewording is followed here.
func TestDocsStateTheCodesNumbers(t *testing.T) {
	pages := docText(t)
	num := `(\d+(?:\.\d+)?)`
	dur := num + ` ?(ms|s|min|h|days?)\b`
	type claim struct {
		what string
		re   string
		want func(m []string) (got, want any)
	}
	count := func(c int) func(m []string) (any, any) {
		return func(m []string) (any, any) { return m[1], strconv.Itoa(c) }
	}
	duration := func(d time.Duration) func(m []string) (any, any) {
		return func(m []string) (any, any) { return docDuration(t, m[1], m[2]), d }
	}
	option := func(name string, d time.Duration) claim {
		// "`WithTimeout` (1 s)", "`WithTimeout`, 1 s", "`WithTimeout` (default
		// 1 s", "`WithTimeout(d)` | 1 s |", "(`WithHeadroom`, 20 ms by default)".
		return claim{name, "`" + name + `(?:\([a-z, ]*\))?` + "`" + `(?: \|)?[ ,(;]*(?:default )?` + dur, duration(d)}
	}
	claims := []claim{
		{"rate tiers", `(?:up to|at most|more than) (\d+) (?:rate )?tiers`, count(maxTiers)},
		{"tiers, in the metrics", "`tier` is 1 to (\\d+)", count(maxTiers)},
		{"the longest period", `(?:period above|Per is at most) ` + dur, duration(maxPer)},
		{"the highest rate", `rate above 10\^(\d+)/s`, count(int(math.Log10(maxRatePerSecond)))},
		{"the largest burst", `burst above 10\^(\d+)`, count(int(math.Log10(maxBurst)))},
		{"a key's length", `1-(\d+) printable bytes`, count(keyspace.MaxKeyLen)},
		{"a unit's length", `A unit is 1 to (\d+) of`, count(keyspace.MaxUnitLen)},
		{"a tenant's weight", `whole numbers from 1 to ([\d,]+)`, func(m []string) (any, any) {
			return strings.ReplaceAll(m[1], ",", ""), strconv.Itoa(maxWeight)
		}},
		{"caches of no limits and suspensions", `(?:sees the change|apply) within ` + dur, duration(suspensionCacheMax)},
		{"leased tokens", `(?:leased tokens last|unused ones are dropped after) ` + dur, duration(defaultLeaseFor)},
		{"WithLease", "`WithLease\\(n, d\\)` \\| (\\d+), " + dur, func(m []string) (any, any) {
			return fmt.Sprint(m[1], " ", docDuration(t, m[2], m[3])), fmt.Sprint(defaultLease, " ", defaultLeaseFor)
		}},
		option("WithTimeout", defaultTimeout),
		option("WithReservationHorizon", defaultHorizon),
		option("WithHeadroom", defaultHeadroom),
		option("WithSlotExpiry", defaultSlotExpiry),
		option("WithMaxSuspension", defaultMaxSuspension),
		option("WithFailureDelay", defaultFailureDelay),
	}
	require.Equal(t, time.Duration(noLimitsCacheFor), time.Duration(suspensionCacheMax), "the docs state one delay for both caches")
	for _, c := range claims {
		re := regexp.MustCompile(c.re)
		seen := 0
		for path, text := range pages {
			for _, m := range re.FindAllStringSubmatch(text, -1) {
				seen++
				got, want := c.want(m)
				assert.Equal(t, want, got, "%s: %q states %s against the code", path, m[0], c.what)
			}
		}
		assert.NotZero(t, seen, "no page states %s as /%s/ any more: follow the new wording here", c.what, c.re)
	}
}

// What a tier is, the docs say as the code does: its kind, period and unit
// (10/s beside 10/s:window are two tiers; SetLimits takes them).
func TestDocsSayATierIsItsKindPeriodAndUnit(t *testing.T) {
	tiers, err := validateLimits([]Limit{PerSecond(10), Window(10, time.Second), PerSecond(10).In("tokens")})
	require.NoError(t, err, "two tiers of one period, other kinds or units")
	require.Len(t, tiers, 3)
	_, err = validateLimits([]Limit{PerSecond(10), PerSecond(20)})
	require.ErrorIs(t, err, ErrInvalidLimit, "two buckets of one period and unit")

	wrong := regexp.MustCompile(`(?i)(?:tiers? (?:with|of) (?:the same|one) period(?: are| is)? refused|identified by its period\b)`)
	for path, text := range docText(t) {
		for _, m := range wrong.FindAllString(text, -1) {
			t.Errorf("%s: %q: a tier is its kind, period and unit", path, m)
		}
	}
	for name, text := range docs(t) {
		text = strings.Join(strings.Fields(text), " ")
		for _, m := range wrong.FindAllString(text, -1) {
			t.Errorf("the doc of %s: %q: a tier is its kind, period and unit", name, m)
		}
	}
}
