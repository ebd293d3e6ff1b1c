package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// keyView is what the CLI shows of one key, as a table row, a `get` block
// or JSON. A field added to throttle.Status goes here (or, per limit, in
// limitspec.Views, shared with the web view), in newKeyView and in
// keyColumns.
type keyView struct {
	Key    string               `json:"key"`
	Limits []limitspec.TierView `json:"limits"`
	// Generation counts the changes of the key's limits (every set bumps it).
	Generation int64 `json:"generation"`
	// InFlight is the slots of the key's in-flight limit; absent without one.
	InFlight         *limitspec.SlotsView `json:"in_flight,omitempty"`
	SuspendedSeconds float64              `json:"suspended_seconds"`
	Reservations     int                  `json:"reservations"`
	QueuedSeconds    float64              `json:"queued_seconds"`
	// Tenants are the key's tenants (throttle.Tenant) as Inspect reads
	// them: those with work booked, the next in line first (at most 100),
	// then the others with a weight set; absent when its tasks have none.
	Tenants []tenantView `json:"tenants,omitempty"`
	Error   string       `json:"error,omitempty"`

	st throttle.Status
}

func newKeyView(key string, st throttle.Status, err error) keyView {
	v := keyView{
		Key:              key,
		Generation:       st.Generation,
		SuspendedSeconds: st.SuspendedFor.Seconds(),
		Reservations:     st.Reservations,
		QueuedSeconds:    st.QueuedFor.Seconds(),
		Tenants:          newTenantViews(st.Tenants),
		st:               st,
	}
	if err != nil {
		v.Error = err.Error()
	}
	v.Limits, v.InFlight = limitspec.Views(st)
	return v
}

// column is one field of a keyView in the table and in `get`.
type column struct {
	name  string
	value func(keyView) string
}

var keyColumns = []column{
	{"KEY", func(v keyView) string { return v.Key }},
	{"LIMITS", func(v keyView) string {
		if v.Error != "" {
			return "invalid (" + v.Error + ")"
		}
		if len(v.Limits) == 0 {
			return "none (unthrottled)"
		}
		return formatLimits(v.st.Limits) + inForce(v)
	}},
	{"TOKENS", func(v keyView) string {
		s := rateTokens(v.st)
		if s == "" {
			return "-"
		}
		if v.st.QueuedFor > 0 {
			// Promised to the reserved tasks: a task without a reservation
			// waits behind them, however many tokens the bucket holds.
			s += " (for the queue)"
		}
		return s
	}},
	{"IN FLIGHT", func(v keyView) string {
		if v.InFlight == nil {
			return "-"
		}
		return fmt.Sprintf("%d/%d", v.InFlight.Held, v.InFlight.Max)
	}},
	{"SUSPENDED", func(v keyView) string { return formatDur(v.st.SuspendedFor) }},
	{"RESERVED", func(v keyView) string { return fmt.Sprint(v.Reservations) }},
	{"DRAINS IN", func(v keyView) string { return formatDur(v.st.QueuedFor) }},
	{"GEN", func(v keyView) string {
		if v.Generation == 0 {
			return "-"
		}
		return fmt.Sprint(v.Generation)
	}},
}

// inForce is " (in force: 10/s, learned for 9m58s)" when a limit in force
// is below the configured one: learned from the provider (Observe) or cut
// by adaptive mode.
func inForce(v keyView) string {
	var parts []string
	learned := time.Duration(0)
	for i, t := range v.Limits {
		if t.InForce == "" {
			continue
		}
		parts = append(parts, t.InForce)
		if d := v.st.LearnedFor; i < len(d) && d[i] > learned {
			learned = d[i]
		}
	}
	if len(parts) == 0 {
		return ""
	}
	why := "adaptive"
	if learned > 0 {
		why = "learned for " + formatDur(learned)
	}
	return " (in force: " + strings.Join(parts, " ") + ", " + why + ")"
}

// rateTokens shows the tokens of a key's rate limits, in their order:
// "8.0/8" for a bucket (tokens now/burst), "4990/5000" for a window (calls
// it would still admit/calls per window). On a key with tiers in other
// units each names its unit, and they are separated by commas:
// "499.0/500 requests, 18000.0/30000 tokens". An in-flight limit is shown
// in its own column.
func rateTokens(st throttle.Status) string {
	var parts []string
	units := limitspec.HasUnits(st.Limits)
	for i, l := range st.Limits {
		if i >= len(st.Tokens) || l.Kind == throttle.KindInFlight || l.Kind == throttle.KindAdaptive {
			continue
		}
		unit := limitspec.Unit(l)
		if i < len(st.InForce) {
			l = st.InForce[i] // the burst in force
		}
		// A bucket in debt (none left until the provider's reset, or a
		// charge above what was taken) shows 0: what it admits now.
		tokens := max(st.Tokens[i], 0)
		s := fmt.Sprintf("%.1f/%d", tokens, burstOf(l))
		if l.Kind == throttle.KindWindow || l.Kind == throttle.KindFixedWindow {
			s = fmt.Sprintf("%.0f/%d", math.Floor(tokens), burstOf(l))
		}
		if units {
			s += " " + unit
		}
		parts = append(parts, s)
	}
	if units {
		return strings.Join(parts, ", ")
	}
	return strings.Join(parts, " ")
}

// readKeys inspects keys; a key whose state cannot be read (invalid limits)
// is shown with its error, a Redis failure ends the read.
func readKeys(ctx context.Context, lim *throttle.Limiter, keys []string) ([]keyView, error) {
	states, err := lim.InspectKeys(ctx, keys)
	if err != nil {
		return nil, err
	}
	views := make([]keyView, 0, len(keys))
	for _, s := range states {
		// A key that cannot be read (invalid limits, a Redis key of the
		// wrong type under the prefix) shows its error; the rest are shown.
		views = append(views, newKeyView(s.Key, s.Status, s.Err))
	}
	return views, nil
}

// writeTable writes views as an aligned table.
func writeTable(w io.Writer, views []keyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	names := make([]string, len(keyColumns))
	for i, c := range keyColumns {
		names[i] = c.name
	}
	fmt.Fprintln(tw, strings.Join(names, "\t"))
	for _, v := range views {
		cells := make([]string, len(keyColumns))
		for i, c := range keyColumns {
			cells[i] = c.value(v)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// writeBlock writes one key as "field: value" lines (for get), then its
// tenants, when it has any, as a table.
func writeBlock(w io.Writer, v keyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range keyColumns {
		fmt.Fprintf(tw, "%s:\t%s\n", strings.ToLower(c.name), c.value(v))
	}
	if len(v.Tenants) > 0 {
		fmt.Fprintf(tw, "tenants:\t%s\n", tenantsSummary(v.Tenants))
	}
	if err := tw.Flush(); err != nil || len(v.Tenants) == 0 {
		return err
	}
	return writeTenants(w, v.Tenants)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
