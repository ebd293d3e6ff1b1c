package limitspec_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestParseReadsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want throttle.Limit
		back string // Format of the result, when it differs from spec
	}{
		{"10/s", throttle.PerSecond(10).WithBurst(10), ""},
		{"50/m", throttle.PerMinute(50).WithBurst(50), ""},
		{"5000/h", throttle.PerHour(5000).WithBurst(5000), ""},
		{"7/d", throttle.Limit{N: 7, Per: 24 * time.Hour, Burst: 7}, ""},
		{"100/1500ms", throttle.Limit{N: 100, Per: 1500 * time.Millisecond, Burst: 100}, ""},
		{"100/1.5s", throttle.Limit{N: 100, Per: 1500 * time.Millisecond, Burst: 100}, "100/1500ms"},
		{"10/2d", throttle.Limit{N: 10, Per: 48 * time.Hour, Burst: 10}, ""},
		{"10/48h", throttle.Limit{N: 10, Per: 48 * time.Hour, Burst: 10}, "10/2d"},
		{"10/30d", throttle.Limit{N: 10, Per: 30 * 24 * time.Hour, Burst: 10}, ""},
		{"10/s:burst=20", throttle.PerSecond(10).WithBurst(20), ""},
		{"10/s:burst=10", throttle.PerSecond(10).WithBurst(10), "10/s"},
		{"10/s:burst=5", throttle.PerSecond(10).WithBurst(5), ""},
		{"3/90s", throttle.Limit{N: 3, Per: 90 * time.Second, Burst: 3}, ""},
		{"3/1m30s", throttle.Limit{N: 3, Per: 90 * time.Second, Burst: 3}, "3/90s"},
		{"3/1m", throttle.PerMinute(3).WithBurst(3), "3/m"},
		{"3/24h", throttle.Limit{N: 3, Per: 24 * time.Hour, Burst: 3}, "3/d"},

		{"5000/h:window", throttle.Window(5000, time.Hour), ""},
		{"100/m:window", throttle.Window(100, time.Minute), ""},
		{"20/1500ms:window", throttle.Window(20, 1500*time.Millisecond), ""},
		{"1/60m:window", throttle.Window(1, time.Hour), "1/h:window"},
		{"5000/h:fixed", throttle.FixedWindow(5000, time.Hour), ""},
		{"60/1000ms:fixed", throttle.FixedWindow(60, time.Second), "60/s:fixed"},

		{"4:inflight", throttle.InFlight(4), ""},
		{"1:inflight", throttle.InFlight(1), ""},
		{"30s:adaptive", throttle.Adaptive(30 * time.Second), ""},
		{"1m:adaptive", throttle.Adaptive(time.Minute), ""},
		{"+2:inflight", throttle.InFlight(2), "2:inflight"},

		// A rate tier in another unit: the unit last, after at most one
		// other modifier; "requests" is the default, written without one.
		{"30000/m:tokens", throttle.PerMinute(30000).WithBurst(30000).In("tokens"), ""},
		{"30000/m:burst=2000:tokens", throttle.PerMinute(30000).WithBurst(2000).In("tokens"), ""},
		{"30000/m:burst=30000:tokens", throttle.PerMinute(30000).WithBurst(30000).In("tokens"), "30000/m:tokens"},
		{"100/m:window:tokens", throttle.Window(100, time.Minute).In("tokens"), ""},
		{"100/m:fixed:tokens", throttle.FixedWindow(100, time.Minute).In("tokens"), ""},
		{"400000/m:input-tokens", throttle.PerMinute(400000).WithBurst(400000).In("input-tokens"), ""},
		{"5/1500ms:gpu_seconds", throttle.Limit{N: 5, Per: 1500 * time.Millisecond, Burst: 5, Unit: "gpu_seconds"}, ""},
		{"1/d:a", throttle.Limit{N: 1, Per: 24 * time.Hour, Burst: 1, Unit: "a"}, ""},
		{"1/d:" + strings.Repeat("x", 32), throttle.Limit{N: 1, Per: 24 * time.Hour, Burst: 1, Unit: strings.Repeat("x", 32)}, ""},
		{"500/m:requests", throttle.PerMinute(500).WithBurst(500), "500/m"},
		{"500/m:window:requests", throttle.Window(500, time.Minute), "500/m:window"},
		{"10/s:burst=20:requests", throttle.PerSecond(10).WithBurst(20), "10/s:burst=20"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := limitspec.Parse(tc.spec)
			require.NoError(t, err, "Parse(%q)", tc.spec)
			assert.Equal(t, tc.want, got, "Parse(%q)", tc.spec)
			back := tc.back
			if back == "" {
				back = tc.spec
			}
			assert.Equal(t, back, limitspec.Format(got), "Format(Parse(%q))", tc.spec)
			again, err := limitspec.Parse(limitspec.Format(got))
			require.NoError(t, err)
			assert.Equal(t, got, again, "Parse(Format(Parse(%q)))", tc.spec)
		})
	}
}

// maxErrorLen bounds a bad limit's error: it leads with the fault, and
// the accepted forms are the help text's (issue 35: every error repeated a
// 700-character grammar).
const maxErrorLen = 250

// Every bad spec is refused with a short error that leads with the bad
// part.
func TestParseRefusesBadSpecsNamingThePart(t *testing.T) {
	for _, tc := range []struct {
		spec, part string // part: what the message must name
	}{
		{"10/fortnight", `period "fortnight"`},
		{"10/sec", `did you mean 10/s?`},
		{"10/min", `did you mean 10/m?`},
		{"10/2days:window", `did you mean 10/2d:window?`},
		{"10/hours", `did you mean 10/h?`},
		{"30sec:adaptive", `the period "30sec" is not one: write 30s`},
		{"10/31d", `the period "31d" is over 30 days, the longest a limit may have`},
		{"10/744h", `the period "744h" is over 30 days`},
		{"10/1500us", `not a whole number of milliseconds`},
		{"99999999/1ms", `99999999 per 1 millisecond is 99999999000 per second, over 1000000 per second, the highest rate`},
		{"1000001/s", `1000001 per 1 second is 1000001 per second, over 1000000 per second`},
		{"10/s:burst=2000000000", `the burst 2000000000 is over 1000000000, the largest`},
		{"2000000000/30d", `the burst, 2000000000 (the rate, unless :burst=N), is over 1000000000`},
		{"2000000000/30d:window", `2000000000 calls per window is over 1000000000`},
		{"2000000:inflight", `2000000 tasks in flight is over 1000000, the most`},
		{"500ms:adaptive", `the clean period 500ms is under 1 second, the shortest`},
		{"99999999999999999999/s", `rate "99999999999999999999" is too large`},
		{"10", `no '/' between rate and period in "10"`},
		{"ten/s", `rate "ten"`},
		{"0/s", `rate "0"`},
		{"-1/s", `rate "-1"`},
		{"10/-1s", `period "-1s"`},
		{"10/0s", `period "0s"`},
		{"/s", `rate ""`},
		{"10/", `period ""`},
		{"10/s:burst=0", `burst "0"`},
		{"10/s:burst=x", `burst "x"`},
		{"10/s:b=2", `"b=2" after ':'`},
		{"10/s:", `nothing after ':'`},
		{"10/s:Window", `"Window" after ':'`},
		{"10/s:Window", `did you mean :window?`},
		{"10/s:burst", `":burst" needs its size: write :burst=N`},

		// Units: a word after ':' that is no modifier is one, if throttle
		// takes its name and it is not a modifier misspelt.
		{"30000/m:Tokens", `"Tokens" after ':' is none of burst=N, window, fixed, inflight, adaptive, nor a unit (unit "Tokens": want a lowercase letter`},
		{"30000/m:Tokens", `did you mean :tokens?`},
		{"30000/m:1tokens", `"1tokens" after ':' is none of`},
		{"30000/m:tok.ens", `"tok.ens" after ':' is none of`},
		{"30000/m:_tokens", `"_tokens" after ':' is none of`},
		{"30000/m:" + strings.Repeat("x", 33), `want 1 to 32 characters`},
		{"30000/m:windwo", `did you mean :window?`},
		{"30000/m:windwo", `"windwo" after ':' looks like a misspelt modifier, not a unit`},
		{"30000/m:windows", `did you mean :window?`},
		{"30000/m:fixd", `did you mean :fixed?`},
		{"30000/m:mixed", `did you mean :fixed?`},
		{"30000/m:inflihgt", `did you mean :inflight?`},
		{"30000/m:adaptiv", `did you mean :adaptive?`},
		{"30000/m:request", `did you mean :requests?`},
		{"30000/m:brust=2000", `did you mean :burst=2000?`},
		{"30000/m:bursts", `did you mean :burst=N?`},
		{"30000/m:windwo:tokens", `did you mean :window?`},
		{"30000/m:burst=2000:windwo", `did you mean :window?`},
		{"30000/m:tokens:window", `the unit goes last: write 30000/m:window:tokens`},
		{"30000/m:tokens:burst=9", `the unit goes last: write 30000/m:burst=9:tokens`},
		{"30000/m:tokens:input", `":tokens:input" has two units; a tier counts one`},
		{"30000/m:window:tokens:input", `":window:tokens:input" has more than one ':' modifier`},
		{"30000/m:window:", `nothing after ':'`},
		{"4:inflight:tokens", `an in-flight limit counts tasks running, not a unit: write 4:inflight`},
		{"4:inflight:requests", `an in-flight limit counts tasks running, not a unit`},
		{"30s:adaptive:tokens", `an adaptive limit has no unit`},
		{"tokens:30000/m", `the unit "tokens" goes after the limit, as in 30000/m:tokens`},
		{"4:tokens", `no '/' between rate and period in "4"`},
		{"10/s:burst=20:window", `":burst=20:window" has more than one ':' modifier`},
		{"5000/h:window:burst=5", `":window:burst=5" has more than one`},
		{"window:5000/h", `"window" goes after the limit, as in 5000/h:window`},
		{"fixed:5000/h", `"fixed" goes after the limit, as in 5000/h:fixed`},
		{"inflight:4", `"inflight" goes after the limit, as in 4:inflight`},
		{"burst=20:10/s", `"burst=20" goes after the limit, as in 10/s:burst=20`},
		{"4/s:inflight", `an in-flight limit has no period: write 4:inflight`},
		{"0:inflight", `number of tasks in flight "0"`},
		{"5/s:adaptive", `an adaptive limit is its clean interval alone`},
		{"adaptive:30s", `"adaptive" goes after the limit`},
		{"four:inflight", `number of tasks in flight "four"`},
		{":inflight", `number of tasks in flight ""`},
		{"ten/s:window", `rate "ten"`},
		{"10/x:window", `period "x"`},
		{"", `no '/'`},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			_, err := limitspec.Parse(tc.spec)
			require.ErrorIs(t, err, limitspec.ErrSyntax, "Parse(%q)", tc.spec)
			assert.Contains(t, err.Error(), tc.part, "the error names the bad part")
			assert.True(t, strings.HasPrefix(err.Error(), "bad limit "+strconv.Quote(tc.spec)+": "), "the error leads with the limit: %q", err)
			assert.LessOrEqual(t, len(err.Error()), maxErrorLen+len(tc.spec), "the error is the fault, not the grammar: %q", err)
			assert.NotContains(t, err.Error(), "limits[", "no Go field names")
		})
	}
	_, err := limitspec.ParseAll(" ")
	assert.ErrorIs(t, err, limitspec.ErrSyntax)
	// As a set, what SetLimits refuses, in the limits' own words.
	for specs, says := range map[string]string{
		"10/s 20/s":                   `"10/s" and "20/s" are one tier twice (a tier is its kind, period and unit)`,
		"10/s:window 5/1000ms:window": `"10/s:window" and "5/1000ms:window" are one tier twice`,
		"1/s 1/2s 1/3s 1/4s 1/5s 1/6s 1/7s 1/8s 1/9s": `9 buckets and windows, at most 8`,
		"4:inflight 10/s 8:inflight":                  `"4:inflight" and "8:inflight": a key has one inflight limit`,
		"30s:adaptive 1m:adaptive 10/s":               `a key has one adaptive limit`,
		"30s:adaptive 4:inflight":                     `"30s:adaptive" adapts the key's rates, and none is given`,
	} {
		_, err := limitspec.ParseAll(specs)
		if assert.ErrorIs(t, err, limitspec.ErrSyntax, specs) {
			assert.Contains(t, err.Error(), says, specs)
			assert.LessOrEqual(t, len(err.Error()), maxErrorLen, specs)
		}
	}
	for _, ok := range []string{"10/s 10/s:window 10/s:fixed 10/s:tokens", "1/s 1/2s 1/3s 1/4s 1/5s 1/6s 1/7s 1/8s 4:inflight 30s:adaptive"} {
		_, err := limitspec.ParseAll(ok)
		assert.NoError(t, err, "%s: a tier is its kind, period and unit", ok)
	}
	ls, err := limitspec.ParseAll("10/s 50/m", "1/h 5000/h:window", "4:inflight")
	require.NoError(t, err)
	assert.Equal(t, "10/s 50/m 1/h 5000/h:window 4:inflight", limitspec.FormatAll(ls))
}

// Parse(Format(l)) == l for limits in the form Limits returns them, of
// every kind; the constructors' form (Burst 0) formats the same.
func TestFormatThenParseGivesTheLimitBack(t *testing.T) {
	for _, tc := range []struct {
		fromRedis, constructed throttle.Limit
		spec                   string
	}{
		{throttle.Limit{N: 10, Per: time.Second, Burst: 10}, throttle.PerSecond(10), "10/s"},
		{throttle.Limit{N: 10, Per: time.Second, Burst: 25}, throttle.PerSecond(10).WithBurst(25), "10/s:burst=25"},
		{throttle.Limit{N: 3, Per: 1500 * time.Millisecond, Burst: 3}, throttle.Limit{N: 3, Per: 1500 * time.Millisecond}, "3/1500ms"},
		{throttle.Limit{Kind: throttle.KindWindow, N: 5000, Per: time.Hour}, throttle.Window(5000, time.Hour), "5000/h:window"},
		{throttle.Limit{Kind: throttle.KindWindow, N: 7, Per: 42 * time.Second}, throttle.Window(7, 42*time.Second), "7/42s:window"},
		{throttle.Limit{Kind: throttle.KindInFlight, N: 4}, throttle.InFlight(4), "4:inflight"},
		{throttle.Limit{N: 30000, Per: time.Minute, Burst: 30000, Unit: "tokens"}, throttle.PerMinute(30000).In("tokens"), "30000/m:tokens"},
		{throttle.Limit{N: 30000, Per: time.Minute, Burst: 2000, Unit: "tokens"}, throttle.PerMinute(30000).WithBurst(2000).In("tokens"), "30000/m:burst=2000:tokens"},
		{throttle.Limit{Kind: throttle.KindWindow, N: 100, Per: time.Minute, Unit: "tokens"}, throttle.Window(100, time.Minute).In("tokens"), "100/m:window:tokens"},
		{throttle.Limit{Kind: throttle.KindFixedWindow, N: 100, Per: time.Minute, Unit: "tokens"}, throttle.FixedWindow(100, time.Minute).In("tokens"), "100/m:fixed:tokens"},
		{throttle.Limit{N: 500, Per: time.Minute, Burst: 500}, throttle.PerMinute(500).In("requests"), "500/m"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			assert.Equal(t, tc.spec, limitspec.Format(tc.fromRedis))
			assert.Equal(t, tc.spec, limitspec.Format(tc.constructed))
			got, err := limitspec.Parse(limitspec.Format(tc.fromRedis))
			require.NoError(t, err)
			assert.Equal(t, tc.fromRedis, got, "Parse(Format(%#v))", tc.fromRedis)
			assert.Equal(t, limitspec.Burst(tc.constructed), limitspec.Burst(got))
		})
	}
}

// Through a real Redis: what SetLimits stores from a spec, Limits returns
// as Parse gave it, and formats back to the spec.
func TestSpecRoundTripsThroughRedis(t *testing.T) {
	ctx := context.Background()
	lim := throttle.NewLimiter(redistest.Start(t).Client(t))
	for i, spec := range []string{
		"10/s",
		"5/s:burst=8 100/m",
		"5000/h:window",
		"10/s:burst=20 5000/h:window 4:inflight",
		"100/m:window 1/s 2/d 7/42s:window 1:inflight",
		"3:inflight",
		"500/m 30000/m:tokens 16:inflight",
		"10/s:burst=20 30000/m:burst=2000:tokens 100/m:window:input-tokens 100/m:fixed:output-tokens 1/d:tokens 30s:adaptive",
	} {
		t.Run(spec, func(t *testing.T) {
			ls, err := limitspec.ParseAll(spec)
			require.NoError(t, err)
			key := "k" + string(rune('a'+i))
			require.NoError(t, lim.SetLimits(ctx, key, ls...))
			st, err := lim.Inspect(ctx, key)
			require.NoError(t, err)
			got := st.Limits
			assert.Equal(t, ls, got, "Limits after SetLimits(ParseAll(%q))", spec)
			assert.Equal(t, spec, limitspec.FormatAll(got))
		})
	}
}

func TestBurstAndKindNameDescribeEachKind(t *testing.T) {
	for _, tc := range []struct {
		l     throttle.Limit
		burst int
		kind  string
	}{
		{throttle.PerSecond(10), 10, "bucket"},
		{throttle.PerSecond(10).WithBurst(3), 3, "bucket"},
		{throttle.Window(500, time.Hour), 500, "window"},
		{throttle.InFlight(4), 4, "inflight"},
		{throttle.FixedWindow(60, time.Minute).In("tokens"), 60, "fixed"},
		{throttle.Adaptive(time.Minute), 0, "adaptive"},
	} {
		t.Run(tc.l.String(), func(t *testing.T) {
			assert.Equal(t, tc.burst, limitspec.Burst(tc.l))
			assert.Equal(t, tc.kind, limitspec.KindName(tc.l.Kind))
		})
	}
	assert.Equal(t, "kind(9)", limitspec.KindName(9))
}

// Unit names what each limit counts: requests unless In says otherwise,
// nothing for an in-flight or adaptive limit; Views carries it per tier.
func TestUnitNamesWhatEachLimitCounts(t *testing.T) {
	for _, tc := range []struct {
		l    throttle.Limit
		unit string
	}{
		{throttle.PerMinute(500), "requests"},
		{throttle.PerMinute(500).In("requests"), "requests"},
		{throttle.PerMinute(30000).In("tokens"), "tokens"},
		{throttle.Window(100, time.Minute).In("input-tokens"), "input-tokens"},
		{throttle.InFlight(16), ""},
		{throttle.Adaptive(time.Minute), ""},
	} {
		assert.Equal(t, tc.unit, limitspec.Unit(tc.l), "%v", tc.l)
	}
	assert.False(t, limitspec.HasUnits([]throttle.Limit{throttle.PerMinute(500), throttle.InFlight(16)}))
	assert.True(t, limitspec.HasUnits([]throttle.Limit{throttle.PerMinute(500), throttle.PerMinute(30000).In("tokens")}))

	ls, err := limitspec.ParseAll("500/m 30000/m:tokens 16:inflight")
	require.NoError(t, err)
	tiers, slots := limitspec.Views(throttle.Status{Limits: ls, InForce: ls, Tokens: []float64{499, 18000, 16}})
	assert.Equal(t, []limitspec.TierView{
		{Kind: "bucket", Limit: "500/m", Unit: "requests", Rate: 500, PeriodSeconds: 60, Burst: 500, Tokens: 499},
		{Kind: "bucket", Limit: "30000/m:tokens", Unit: "tokens", Rate: 30000, PeriodSeconds: 60, Burst: 30000, Tokens: 18000},
		{Kind: "inflight", Limit: "16:inflight", Rate: 16, Burst: 16, Tokens: 16},
	}, tiers)
	assert.Equal(t, &limitspec.SlotsView{Held: 0, Max: 16}, slots)
}

// A unit is refused within two edits of a modifier's name (or of
// "requests"), and taken beyond: the rule is the edit distance, with a
// swap of neighbours one edit.
func TestUnitsNearAModifierAreRefusedOthersTaken(t *testing.T) {
	for _, unit := range []string{"windwo", "wind", "indow", "fixes", "fix", "inflght", "adaptiv", "requets", "request", "bursts", "burstx"} {
		_, err := limitspec.Parse("10/m:" + unit)
		require.ErrorIs(t, err, limitspec.ErrSyntax, "%q is a modifier misspelt", unit)
		assert.Contains(t, err.Error(), "did you mean", unit)
	}
	for _, unit := range []string{"tokens", "input-tokens", "output-tokens", "bytes", "credits", "images", "win", "fax", "points", "gpu_seconds", "queries"} {
		l, err := limitspec.Parse("10/m:" + unit)
		if assert.NoError(t, err, "%q is a unit", unit) {
			assert.Equal(t, unit, l.Unit)
		}
	}
}

// FuzzParseSpec: Parse never panics, and every spec it accepts formats to
// one field that parses back to the same limit, and formats the same again.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"10/s", "10/s:burst=20", "100/1500ms", "5000/h:window", "4:inflight", "window:5/h", "7/d",
		"30000/m:tokens", "30000/m:burst=2000:tokens", "100/m:window:tokens", "100/m:fixed:requests", "10/s:windwo", "4:inflight:tokens"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		l, err := limitspec.Parse(spec)
		if err != nil {
			// (Bounded by the input: the message may quote the spec, the
			// clause at fault and a unit, each escaped, an invalid byte as
			// four.)
			if !strings.HasPrefix(err.Error(), "bad limit "+strconv.Quote(spec)+": ") || len(err.Error()) > maxErrorLen+3*len(strconv.Quote(spec)) {
				t.Fatalf("Parse(%q): error %q does not lead with the limit and its fault", spec, err)
			}
			return
		}
		s := limitspec.Format(l)
		if f := strings.Fields(s); len(f) != 1 || f[0] != s {
			t.Fatalf("Format(Parse(%q)) = %q: not one field", spec, s)
		}
		back, err := limitspec.Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q) accepted, but Parse(Format) = Parse(%q): %v", spec, s, err)
		}
		if back != l {
			t.Fatalf("Parse(%q) = %#v, but Parse(Format) = Parse(%q) = %#v", spec, l, s, back)
		}
		if again := limitspec.Format(back); again != s {
			t.Fatalf("Format not stable: %q, then %q", s, again)
		}
		if l.Unit != "" && (l.Unit == limitspec.Requests || limitspec.CheckUnit(l.Unit) != nil || l.Kind == throttle.KindInFlight || l.Kind == throttle.KindAdaptive) {
			t.Fatalf("Parse(%q) = %#v: a unit throttle refuses, or on a limit that counts none", spec, l)
		}
		if l.Kind == throttle.KindAdaptive {
			if l.Per <= 0 {
				t.Fatalf("Parse(%q) = %#v: accepted an adaptive limit without a clean period", spec, l)
			}
			return // no rate or burst: its Per is the clean period
		}
		if l.N <= 0 || (l.Kind != throttle.KindInFlight && l.Per <= 0) || limitspec.Burst(l) <= 0 {
			t.Fatalf("Parse(%q) = %#v: accepted a limit without a positive rate, period or burst", spec, l)
		}
	})
}
