package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// table prints a metric-per-row, variant-per-column table.
type table struct {
	head []string
	rows [][]string
}

// newTable starts a table whose first column is named first and whose
// other columns are cols (more can be added with col).
func newTable(first string, cols ...string) *table {
	return &table{head: append([]string{first}, cols...)}
}

func (t *table) col(name string) { t.head = append(t.head, name) }

func (t *table) row(name string, cells []string) {
	t.rows = append(t.rows, append([]string{name}, cells...))
}

func (t *table) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	line := func(cells []string) {
		// The first column is left-aligned by padding it ourselves.
		width := 0
		for _, r := range append([][]string{t.head}, t.rows...) {
			width = max(width, len(r[0]))
		}
		fmt.Fprint(tw, cells[0]+strings.Repeat(" ", width-len(cells[0]))+"\t")
		for _, c := range cells[1:] {
			fmt.Fprint(tw, c+"\t")
		}
		fmt.Fprintln(tw)
	}
	line(t.head)
	for _, r := range t.rows {
		line(r)
	}
	_ = tw.Flush()
}

func each[T any](rs []T, f func(T) string) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func find[T any](rs []T, f func(T) bool) *T {
	for i := range rs {
		if f(rs[i]) {
			return &rs[i]
		}
	}
	return nil
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// ratio formats a/b, or "-" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "1.00x"
		}
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func onceness(done, n, dup int) string {
	switch {
	case dup > 0:
		return fmt.Sprintf("%d, %d DUPLICATED", done, dup)
	case done < n:
		return fmt.Sprintf("%d, %d not done by the cap", done, n-done)
	}
	return fmt.Sprintf("%d, each once", done)
}

// progress reports a finished step on stderr, so stdout keeps the tables.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
