// Package limitspec reads and writes limits in the operator's short form,
// "10/s", "50/m", "5000/h", "100/1500ms", "10/s:burst=20", shared by the
// CLI and the dashboard so that what one shows the other accepts.
package limitspec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Forms names the accepted forms, for errors and help texts.
const Forms = `RATE/PERIOD[:burst=N], PERIOD one of s, m, h, d or a duration such as 1500ms, 10s, 2m (e.g. 10/s, 50/m, 5000/h, 100/1500ms, 10/s:burst=20)`

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("bad limit")

// units are the named periods.
var units = []struct {
	name string
	d    time.Duration
}{
	{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour},
}

// Parse reads one tier. Range checks (at most MaxPer, ...) are SetLimits'.
func Parse(spec string) (throttle.Limit, error) {
	bad := func(why string) (throttle.Limit, error) {
		return throttle.Limit{}, fmt.Errorf("%w %q: %s; want %s", ErrSyntax, spec, why, Forms)
	}
	body, opt, hasOpt := strings.Cut(spec, ":")
	rateS, perS, ok := strings.Cut(body, "/")
	if !ok {
		return bad("no '/' between rate and period")
	}
	rate, err := strconv.Atoi(rateS)
	if err != nil || rate <= 0 {
		return bad(fmt.Sprintf("rate %q is not a whole number > 0", rateS))
	}
	var per time.Duration
	for _, u := range units {
		if perS == u.name {
			per = u.d
		}
	}
	if per == 0 {
		d, err := time.ParseDuration(perS)
		if err != nil || d <= 0 {
			return bad(fmt.Sprintf("period %q is neither s, m, h, d nor a duration", perS))
		}
		per = d
	}
	l := throttle.Limit{Rate: rate, Per: per}
	if hasOpt {
		v, ok := strings.CutPrefix(opt, "burst=")
		b, err := strconv.Atoi(v)
		if !ok || err != nil || b <= 0 {
			return bad(fmt.Sprintf("%q after ':' is not burst=N with N a whole number > 0", opt))
		}
		l.Burst = b
	}
	return l, nil
}

// ParseAll reads tiers separated by spaces or given one per element.
func ParseAll(specs ...string) ([]throttle.Limit, error) {
	var out []throttle.Limit
	for _, s := range specs {
		for _, f := range strings.Fields(s) {
			l, err := Parse(f)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no limit given; want %s", ErrSyntax, Forms)
	}
	return out, nil
}

// Format writes a tier the way Parse reads it; the burst is shown when it
// differs from the rate.
func Format(l throttle.Limit) string {
	s := strconv.Itoa(l.Rate) + "/" + formatPeriod(l.Per)
	if l.Burst != 0 && l.Burst != l.Rate {
		s += ":burst=" + strconv.Itoa(l.Burst)
	}
	return s
}

// FormatAll joins tiers with spaces, as ParseAll reads them.
func FormatAll(ls []throttle.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = Format(l)
	}
	return strings.Join(parts, " ")
}

func formatPeriod(d time.Duration) string {
	for _, u := range units {
		if d == u.d {
			return u.name
		}
	}
	return d.String()
}

// Burst is a limit's effective burst (Burst 0 means Rate).
func Burst(l throttle.Limit) int {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}
