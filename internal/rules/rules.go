// Package rules holds what throttle shares with the operator's tools
// (internal/limitspec: the CLI and the web view) about limits written by
// hand: the bounds of a limit, and how a period and a rate tier are
// written ("2d", "10/s:burst=20", "5000/h:window", "30000/m:tokens"), so
// that an error of throttle and one of the CLI say a limit alike.
package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Bounds on limits: SetLimits refuses values outside them, and so do the
// scripts for limits read from Redis (lib.lua holds the same numbers).
const (
	MaxTiers         = 8                   // rate tiers per key (windows and buckets)
	MaxPer           = 30 * 24 * time.Hour // the longest period
	MaxRatePerSecond = 1_000_000           // the highest rate of a tier
	MaxBurst         = 1_000_000_000       // the largest burst, and a window's largest N
	MaxInFlight      = 1_000_000           // the most slots of an InFlight limit
	MinAdaptive      = time.Second         // the shortest clean period of an Adaptive limit
)

// units are the named periods, the largest first.
var units = []struct {
	name string
	d    time.Duration
}{
	{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond},
}

// FormatPeriod writes a period as an operator types it: a unit alone for
// one of it ("s", "m", "h", "d"), else a whole number of the largest unit
// that divides it ("2d", "90s", "1500ms"), else Go's form.
func FormatPeriod(d time.Duration) string {
	if d <= 0 {
		return d.String()
	}
	for _, u := range units {
		if d == u.d && u.name != "ms" {
			return u.name
		}
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}

// FormatWords writes a period in words for messages: "30 days", "1 hour",
// "90 seconds", "1.5 seconds".
func FormatWords(d time.Duration) string {
	words := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}, {time.Millisecond, "millisecond"}}
	for _, w := range words {
		if d >= w.d && d%w.d == 0 {
			n := int64(d / w.d)
			if n == 1 {
				return "1 " + w.name
			}
			return strconv.FormatInt(n, 10) + " " + w.name + "s"
		}
	}
	return d.String()
}

// synonyms are what people type for a unit, and the unit they mean.
var synonyms = map[string]string{
	"sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"min": "m", "mins": "m", "minute": "m", "minutes": "m",
	"hr": "h", "hrs": "h", "hour": "h", "hours": "h",
	"day": "d", "days": "d",
	"msec": "ms", "millisecond": "ms", "milliseconds": "ms",
}

// ParsePeriod reads a period: "s", "m", "h" or "d" alone, a whole number of
// one of them or of "ms" ("2d", "90s", "1500ms"), or a Go duration
// ("1m30s"). It refuses what is not one, zero or less, a period that is
// not a whole number of milliseconds and one over MaxPer; the error says
// so in words and, for "sec", "min", "hour", "day" and the like, names the
// period meant (a *PeriodError with a Suggestion).
func ParsePeriod(s string) (time.Duration, error) {
	digits := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	word := s[len(digits):]
	n := int64(1)
	if digits != "" {
		v, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			n = -1
		} else {
			n = v
		}
	}
	for _, u := range units {
		if word != u.name || n < 0 || (digits == "" && u.name == "ms") {
			continue
		}
		if n == 0 {
			return 0, fmt.Errorf("the period %q is zero: it must be more than 0", s)
		}
		if n > int64(MaxPer/u.d) {
			return 0, tooLong(s)
		}
		return time.Duration(n) * u.d, nil
	}
	if unit, ok := synonyms[strings.ToLower(word)]; ok && n >= 0 {
		want := unit
		if digits != "" || unit == "ms" {
			want = strconv.FormatInt(n, 10) + unit
		}
		return 0, &PeriodError{Period: s, Suggestion: want}
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, &PeriodError{Period: s}
	case d <= 0:
		return 0, fmt.Errorf("the period %q is not more than 0", s)
	case d%time.Millisecond != 0:
		return 0, fmt.Errorf("the period %q is not a whole number of milliseconds", s)
	case d > MaxPer:
		return 0, tooLong(s)
	}
	return d, nil
}

func tooLong(period string) error {
	return fmt.Errorf("the period %q is over %s, the longest a limit may have", period, FormatWords(MaxPer))
}

// PeriodError is a period ParsePeriod cannot read.
type PeriodError struct {
	Period     string
	Suggestion string // the period meant ("s" for "sec", "2d" for "2days"), or ""
}

func (e *PeriodError) Error() string {
	msg := fmt.Sprintf("the period %q is none of s, m, h, d, a whole number of one (2d, 90s, 1500ms) or a duration such as 1m30s", e.Period)
	if e.Suggestion != "" {
		msg = fmt.Sprintf("the period %q is not one: write %s", e.Period, e.Suggestion)
	}
	return msg
}

// The kinds of rate tier, as Tier writes them after the period.
const (
	KindBucket = ""
	KindWindow = "window"
	KindFixed  = "fixed"
)

// Tier writes a rate tier as the CLI takes it: n per period, then its burst
// when a bucket's differs from n, or its kind (KindWindow, KindFixed), then
// its unit when it counts something other than requests ("" or
// "requests"): "10/s", "10/s:burst=20", "5000/h:window",
// "30000/m:burst=2000:tokens".
func Tier(kind string, n int64, per time.Duration, burst int64, unit string) string {
	s := strconv.FormatInt(n, 10) + "/" + FormatPeriod(per)
	switch {
	case kind != KindBucket:
		s += ":" + kind
	case burst != 0 && burst != n:
		s += ":burst=" + strconv.FormatInt(burst, 10)
	}
	if unit != "" && unit != "requests" {
		s += ":" + unit
	}
	return s
}

// Decimal writes a number without an exponent: 99999999, 0.5, 1666.6667.
func Decimal(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}
