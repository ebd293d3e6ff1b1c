package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// row is one provider's line of the progress display.
type row struct {
	Name      string
	Done      int
	Total     int
	Rate      float64          // 200s per second over the last rateWindow
	Finished  time.Duration    // since start, when Done reached Total
	Limit     []throttle.Limit // in Redis now
	Deferred  int64
	Suspended int64
	TooMany   int64
}

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

// event reports something that happened: a limit adopted, a provider's 429,
// a worker process's log line.
func (d *display) event(line string) {
	line = d.since() + "  " + line
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live {
		fmt.Fprintln(d.out, line)
		return
	}
	d.events = append(d.events, line)
	if len(d.events) > maxEvents {
		d.events = d.events[len(d.events)-maxEvents:]
	}
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
			rate = fmt.Sprintf("done %.1fs", r.Finished.Seconds())
		}
		cells[i] = []string{r.Name, bar(r.Done, r.Total, 10), fmt.Sprintf("%d/%d", r.Done, r.Total), rate,
			formatLimitsShort(r.Limit), itoa(r.Deferred), itoa(r.Suspended), itoa(r.TooMany)}
	}
	writeAligned(&b, liveColumns, cells)
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
	{title: "provider", left: true}, {title: "progress", left: true}, {title: "done"}, {title: "rate"},
	{title: "our limit", left: true}, {title: "deferred"}, {title: "susp."}, {title: "429s"},
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

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
// stderr, which the parent reads back as events.
type lineHandler struct {
	sink  func(string)
	attrs []slog.Attr
}

func newLineHandler(sink func(string)) *lineHandler { return &lineHandler{sink: sink} }

var _ slog.Handler = (*lineHandler)(nil)

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
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
	return &lineHandler{sink: h.sink, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// WithGroup is not needed by the loggers of this program: groups are dropped.
func (h *lineHandler) WithGroup(string) slog.Handler { return h }
