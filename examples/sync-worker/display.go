package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// row is one provider's line of the progress display.
type row struct {
	Name     string
	Done     int
	Total    int
	Rate     float64          // 200s per second over the last rateWindow
	Finished time.Duration    // since start, when Done reached Total
	Limit    []throttle.Limit // in Redis now, as configured
	InForce  []throttle.Limit // in force now: Limit, or what was learned
	// LearnedFor is, per tier of Limit, how long a quota learned from the
	// provider stays in force unconfirmed (0: none).
	LearnedFor []time.Duration
	Deferred   int64
	Suspended  int64
	TooMany    int64
	// SuspendedFor is what is left of the key's suspension (Inspect).
	SuspendedFor time.Duration
	// Waiting counts, per worker, the tasks it deferred because the key
	// was suspended.
	Waiting map[string]int64
	// Tenants are the provider's customers, when its jobs are split
	// between them (TenantSplit).
	Tenants []tenantRow
}

// maxWidth is the widest line the display prints: it fits an 80-column
// terminal.
const maxWidth = 80

// rateWindow is the span the live rate is measured over.
const rateWindow = 2 * time.Second

// maxEvents is how many recent events the live display keeps on screen.
const maxEvents = 6

// display shows a run's progress on out: redrawn in place when out is a
// terminal (live), else as plain lines, one per provider per update, that a
// log file or CI output can keep. It is safe for concurrent use: events come
// from worker goroutines.
type display struct {
	out      io.Writer
	live     bool
	start    time.Time
	interval time.Duration // plain: between progress lines

	mu        sync.Mutex
	muted     bool     // events are dropped
	events    []string // live: the last maxEvents
	drawn     int      // live: lines drawn by the last update
	lastPrint time.Time
	reported  map[string]bool // plain: providers whose "done" line is out
}

func newDisplay(out io.Writer, live bool, start time.Time, interval time.Duration) *display {
	return &display{out: out, live: live, start: start, interval: interval, lastPrint: start, reported: map[string]bool{}}
}

func (d *display) since() string {
	return fmt.Sprintf("%5.1fs", time.Since(d.start).Seconds())
}

// event reports something that happened: a quota learned, a provider's 429,
// a worker process's log line.
func (d *display) event(line string) {
	prefix := d.since() + "  "
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.muted {
		return
	}
	if !d.live {
		indent := strings.Repeat(" ", len(prefix)+2)
		for i, l := range wrap(line, maxWidth-len(prefix)) {
			if i > 0 {
				prefix = indent
			}
			fmt.Fprintln(d.out, prefix+l)
		}
		return
	}
	// Live, events are drawn indented by two: keep each on one line.
	if width := maxWidth - 2 - len(prefix); utf8.RuneCountInString(line) > width {
		line = string([]rune(line)[:width-1]) + "…"
	}
	d.events = append(d.events, prefix+line)
	if len(d.events) > maxEvents {
		d.events = d.events[len(d.events)-maxEvents:]
	}
}

// wrap breaks s at spaces into a line of at most width runes and lines of
// at most width-2 (they are indented by two more); a word longer than a line
// is cut.
func wrap(s string, width int) []string {
	var lines []string
	for w := width; utf8.RuneCountInString(s) > w; w = width - 2 {
		r := []rune(s)
		cut := strings.LastIndex(string(r[:w+1]), " ")
		if cut <= 0 {
			cut = len(string(r[:w]))
			lines = append(lines, s[:cut])
			s = s[cut:]
			continue
		}
		lines = append(lines, s[:cut])
		s = strings.TrimLeft(s[cut:], " ")
	}
	return append(lines, s)
}

// mute drops every later event: the run is over, and what the workers
// still say as they stop would only bury why.
func (d *display) mute() {
	d.mu.Lock()
	d.muted = true
	d.mu.Unlock()
}

// update shows rows: live, at once; plain, one line per provider every
// interval, and a provider's "done" line as soon as it is done.
func (d *display) update(rows []row) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live {
		d.redraw(rows)
		return
	}
	due := time.Since(d.lastPrint) >= d.interval
	if due {
		d.lastPrint = time.Now()
	}
	for _, r := range rows {
		finished := r.Done >= r.Total
		started := r.Done > 0 || r.Deferred > 0 || r.TooMany > 0
		if d.reported[r.Name] || !started || !due && !finished {
			continue
		}
		status := fmt.Sprintf("%5.1f/s", r.Rate)
		if finished {
			d.reported[r.Name] = true
			status = fmt.Sprintf("done in %.1fs", r.Finished.Seconds())
		}
		fmt.Fprintf(d.out, "%s  %-7s %4d/%-4d %-14s deferred %-5d suspended %-3d 429s %d\n",
			d.since(), r.Name, r.Done, r.Total, status, r.Deferred, r.Suspended, r.TooMany)
		if len(r.Tenants) > 0 {
			prefix := fmt.Sprintf("%s  %-7s tenants: ", d.since(), r.Name)
			indent := strings.Repeat(" ", len(prefix)+2)
			for i, l := range wrap(tenantsLine(r.Tenants), maxWidth-len(prefix)) {
				if i > 0 {
					prefix = indent
				}
				fmt.Fprintln(d.out, prefix+l)
			}
		}
	}
}

// finish leaves the last live frame on screen.
func (d *display) finish(rows []row) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live {
		d.redraw(rows)
		d.drawn = 0
	}
}

func (d *display) redraw(rows []row) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "elapsed %.1fs\n", time.Since(d.start).Seconds())
	// At most ~80 columns: a wrapped line would break the redraw.
	cells := make([][]string, len(rows))
	for i, r := range rows {
		rate := fmt.Sprintf("%.1f/s", r.Rate)
		if r.Done >= r.Total {
			rate = "in " + seconds(r.Finished)
		}
		cells[i] = []string{r.Name, bar(r.Done, r.Total, 5), fmt.Sprintf("%d/%d", r.Done, r.Total), rate,
			limitCell(r), itoa(r.Deferred), itoa(r.Suspended), itoa(r.TooMany)}
	}
	writeAligned(&b, liveColumns, cells)
	for _, r := range rows {
		if len(r.Tenants) > 0 {
			// Cut, not wrapped: see the auto-wrap below.
			line := r.Name + " tenants: " + tenantsLine(r.Tenants)
			if utf8.RuneCountInString(line) > maxWidth {
				line = string([]rune(line)[:maxWidth-1]) + "…"
			}
			fmt.Fprintln(&b, line)
		}
	}
	if len(d.events) > 0 {
		fmt.Fprintln(&b, "events:")
		for _, e := range d.events {
			fmt.Fprintln(&b, " ", e)
		}
	}
	var o strings.Builder
	if d.drawn > 0 {
		fmt.Fprintf(&o, "\x1b[%dF", d.drawn) // back to the first line drawn
	}
	// Auto-wrap off while drawing: on a narrow terminal a long line is cut
	// instead of taking two lines, which would throw off the line count.
	o.WriteString("\x1b[?7l")
	for _, l := range strings.SplitAfter(b.String(), "\n") {
		if l != "" {
			o.WriteString("\x1b[2K" + l)
		}
	}
	o.WriteString("\x1b[J\x1b[?7h")
	_, _ = io.WriteString(d.out, o.String())
	d.drawn = strings.Count(b.String(), "\n")
}

var liveColumns = []column{
	{title: "provider", left: true}, {title: "", left: true}, {title: "done"}, {title: "rate"},
	{title: "limit in force", left: true}, {title: "deferred"}, {title: "susp"}, {title: "429s"},
}

// limitCell is the limit in force, marked when it was learned from the
// provider (below the configured one).
func limitCell(r row) string {
	s := formatLimitsShort(r.InForce)
	if !slices.Equal(r.Limit, r.InForce) {
		s += " learned"
	}
	return s
}

// seconds formats d as "12.3s", or "1234s" from 100 s on.
func seconds(d time.Duration) string {
	if d >= 100*time.Second {
		return fmt.Sprintf("%.0fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func itoa[T int | int64](n T) string { return strconv.FormatInt(int64(n), 10) }

func bar(done, total, width int) string {
	if total <= 0 {
		return strings.Repeat("░", width)
	}
	n := min(done*width/total, width)
	return strings.Repeat("█", n) + strings.Repeat("░", width-n)
}

// isTerminal reports whether f is a character device (a terminal), where
// the display can redraw in place.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// lineHandler is a slog.Handler that turns each record at Info or above into
// one short line for sink: the display's event list, or a worker process's
// stderr, which the parent reads back as events. A warning or error is
// dropped when one like it (the same message but for task IDs) was shown in
// the last logRepeatAfter: when Redis goes away, every server repeats its
// errors for every task.
type lineHandler struct {
	sink  func(string)
	attrs []slog.Attr
	gate  *logGate
}

func newLineHandler(sink func(string)) *lineHandler {
	return &lineHandler{sink: sink, gate: newLogGate(logRepeatAfter)}
}

// logRepeatAfter is how long a warning or error like one already shown is
// held back.
const logRepeatAfter = 10 * time.Second

// logGate lets a line through when no line of the same kind was let through
// in the last window. It is safe for concurrent use.
type logGate struct {
	window time.Duration
	mu     sync.Mutex
	seen   map[string]time.Time
}

func newLogGate(window time.Duration) *logGate {
	return &logGate{window: window, seen: map[string]time.Time{}}
}

// taskRefs are the parts of a log message that name one task.
var taskRefs = regexp.MustCompile(`\b(id|type)=("[^"]*"|\S+)`)

func (g *logGate) allow(msg string, now time.Time) bool {
	kind := taskRefs.ReplaceAllString(msg, "")
	g.mu.Lock()
	defer g.mu.Unlock()
	if at, ok := g.seen[kind]; ok && now.Sub(at) < g.window {
		return false
	}
	if len(g.seen) > 1000 { // bounded: kinds are few
		clear(g.seen)
	}
	g.seen[kind] = now
	return true
}

var _ slog.Handler = (*lineHandler)(nil)

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && !h.gate.allow(r.Message, time.Now()) {
		return nil
	}
	var b strings.Builder
	if r.Level >= slog.LevelWarn {
		b.WriteString(r.Level.String())
		b.WriteString(" ")
	}
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.sink(b.String())
	return nil
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &lineHandler{sink: h.sink, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...), gate: h.gate}
}

// WithGroup is not needed by the loggers of this program: groups are dropped.
func (h *lineHandler) WithGroup(string) slog.Handler { return h }
