package main

import (
	"io"
	"strings"
	"unicode/utf8"
)

// column is one column of a text table.
type column struct {
	title string
	left  bool // left-aligned (text); numbers are right-aligned
}

// writeAligned writes cells under cols, two spaces apart, each column as wide
// as its widest cell (counted in runes: progress bars are multi-byte).
func writeAligned(w io.Writer, cols []column, cells [][]string) {
	widths := make([]int, len(cols))
	for i, c := range cols {
		widths[i] = utf8.RuneCountInString(c.title)
	}
	for _, r := range cells {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	line := func(r []string) {
		var b strings.Builder
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if cols[i].left {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		_, _ = io.WriteString(w, strings.TrimRight(b.String(), " ")+"\n")
	}
	titles := make([]string, len(cols))
	for i, c := range cols {
		titles[i] = c.title
	}
	line(titles)
	for _, r := range cells {
		line(r)
	}
}
