package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// auditRun reads the last progress counts, shows them on disp and audits
// the run into s, taking at most 30 s even when ctx has ended.
func (m *monitor) auditRun(ctx context.Context, rdb redis.UniversalClient, queue string, prod *producer, disp *display, s *Summary) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rows, err := m.rows(actx)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	disp.finish(rows)
	return m.audit(actx, rdb, queue, prod, rows, s)
}

// audit checks every job against asynq (through the Inspector), the
// handlers' ledger and the provider's own count, and fills s. rows are the
// last progress counts.
func (m *monitor) audit(ctx context.Context, rdb redis.UniversalClient, queue string, prod *producer, rows []row, s *Summary) error {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()

	archivedByType, err := archivedTasks(insp, queue)
	if err != nil {
		return err
	}
	var last time.Time
	for i, p := range m.providers {
		st := p.Stats()
		ps, err := m.auditProvider(ctx, insp, queue, prod, p, st, rows[i])
		if err != nil {
			return err
		}
		ps.Archived = archivedByType[p.Spec.TaskType]
		if st.Last.After(last) {
			last = st.Last
		}
		s.add(ps)
	}
	if !last.IsZero() {
		s.Seconds = round(last.Sub(m.start).Seconds(), 3)
	}
	if s.ByWorker, err = m.ledger.workerCounts(ctx); err != nil {
		return fmt.Errorf("audit: read ledger: %w", err)
	}
	s.OK = s.Done == s.Jobs && s.Duplicates == 0 && s.Archived == 0 && s.Lost == 0
	return nil
}

// auditProvider audits the jobs of provider p: what its ledger, its own
// count of 200s (st) and asynq say of each. r is its last progress row.
func (m *monitor) auditProvider(ctx context.Context, insp *asynq.Inspector, queue string, prod *producer, p *Provider, st ProviderStats, r row) (ProviderSummary, error) {
	name := p.Spec.Name
	done, err := m.ledger.doneCounts(ctx, name)
	if err != nil {
		return ProviderSummary{}, fmt.Errorf("audit: read ledger: %w", err)
	}
	ps := ProviderSummary{
		Name:      name,
		Quota:     formatLimits(p.Spec.Quota),
		Limit:     formatLimits(r.Limit),
		InForce:   formatLimits(r.InForce),
		Learned:   !slices.Equal(r.Limit, r.InForce),
		Jobs:      len(prod.ids[name]),
		Served:    st.Served,
		TooMany:   st.TooMany,
		Shed:      st.Shed,
		OverQuota: st.OverQuota,
		LateShed:  st.LateShed,
		Deferred:  r.Deferred,
		Suspended: r.Suspended,
	}
	for _, id := range prod.ids[name] {
		if !prod.sent(id) {
			ps.NotDone++ // the run stopped before it was due to arrive
			continue
		}
		info, err := insp.GetTaskInfo(queue, id)
		switch {
		case err == nil:
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
			info = nil
		default:
			return ProviderSummary{}, fmt.Errorf("audit: task %s: %w", id, err)
		}
		ps.count(done[id], p.servedCount(id), info)
	}
	if !st.Last.IsZero() {
		ps.Seconds = round(st.Last.Sub(m.start).Seconds(), 3)
		ps.Rate = round(float64(st.Served)/max(ps.Seconds, 1), 2)
	}
	ps.Tenants = tenantSummaries(prod, p, done, r.InForce, m.start)
	return ps, nil
}

// count counts one job that was sent: done n times by the handlers' ledger,
// served that many times by its provider, and info as asynq has it (nil:
// asynq no longer has it).
func (ps *ProviderSummary) count(n, served int, info *asynq.TaskInfo) {
	if n > 0 {
		ps.Done++
	}
	if n > 1 || served > 1 {
		ps.Duplicates++
	}
	switch {
	case n > 0 && info != nil && info.State == asynq.TaskStateCompleted:
	case info != nil && info.State == asynq.TaskStateArchived:
		// counted in Archived
	case n == 0 && info != nil && info.State != asynq.TaskStateCompleted:
		ps.NotDone++ // still queued: the run stopped first
	default:
		// asynq no longer has it, or has it completed though its
		// handler never succeeded (or succeeded, and asynq lost
		// the completed task).
		ps.Lost++
	}
}

// add adds a provider's line to the summary and its totals.
func (s *Summary) add(ps ProviderSummary) {
	s.Providers = append(s.Providers, ps)
	s.Jobs += ps.Jobs
	s.Done += ps.Done
	s.Duplicates += ps.Duplicates
	s.Archived += ps.Archived
	s.Lost += ps.Lost
	s.NotDone += ps.NotDone
	s.TooMany += ps.TooMany
	s.Shed += ps.Shed
	s.OverQuota += ps.OverQuota
	s.LateShed += ps.LateShed
}

// round rounds x to the given number of decimals, for readable JSON.
func round(x float64, decimals int) float64 {
	p := math.Pow10(decimals)
	return math.Round(x*p) / p
}

// archivedTasks counts the queue's archived tasks by type (deferred copies
// included: they keep their original's type).
func archivedTasks(insp *asynq.Inspector, queue string) (map[string]int, error) {
	out := map[string]int{}
	for page := 1; ; page++ {
		tasks, err := insp.ListArchivedTasks(queue, asynq.Page(page), asynq.PageSize(100))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("audit: list archived tasks: %w", err)
		}
		for _, t := range tasks {
			out[t.Type]++
		}
		if len(tasks) < 100 {
			return out, nil
		}
	}
}

// cleanup removes the run's queue, limits and ledger from a shared Redis.
// Everything also expires on its own, except asynq's counters.
func cleanup(ctx context.Context, rdb redis.UniversalClient, run string) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()
	// DeleteQueue leaves completed tasks and the queue's counters behind.
	_, _ = insp.DeleteAllCompletedTasks(queueName(run))
	_ = insp.DeleteQueue(queueName(run), true)
	var keys []string
	for _, pattern := range []string{ledgerNS(run) + ":*", limiterPrefix(run) + ":*", "asynq:{" + queueName(run) + "}:*"} {
		k, _ := scanKeys(ctx, rdb, pattern)
		keys = append(keys, k...)
	}
	_ = deleteKeys(ctx, rdb, keys)
}
