// Package logtest keeps what code under test logs, for the test to read:
// a Recorder is the slog.Handler to give it, Find and AtLeast pick the
// records out, Attr reads one of their attributes.
package logtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Recorder is a slog.Handler that keeps every record, at every level. The
// zero value is ready to use, and it is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

var _ slog.Handler = (*Recorder)(nil)

// Logger is a logger that writes to r.
func (r *Recorder) Logger() *slog.Logger { return slog.New(r) }

// Enabled reports true: every level is kept.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps rec.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// WithAttrs returns r: the attributes are not kept.
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup returns r: groups are not kept.
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Find returns the records whose message contains substr ("": every
// record), in the order they were logged.
func (r *Recorder) Find(substr string) []slog.Record {
	return r.filter(func(rec slog.Record) bool { return strings.Contains(rec.Message, substr) })
}

// AtLeast returns the records at level or above.
func (r *Recorder) AtLeast(level slog.Level) []slog.Record {
	return r.filter(func(rec slog.Record) bool { return rec.Level >= level })
}

func (r *Recorder) filter(keep func(slog.Record) bool) []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.recs {
		if keep(rec) {
			out = append(out, rec)
		}
	}
	return out
}

// Attr returns the value of rec's attribute key; the zero Value when rec
// has none.
func Attr(rec slog.Record, key string) slog.Value {
	var v slog.Value
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}
