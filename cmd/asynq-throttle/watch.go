package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func (a *app) watchCmd() *cobra.Command {
	var (
		interval time.Duration
		count    int
	)
	cmd := &cobra.Command{
		Use:   "watch [KEY...]",
		Short: "Show keys live: a table redrawn every second (plain lines when not a terminal)",
		Long: `Show the keys (all of them, or those named) every --interval until interrupted.
On a terminal the table is redrawn in place; otherwise each refresh prints
one logfmt line per key (time=... key=... limits=... tokens=...), and with
-o json one JSON object per refresh.`,
		RunE: func(cmd *cobra.Command, keys []string) error {
			for _, k := range keys {
				if err := throttle.ValidateKey(k); err != nil {
					return usageError{err}
				}
			}
			if interval <= 0 {
				return usagef("--interval %v: must be > 0", interval)
			}
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			return a.watch(cmd.Context(), lim, keys, interval, count)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until interrupted)")
	return cmd
}

func (a *app) watch(ctx context.Context, lim *throttle.Limiter, keys []string, interval time.Duration, count int) error {
	term := isTerminal(a.stdout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 1; ; n++ {
		now := time.Now()
		shown := keys
		if len(shown) == 0 {
			var err error
			if shown, err = lim.Keys(ctx); err != nil {
				return interrupted(ctx, err)
			}
		}
		views, err := readKeys(ctx, lim, shown)
		if err != nil {
			return interrupted(ctx, err)
		}
		switch {
		case a.json():
			err = json.NewEncoder(a.stdout).Encode(map[string]any{"time": now.Format(time.RFC3339Nano), "keys": views})
		case term:
			err = a.redraw(now, views, interval)
		default:
			err = writeLogfmt(a.stdout, now, views)
		}
		if err != nil {
			return err
		}
		if count > 0 && n >= count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // interrupted: the normal end of watch
		case <-tick.C:
		}
	}
}

// interrupted is err, or nil when watch was interrupted (ctx ended) during
// the call that failed: the normal end of watch, wherever it lands.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// redraw clears the terminal and draws the table.
func (a *app) redraw(now time.Time, views []keyView, interval time.Duration) error {
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J")
	fmt.Fprintf(&b, "asynq-throttle watch · prefix %s · %s · every %v (Ctrl-C to stop)\n\n", a.prefix, now.Format("15:04:05"), interval)
	if len(views) == 0 {
		fmt.Fprintf(&b, "no keys under prefix %q\n", a.prefix)
	} else if err := writeTable(&b, views); err != nil {
		return err
	}
	_, err := io.WriteString(a.stdout, b.String())
	return err
}

// writeLogfmt writes one line per key: time=... key=... limits="..." ...
func writeLogfmt(w io.Writer, now time.Time, views []keyView) error {
	var b strings.Builder
	for _, v := range views {
		b.WriteString("time=" + now.Format(time.RFC3339))
		for _, c := range keyColumns {
			name := strings.ReplaceAll(strings.ToLower(c.name), " ", "_")
			val := c.value(v)
			if strings.ContainsAny(val, " \"=") {
				val = fmt.Sprintf("%q", val)
			}
			b.WriteString(" " + name + "=" + val)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// isTerminal reports whether f, a reader or writer, is a character device
// (a terminal) as its Stat method says: *os.File's, or a test's. The null
// device is one too, and is what cron and CI give as stdin: it is not.
func isTerminal(f any) bool {
	s, ok := f.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := s.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
