package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Summary is the outcome of a run, audited at the end: printed as a table,
// or as JSON with -json.
type Summary struct {
	Run     string `json:"run"`
	Redis   string `json:"redis"`
	Workers string `json:"workers"`
	// Seconds is from the first enqueue to the last job done (or the timeout).
	Seconds  float64 `json:"seconds"`
	TimedOut bool    `json:"timed_out"`
	// Interrupted: the run was stopped (Ctrl-C) before every job was done.
	Interrupted bool              `json:"interrupted"`
	Providers   []ProviderSummary `json:"providers"`

	Jobs       int `json:"jobs"`
	Done       int `json:"done"`
	Duplicates int `json:"duplicates"`
	Archived   int `json:"archived"`
	Lost       int `json:"lost"`
	TooMany    int `json:"429s"`
	// ByWorker counts the jobs each asynq server (or worker process) did.
	ByWorker map[string]int `json:"by_worker"`
	// OK: every job done exactly once, none archived, none lost.
	OK bool `json:"ok"`
}

// ProviderSummary is one provider's line of the Summary.
type ProviderSummary struct {
	Name  string `json:"name"`
	Quota string `json:"quota"`
	// Limit is the throttle's limit in Redis at the end of the run.
	Limit string `json:"limit"`
	// Adopted is the limit read from X-RateLimit-Limit, for a provider that
	// publishes it.
	Adopted string `json:"adopted,omitempty"`

	Jobs int `json:"jobs"`
	// Done counts jobs whose handler succeeded (once or more).
	Done int `json:"done"`
	// Duplicates counts jobs done more than once, by the handlers' ledger
	// or by the provider's own count of 200s.
	Duplicates int `json:"duplicates"`
	// Archived counts the provider's tasks in asynq's archive.
	Archived int `json:"archived"`
	// Lost counts jobs not done, or whose task is not completed in asynq.
	Lost int `json:"lost"`

	// Served and TooMany are the 200s and 429s the provider answered.
	Served  int `json:"served"`
	TooMany int `json:"429s"`
	// Deferred and Suspended count middleware decisions (WithObserver).
	Deferred  int64 `json:"deferred"`
	Suspended int64 `json:"suspended"`
	// Seconds is from the first enqueue to the provider's last 200; Rate is
	// Served over Seconds, counting at least one second so that a burst
	// served in a few milliseconds does not read as a huge rate.
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate_per_second"`
}

// writeTable prints s as a table and a one-line verdict.
func writeTable(w io.Writer, s Summary) {
	cells := make([][]string, 0, len(s.Providers)+1)
	for _, p := range s.Providers {
		cells = append(cells, []string{p.Name, strconv.Itoa(p.Jobs), strconv.Itoa(p.Done), strconv.Itoa(p.Duplicates),
			strconv.Itoa(p.Archived), strconv.Itoa(p.Lost), strconv.Itoa(p.TooMany),
			strconv.FormatInt(p.Deferred, 10), strconv.FormatInt(p.Suspended, 10),
			fmt.Sprintf("%.1fs", p.Seconds), fmt.Sprintf("%.1f/s", p.Rate)})
	}
	cells = append(cells, []string{"total", strconv.Itoa(s.Jobs), strconv.Itoa(s.Done), strconv.Itoa(s.Duplicates),
		strconv.Itoa(s.Archived), strconv.Itoa(s.Lost), strconv.Itoa(s.TooMany), "", "",
		fmt.Sprintf("%.1fs", s.Seconds), ""})
	writeAligned(w, summaryColumns, cells)

	fmt.Fprintln(w)
	limits := make([][]string, len(s.Providers))
	for i, p := range s.Providers {
		limit := p.Limit
		if p.Adopted != "" {
			limit += " (adopted from X-RateLimit-Limit)"
		}
		limits[i] = []string{p.Name, p.Quota, limit}
	}
	writeAligned(w, []column{{"provider", true}, {"quota (provider side)", true}, {"our limit at the end", true}}, limits)
	if len(s.ByWorker) > 0 {
		names := slices.Sorted(maps.Keys(s.ByWorker))
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = fmt.Sprintf("%s %d", n, s.ByWorker[n])
		}
		fmt.Fprintf(w, "\njobs done per worker: %s\n", strings.Join(parts, " · "))
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, verdict(s))
}

var summaryColumns = []column{
	{title: "provider", left: true}, {title: "jobs"}, {title: "done"}, {title: "twice"}, {title: "archived"},
	{title: "lost"}, {title: "429s"}, {title: "deferred"}, {title: "suspended"}, {title: "time"}, {title: "rate"},
}

func verdict(s Summary) string {
	var b strings.Builder
	if s.OK {
		fmt.Fprintf(&b, "OK: %d/%d jobs done exactly once, 0 archived, 0 lost", s.Done, s.Jobs)
	} else {
		fmt.Fprintf(&b, "FAILED: %d/%d jobs done, %d done twice, %d archived, %d lost", s.Done, s.Jobs, s.Duplicates, s.Archived, s.Lost)
		switch {
		case s.TimedOut:
			b.WriteString(" (timed out: jobs not done count as lost)")
		case s.Interrupted:
			b.WriteString(" (interrupted: jobs not done count as lost)")
		}
	}
	fmt.Fprintf(&b, "; providers answered %d × 429.", s.TooMany)
	return b.String()
}
