package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// check reports a split that p cannot have: customers whose names are not
// valid tenants, one without the other or both the same, or beside a
// Stream (whose jobs would be the light customer's).
func (t TenantSplit) check(p ProviderSpec) error {
	if t == (TenantSplit{}) {
		return nil
	}
	for _, name := range []string{t.Heavy, t.Light} {
		if err := throttle.ValidateKey(name); err != nil {
			return fmt.Errorf("provider %s: tenant %q: %w", p.Name, name, err)
		}
	}
	switch {
	case t.Heavy == t.Light:
		return fmt.Errorf("provider %s: its two tenants are both %q", p.Name, t.Heavy)
	case t.LightJobs < 1:
		return fmt.Errorf("provider %s: tenant %s has no jobs", p.Name, t.Light)
	case p.Stream.Rate > 0:
		return fmt.Errorf("provider %s: a Stream and Tenants cannot be combined", p.Name)
	}
	return nil
}

// tenantRow is one customer's part of a provider's progress (see
// TenantSplit).
type tenantRow struct {
	Name  string
	Done  int // jobs the provider has served
	Total int // jobs enqueued or still to come
	// Share is the part of the provider's rate the limiter gives it now
	// (Inspect): 0 when it has nothing waiting.
	Share float64
}

// tenantRows reads the progress of p's customers: their jobs (prod), what
// p served of them, and their shares (st, from Inspect). None when p's jobs
// are nobody's in particular.
func tenantRows(prod *producer, p *Provider, st throttle.Status) []tenantRow {
	split := p.Spec.Tenants
	if split.Heavy == "" {
		return nil
	}
	var rows []tenantRow
	for _, name := range []string{split.Heavy, split.Light} {
		ids := prod.tenantJobs(p.Spec.Name, name)
		if len(ids) == 0 {
			continue
		}
		r := tenantRow{Name: name, Total: len(ids)}
		for _, at := range p.servedTimes(ids) {
			if !at.IsZero() {
				r.Done++
			}
		}
		for _, t := range st.Tenants {
			if t.Name == name {
				r.Share = t.Share
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// tenantsLine is a provider's customers on one line: "acme 15/36 (share
// 50%) · bolt 3/4 (share 50%)".
func tenantsLine(rows []tenantRow) string {
	parts := make([]string, len(rows))
	for i, t := range rows {
		parts[i] = fmt.Sprintf("%s %d/%d", t.Name, t.Done, t.Total)
		switch {
		case t.Done >= t.Total:
			parts[i] += " done"
		case t.Share > 0:
			parts[i] += fmt.Sprintf(" (share %.0f%%)", 100*t.Share)
		}
	}
	return strings.Join(parts, " · ")
}

// fairness is how a provider's light customer was served beside its heavy
// one's backlog (see TenantSplit).
type fairness struct {
	Heavy, Light string
	// Jobs are the light customer's jobs, Done those the provider served.
	Jobs, Done int
	// Arrived is when the light customer's first job was enqueued; Last
	// when the provider served the last of its jobs (zero: not all yet).
	Arrived, Last time.Time
	// Behind counts the heavy customer's jobs that the provider had not
	// served yet when the light customer's arrived.
	Behind int
	// Rate is the provider's rate in force, per second.
	Rate float64
}

// fairnessOf reads how p's light customer was served, ok false when p has
// none or its jobs have not arrived. inForce are p's limits in force.
func fairnessOf(prod *producer, p *Provider, inForce []throttle.Limit) (f fairness, ok bool) {
	split := p.Spec.Tenants
	light := prod.tenantJobs(p.Spec.Name, split.Light)
	if split.Light == "" || len(light) == 0 {
		return f, false
	}
	f = fairness{Heavy: split.Heavy, Light: split.Light, Jobs: len(light), Rate: slowestRate(inForce)}
	for _, id := range light {
		at, sent := prod.sentAt(id)
		if !sent {
			return f, false
		}
		if f.Arrived.IsZero() || at.Before(f.Arrived) {
			f.Arrived = at
		}
	}
	done := p.servedTimes(light)
	for _, at := range done {
		if at.IsZero() {
			continue
		}
		f.Done++
		if at.After(f.Last) {
			f.Last = at
		}
	}
	if f.Done < f.Jobs {
		f.Last = time.Time{}
	}
	for _, at := range p.servedTimes(prod.tenantJobs(p.Spec.Name, split.Heavy)) {
		if at.IsZero() || at.After(f.Arrived) {
			f.Behind++
		}
	}
	return f, true
}

// Waited is from the light customer's arrival to its last job served (0:
// not all served yet).
func (f fairness) Waited() time.Duration {
	if f.Last.IsZero() {
		return 0
	}
	return f.Last.Sub(f.Arrived)
}

// FIFO estimates how long the light customer's jobs would have waited had
// they queued first in, first out behind the heavy customer's backlog: the
// backlog left when they arrived, then their own jobs, at the provider's
// rate (0: no rate to estimate with).
func (f fairness) FIFO() time.Duration {
	if f.Rate <= 0 {
		return 0
	}
	return time.Duration(float64(f.Behind+f.Jobs) / f.Rate * float64(time.Second))
}

// arrival is the progress line that tells the light customer's jobs have
// arrived: "crm: bolt's 4 jobs arrive behind 31 of acme's; bolt's share:
// 50%", the share of the provider's rate it gets now (tenants, from
// Inspect), within an event line's width.
func (f fairness) arrival(provider string, tenants []tenantRow) string {
	s := fmt.Sprintf("%s: %s's %d jobs arrive behind %d of %s's", provider, f.Light, f.Jobs, f.Behind, f.Heavy)
	for _, t := range tenants {
		if t.Name == f.Light && t.Share > 0 {
			s += fmt.Sprintf("; %s's share: %.0f%%", t.Name, 100*t.Share)
		}
	}
	return s
}

// sooner reports whether the light customer's jobs were all done sooner
// than first in, first out would have done them (by the estimate).
func (f fairness) sooner() bool { return f.Waited() < f.FIFO() }

// event is the progress line that tells the light customer was served:
// "crm: bolt's 4 jobs done in 1.3s, beside 26 of acme's (FIFO: ~3.0s)",
// within an event line's width; "behind" when they were done no sooner
// than first in, first out.
func (f fairness) event(provider string) string {
	where := "beside"
	if !f.sooner() {
		where = "behind"
	}
	return fmt.Sprintf("%s: %s's %d jobs done in %.1fs, %s %d of %s's (FIFO: ~%.1fs)",
		provider, f.Light, f.Jobs, f.Waited().Seconds(), where, f.Behind, f.Heavy, f.FIFO().Seconds())
}

// slowestRate is the lowest rate of limits, per second (0: none is a rate).
func slowestRate(limits []throttle.Limit) float64 {
	rate := math.Inf(1)
	for _, l := range limits {
		if (l.Kind == throttle.KindBucket || l.Kind == throttle.KindWindow || l.Kind == throttle.KindFixedWindow) && l.Per > 0 && l.N > 0 {
			rate = min(rate, ratePerSecond(l))
		}
	}
	if math.IsInf(rate, 1) {
		return 0
	}
	return rate
}

// TenantSummary is one customer's line of a provider's summary.
type TenantSummary struct {
	Name string `json:"name"`
	Jobs int    `json:"jobs"`
	// Done counts its jobs whose handler succeeded (once or more).
	Done int `json:"done"`
	// Arrived is when its first job was enqueued, Last when the provider
	// served the last of its jobs (0 when not all were), in seconds from
	// the start; Waited is from Arrived to Last.
	Arrived float64 `json:"arrived_s"`
	Last    float64 `json:"last_s"`
	Waited  float64 `json:"waited_s"`
	// Behind, for the light customer, counts the heavy customer's jobs not
	// yet served when its jobs arrived; FIFO estimates how long they would
	// have waited first in, first out behind them: Behind and its own jobs
	// at the provider's rate in force (Rate).
	Behind int     `json:"behind,omitempty"`
	FIFO   float64 `json:"fifo_estimate_s,omitempty"`
	Rate   float64 `json:"rate_in_force_per_second,omitempty"`
}

// tenantSummaries audits p's customers: their jobs (prod), those done by
// the handlers' ledger (done), and when p served them; inForce are p's
// limits in force, start the run's start. None when p's jobs are nobody's
// in particular.
func tenantSummaries(prod *producer, p *Provider, done map[string]int, inForce []throttle.Limit, start time.Time) []TenantSummary {
	split := p.Spec.Tenants
	if split.Heavy == "" {
		return nil
	}
	secs := func(t time.Time) float64 { return round(t.Sub(start).Seconds(), 3) }
	var out []TenantSummary
	for _, name := range []string{split.Heavy, split.Light} {
		ids := prod.tenantJobs(p.Spec.Name, name)
		if len(ids) == 0 {
			continue
		}
		ts := TenantSummary{Name: name, Jobs: len(ids)}
		var arrived, last time.Time
		served := 0
		for i, at := range p.servedTimes(ids) {
			if done[ids[i]] > 0 {
				ts.Done++
			}
			if sent, ok := prod.sentAt(ids[i]); ok && (arrived.IsZero() || sent.Before(arrived)) {
				arrived = sent
			}
			if !at.IsZero() {
				served++
				if at.After(last) {
					last = at
				}
			}
		}
		if !arrived.IsZero() {
			// (The backlog is enqueued just before the run's clock starts.)
			arrived = later(arrived, start)
			ts.Arrived = secs(arrived)
		}
		if served == len(ids) && !arrived.IsZero() {
			ts.Last, ts.Waited = secs(last), round(last.Sub(arrived).Seconds(), 3)
		}
		if f, ok := fairnessOf(prod, p, inForce); ok && name == split.Light {
			ts.Behind, ts.FIFO, ts.Rate = f.Behind, round(f.FIFO().Seconds(), 3), f.Rate
		}
		out = append(out, ts)
	}
	return out
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

var tenantColumns = []column{
	{title: "tenant", left: true}, {title: "jobs"}, {title: "done"}, {title: "arrived"}, {title: "last done"},
	{title: "waited"}, {title: "FIFO wait (estimate)"},
}

// writeTenants prints p's customers as a table, and how the light one was
// served beside the heavy one's backlog.
func writeTenants(w io.Writer, p ProviderSummary) {
	cells := make([][]string, len(p.Tenants))
	for i, t := range p.Tenants {
		last, waited, fifo := "-", "-", ""
		if t.Last > 0 {
			last, waited = fmt.Sprintf("%.1fs", t.Last), fmt.Sprintf("%.1fs", t.Waited)
		}
		if t.Rate > 0 {
			fifo = fmt.Sprintf("~%.1fs", t.FIFO)
		}
		cells[i] = []string{p.Name + " " + t.Name, itoa(t.Jobs), itoa(t.Done), fmt.Sprintf("%.1fs", t.Arrived),
			last, waited, fifo}
	}
	writeAligned(w, tenantColumns, cells)
	if len(p.Tenants) < 2 {
		return
	}
	heavy, light := p.Tenants[0], p.Tenants[1]
	if light.Last == 0 || light.Rate == 0 {
		return
	}
	estimate := fmt.Sprintf("(an estimate: %d jobs at %s/s)", light.Behind+light.Jobs, strconv.FormatFloat(light.Rate, 'f', -1, 64))
	text := fmt.Sprintf("%s: %s's %d jobs arrived at %.1fs behind %d of %s's and were all done %.1fs later, ",
		p.Name, light.Name, light.Jobs, light.Arrived, light.Behind, heavy.Name, light.Waited)
	if light.Waited < light.FIFO {
		text += fmt.Sprintf("served beside that backlog at their share of the rate (throttle.Tenant). "+
			"First in, first out they would have waited about %.1fs %s.", light.FIFO, estimate)
	} else {
		text += fmt.Sprintf("no sooner than first in, first out: about %.1fs %s. "+
			"They were not given their share of the rate.", light.FIFO, estimate)
	}
	for _, l := range wrap(text, maxWidth) {
		fmt.Fprintln(w, l)
	}
}
