package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
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

	// Timeout is the -timeout of the run.
	Timeout float64 `json:"timeout_seconds"`

	Jobs       int `json:"jobs"`
	Done       int `json:"done"`
	NotDone    int `json:"not_done"`
	Duplicates int `json:"duplicates"`
	Archived   int `json:"archived"`
	Lost       int `json:"lost"`
	TooMany    int `json:"429s"`
	// Shed and OverQuota split TooMany: 429s the providers chose to send
	// while shedding load, and 429s for calls above a quota.
	Shed      int `json:"429s_shed"`
	OverQuota int `json:"429s_over_quota"`
	// LateShed counts the shed 429s for calls that came more than shedGrace
	// after a provider's first one: after the fleet-wide suspension should
	// have stopped them.
	LateShed int `json:"429s_late"`
	// ByWorker counts the jobs each asynq server (or worker process) did.
	ByWorker map[string]int `json:"by_worker"`
	// OK: every job done exactly once, none archived, none lost.
	OK bool `json:"ok"`
}

// ProviderSummary is one provider's line of the Summary.
type ProviderSummary struct {
	Name  string `json:"name"`
	Quota string `json:"quota"`
	// Limit is the throttle's limit in Redis at the end of the run, as
	// configured (SetLimits).
	Limit string `json:"limit"`
	// InForce is the limit in force at the end of the run (Inspect): Limit,
	// or below it what the fleet learned from the provider's responses.
	InForce string `json:"in_force"`
	// Learned: InForce is below Limit, learned from the provider.
	Learned bool `json:"learned"`

	Jobs int `json:"jobs"`
	// Done counts jobs whose handler succeeded (once or more).
	Done int `json:"done"`
	// Duplicates counts jobs done more than once, by the handlers' ledger
	// or by the provider's own count of 200s.
	Duplicates int `json:"duplicates"`
	// NotDone counts jobs not done yet whose task asynq still has (pending,
	// scheduled, retry or active): the run stopped before they ran.
	NotDone int `json:"not_done"`
	// Archived counts the provider's tasks in asynq's archive.
	Archived int `json:"archived"`
	// Lost counts jobs not done whose task asynq no longer has, or has as
	// completed though its handler never succeeded.
	Lost int `json:"lost"`

	// Served and TooMany are the 200s and 429s the provider answered.
	Served  int `json:"served"`
	TooMany int `json:"429s"`
	// Shed, OverQuota and LateShed split TooMany as in Summary.
	Shed      int `json:"429s_shed"`
	OverQuota int `json:"429s_over_quota"`
	LateShed  int `json:"429s_late"`
	// Deferred and Suspended count middleware decisions (Limiter.OnEvent).
	Deferred  int64 `json:"deferred"`
	Suspended int64 `json:"suspended"`
	// Seconds is from the first enqueue to the provider's last 200; Rate is
	// Served over Seconds, counting at least one second so that a burst
	// served in a few milliseconds does not read as a huge rate.
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate_per_second"`
	// Tenants are the provider's customers, when its jobs are split
	// between them (TenantSplit): the heavy one, then the light one.
	Tenants []TenantSummary `json:"tenants,omitempty"`
}

// writeTable prints s as tables of at most 80 columns and a verdict.
func writeTable(w io.Writer, s Summary) {
	audit := make([][]string, 0, len(s.Providers)+1)
	traffic := make([][]string, 0, len(s.Providers))
	limits := make([][]string, len(s.Providers))
	for i, p := range s.Providers {
		audit = append(audit, []string{p.Name, itoa(p.Jobs), itoa(p.Done), itoa(p.NotDone), itoa(p.Duplicates),
			itoa(p.Archived), itoa(p.Lost)})
		traffic = append(traffic, []string{p.Name, itoa(p.TooMany), itoa(p.Shed), itoa(p.OverQuota),
			itoa(p.Suspended), itoa(p.Deferred),
			fmt.Sprintf("%.1fs", p.Seconds), fmt.Sprintf("%.1f/s", p.Rate)})
		limit := p.InForce
		if p.Learned {
			limit += ", learned (configured " + p.Limit + ")"
		}
		limits[i] = []string{p.Name, p.Quota, limit}
	}
	audit = append(audit, []string{"total", itoa(s.Jobs), itoa(s.Done), itoa(s.NotDone), itoa(s.Duplicates),
		itoa(s.Archived), itoa(s.Lost)})
	writeAligned(w, auditColumns, audit)
	fmt.Fprintln(w)
	writeAligned(w, trafficColumns, traffic)
	fmt.Fprintln(w)
	writeAligned(w, []column{{"provider", true}, {"quota", true}, {"our limit at the end", true}}, limits)
	for _, p := range s.Providers {
		if len(p.Tenants) > 0 {
			fmt.Fprintln(w)
			writeTenants(w, p)
		}
	}
	if len(s.ByWorker) > 0 {
		names := slices.Sorted(maps.Keys(s.ByWorker))
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = fmt.Sprintf("%s %d", n, s.ByWorker[n])
		}
		fmt.Fprintf(w, "\njobs done per worker: %s\n", strings.Join(parts, " · "))
	}

	fmt.Fprintln(w)
	for _, sentence := range strings.Split(verdict(s), "\n") {
		for _, l := range wrap(sentence, maxWidth) {
			fmt.Fprintln(w, l)
		}
	}
}

var auditColumns = []column{
	{title: "provider", left: true}, {title: "jobs"}, {title: "done"}, {title: "not done"}, {title: "twice"},
	{title: "archived"}, {title: "lost"},
}

var trafficColumns = []column{
	{title: "provider", left: true}, {title: "429s"}, {title: "shed"}, {title: "over quota"},
	{title: "suspended"}, {title: "deferred"}, {title: "time"}, {title: "rate"},
}

// verdict is the run's outcome: the audit, then the providers' 429s.
func verdict(s Summary) string {
	var b strings.Builder
	switch {
	case s.OK:
		fmt.Fprintf(&b, "OK: %d/%d jobs done exactly once, %d archived, %d lost", s.Done, s.Jobs, s.Archived, s.Lost)
	case s.Duplicates > 0 || s.Archived > 0 || s.Lost > 0:
		fmt.Fprintf(&b, "FAILED: %d/%d jobs done, %d done twice, %d archived, %d lost, %d not done",
			s.Done, s.Jobs, s.Duplicates, s.Archived, s.Lost, s.NotDone)
	default:
		fmt.Fprintf(&b, "NOT DONE: %d/%d jobs done, %d not done (asynq still has them), %d lost",
			s.Done, s.Jobs, s.NotDone, s.Lost)
	}
	switch {
	case s.TimedOut:
		fmt.Fprintf(&b, "; timed out after %gs", s.Timeout)
	case s.Interrupted:
		b.WriteString("; interrupted")
	}
	b.WriteString(".\n")
	switch {
	case s.TooMany == 0:
		b.WriteString("Providers answered 0 × 429.")
	default:
		fmt.Fprintf(&b, "Providers answered %d × 429: %d in the first %s of a load-shedding spell",
			s.TooMany, s.Shed-s.LateShed, shedGrace)
		if s.LateShed > 0 {
			fmt.Fprintf(&b, ", %d later in it", s.LateShed)
		}
		fmt.Fprintf(&b, ", %d over quota.", s.OverQuota)
	}
	return b.String()
}
