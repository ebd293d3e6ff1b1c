package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// pollInterval is how often the monitor reads progress (and so how soon it
// sees the last job done).
const pollInterval = 200 * time.Millisecond

// pollTimeout bounds one progress read: a Redis that hangs must not stall
// the display.
const pollTimeout = time.Second

// redisLostAfter is how long progress may fail to be read before the run
// gives up on its Redis.
const redisLostAfter = 3 * time.Second

// monitor reads a run's progress from the ledger and the providers, and
// tells the suspensions it sees: when a provider's key is suspended, and
// when every server of the fleet has deferred its tasks because of it.
type monitor struct {
	ledger    ledger
	limiter   *throttle.Limiter
	providers []*Provider
	prod      *producer
	jobs      int
	fleet     int // asynq servers in the fleet
	start     time.Time

	susp map[string]*suspension // provider -> its current suspension
	// ended is, per provider, when its last suspension was seen to end.
	ended map[string]time.Time
	// waiting is, per provider, row.Waiting of the last read: the counts
	// before a suspension seen in this read began.
	waiting map[string]map[string]int64
	// inForce is, per provider, the limits in force last told.
	inForce map[string]string
	// toldArrival and toldFair are, per provider, that the line of its
	// light customer's arrival, and of its last job served, are out.
	toldArrival, toldFair map[string]bool
}

// suspension is what the monitor knows of one provider's suspension.
type suspension struct {
	seen    time.Time        // when the monitor first saw it
	base    map[string]int64 // per worker, tasks deferred by suspension before it
	waiting int              // workers that deferred a task because of it
	told    bool             // the "every server" line is out
}

func newMonitor(l ledger, lim *throttle.Limiter, providers []*Provider, prod *producer, jobs, fleet int, start time.Time) *monitor {
	return &monitor{ledger: l, limiter: lim, providers: providers, prod: prod, jobs: jobs, fleet: fleet, start: start,
		susp: map[string]*suspension{}, ended: map[string]time.Time{}, waiting: map[string]map[string]int64{},
		inForce: map[string]string{}, toldArrival: map[string]bool{}, toldFair: map[string]bool{}}
}

// ending is why watch returned.
type ending int

const (
	allJobsDone ending = iota
	timedOut
	interrupted
	redisLost // with the last error
)

// watch updates disp every interval until every job is done, ctx ends,
// timeout passes, or progress could not be read from Redis for
// redisLostAfter, and tells which.
func (m *monitor) watch(ctx context.Context, disp *display, interval, timeout time.Duration) (ending, error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	lastRead := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, pollTimeout)
		rows, err := m.rows(pctx)
		cancel()
		switch {
		case err == nil:
			lastRead = time.Now()
			m.tellLearned(disp, rows)
			m.tellSuspensions(disp, rows)
			m.tellFairness(disp, rows)
			disp.update(rows)
			if allDone(rows) {
				return allJobsDone, nil
			}
		case ctx.Err() != nil:
		case time.Since(lastRead) >= redisLostAfter:
			disp.event(fmt.Sprintf("Redis has not answered for %.0fs: %v; stopping",
				time.Since(lastRead).Seconds(), err))
			return redisLost, err
		}
		select {
		case <-ctx.Done():
			disp.event("interrupted: stopping the workers")
			return interrupted, nil
		case <-deadline.C:
			disp.event(fmt.Sprintf("timed out after %v: stopping the workers", timeout))
			return timedOut, nil
		case <-tick.C:
		}
	}
}

// tellLearned reports, as events, each change of a provider's limits in
// force: a quota learned from its responses (throttle.Observe) below the
// configured one, and the configured one back in force.
func (m *monitor) tellLearned(disp *display, rows []row) {
	for _, r := range rows {
		if len(r.InForce) == 0 {
			continue
		}
		now := formatLimits(r.InForce)
		before, told := m.inForce[r.Name]
		m.inForce[r.Name] = now
		switch {
		case told && now == before, !told && slices.Equal(r.InForce, r.Limit):
		case slices.Equal(r.InForce, r.Limit):
			disp.event(fmt.Sprintf("%s: %s in force again, as configured", r.Name, now))
		default:
			// A learned quota lasts while the provider keeps saying it,
			// and for 10 minutes after it last did.
			lasts := slices.Max(append([]time.Duration{0}, r.LearnedFor...))
			disp.event(fmt.Sprintf("%s: quota learned: %s in force fleet-wide for %s (configured %s)",
				r.Name, now, roughly(lasts), formatLimits(r.Limit)))
		}
	}
}

// roughly formats d in whole minutes ("10m"), or whole seconds under one.
func roughly(d time.Duration) string {
	if d >= time.Minute {
		return fmt.Sprintf("%.0fm", d.Minutes())
	}
	return fmt.Sprintf("%.0fs", d.Seconds())
}

// tellSuspensions reports, as events, each provider suspension as it
// starts, when every server of the fleet has deferred a task because of it,
// and when it ends.
func (m *monitor) tellSuspensions(disp *display, rows []row) {
	now := time.Now()
	for i, r := range rows {
		before := m.waiting[r.Name]
		m.waiting[r.Name] = r.Waiting
		s := m.susp[r.Name]
		if r.SuspendedFor <= 0 {
			if s != nil {
				delete(m.susp, r.Name)
				m.ended[r.Name] = now
				if !s.told {
					disp.event(fmt.Sprintf("%s: suspension over; %d/%d servers deferred its tasks",
						r.Name, s.waiting, m.fleet))
				} else {
					disp.event(fmt.Sprintf("%s: suspension over, calls resume at their reserved times", r.Name))
				}
			}
			continue
		}
		if s == nil {
			s = &suspension{seen: now, base: before}
			m.susp[r.Name] = s
			disp.event(fmt.Sprintf("%s: suspended fleet-wide for %.1fs", r.Name, r.SuspendedFor.Seconds()))
		}
		s.waiting = 0
		for w, n := range r.Waiting {
			if n > s.base[w] {
				s.waiting++
			}
		}
		if !s.told && s.waiting >= m.fleet {
			s.told = true
			within := ""
			if at := m.providers[i].First429After(m.ended[r.Name]); !at.IsZero() {
				within = fmt.Sprintf(" (within %.1fs of the first 429)", now.Sub(at).Seconds())
			}
			disp.event(fmt.Sprintf("%s: %d/%d servers deferring its tasks%s", r.Name, s.waiting, m.fleet, within))
		}
	}
}

// tellFairness reports, as events, when a provider's light customer's jobs
// have arrived, with the share of the rate the limiter gives it, and when
// they have all been served: how long after they arrived, and how long
// first in, first out behind the heavy customer's backlog would have taken.
func (m *monitor) tellFairness(disp *display, rows []row) {
	for i, r := range rows {
		if m.toldFair[r.Name] {
			continue
		}
		f, ok := fairnessOf(m.prod, m.providers[i], r.InForce)
		if !ok {
			continue
		}
		if !m.toldArrival[r.Name] {
			m.toldArrival[r.Name] = true
			disp.event(f.arrival(r.Name, r.Tenants))
		}
		if !f.Last.IsZero() {
			m.toldFair[r.Name] = true
			disp.event(f.event(r.Name))
		}
	}
}

func allDone(rows []row) bool {
	for _, r := range rows {
		if r.Done < r.Total {
			return false
		}
	}
	return true
}

// rows reads every provider's progress.
func (m *monitor) rows(ctx context.Context) ([]row, error) {
	names := make([]string, len(m.providers))
	for i, p := range m.providers {
		names[i] = p.Spec.Name
	}
	snap, err := m.ledger.snapshot(ctx, names)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	// The rate over the last rateWindow; over at least a second at the start,
	// where a burst in a few milliseconds would read as a huge rate.
	window := min(max(now.Sub(m.start), time.Second), rateWindow)
	rows := make([]row, len(m.providers))
	for i, p := range m.providers {
		name := p.Spec.Name
		st := p.Stats()
		stats := snap.stats[name]
		r := row{
			Name:      name,
			Done:      int(snap.done[name]),
			Total:     m.jobs,
			Deferred:  stats[statDeferred],
			Suspended: stats[statSuspended],
			TooMany:   int64(st.TooMany),
			Waiting:   map[string]int64{},
		}
		for f, n := range stats {
			if w, ok := strings.CutPrefix(f, statWaitPrefix); ok {
				r.Waiting[w] = n
			}
		}
		r.Rate = float64(p.ServedSince(now.Add(-window))) / window.Seconds()
		if !st.Last.IsZero() {
			r.Finished = st.Last.Sub(m.start)
		}
		status, err := m.limiter.Inspect(ctx, name)
		if err != nil && !errors.Is(err, throttle.ErrInvalidLimit) && !errors.Is(err, throttle.ErrNoLimits) {
			return nil, err
		}
		r.Limit, r.InForce, r.LearnedFor, r.SuspendedFor = status.Limits, status.InForce, status.LearnedFor, status.SuspendedFor
		r.Tenants = tenantRows(m.prod, p, status)
		rows[i] = r
	}
	return rows, nil
}
