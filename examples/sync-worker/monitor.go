package main

import (
	"context"
	"fmt"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// pollInterval is how often the monitor reads progress (and so how soon it
// sees the last job done).
const pollInterval = 200 * time.Millisecond

// monitor reads a run's progress from the ledger and the providers.
type monitor struct {
	ledger    ledger
	limiter   *throttle.Limiter
	providers []*Provider
	jobs      int
	start     time.Time
}

// ending is why watch returned.
type ending int

const (
	allJobsDone ending = iota
	timedOut
	interrupted
)

// watch updates disp every interval until every job is done, ctx ends or
// timeout passes, and tells which.
func (m monitor) watch(ctx context.Context, disp *display, interval, timeout time.Duration) ending {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		rows, err := m.rows(ctx)
		switch {
		case err == nil:
			disp.update(rows)
			if allDone(rows) {
				return allJobsDone
			}
		case ctx.Err() == nil:
			disp.event("cannot read progress: " + err.Error())
		}
		select {
		case <-ctx.Done():
			disp.event("interrupted: stopping the workers")
			return interrupted
		case <-deadline.C:
			disp.event(fmt.Sprintf("timed out after %v: stopping the workers", timeout))
			return timedOut
		case <-tick.C:
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
func (m monitor) rows(ctx context.Context) ([]row, error) {
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
		r := row{
			Name:      name,
			Done:      int(snap.done[name]),
			Total:     m.jobs,
			Deferred:  snap.stats[name][statDeferred],
			Suspended: snap.stats[name][statSuspended],
			TooMany:   int64(st.TooMany),
		}
		r.Rate = float64(p.ServedSince(now.Add(-window))) / window.Seconds()
		if !st.Last.IsZero() {
			r.Finished = st.Last.Sub(m.start)
		}
		if limits, err := m.limiter.Limits(ctx, name); err == nil {
			r.Limit = limits
		}
		rows[i] = r
	}
	return rows, nil
}
