package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// deferralPrefix starts the LastErr of a task deferred under
// worker.NewServer (internal/deferral.Error).
const deferralPrefix = "throttle: task deferred"

// whyView is the answer of `why`, as one sentence or JSON.
type whyView struct {
	TaskID    string     `json:"task_id"`
	Queue     string     `json:"queue"`
	Type      string     `json:"type"`
	State     string     `json:"state"`
	Key       string     `json:"key,omitempty"`
	Throttled bool       `json:"throttled"`
	Reason    string     `json:"reason"` // see the Reason* constants
	RunsAt    *time.Time `json:"runs_at,omitempty"`
	Slot      *time.Time `json:"slot,omitempty"`
	Tier      int        `json:"tier,omitempty"`
	Sentence  string     `json:"sentence"`
}

// Reasons of whyView.
const (
	reasonReserved     = "reserved"      // waiting for its reserved slot
	reasonSuspended    = "suspended"     // the key is suspended
	reasonTier         = "tier"          // a tier has no token
	reasonQueued       = "queued"        // other tasks reserved the next slots
	reasonTokens       = "tokens"        // waiting, but the key has tokens now
	reasonScheduled    = "scheduled"     // its producer scheduled it
	reasonHandlerError = "handler_error" // retrying after a handler error
	reasonPending      = "pending"       // ready, waiting for a worker
	reasonNotThrottled = "not_throttled" // no key, or the key has no limits
	reasonNotWaiting   = "not_waiting"   // running, done or archived
	reasonInvalidKey   = "invalid_key"   // its key header is invalid
)

func (a *app) whyCmd() *cobra.Command {
	var queue string
	cmd := &cobra.Command{
		Use:   "why TASK_ID",
		Short: "Say in one sentence why a task is waiting and when it will run",
		Long: `Find a task with asynq's Inspector (in --queue, else in every queue), its
throttle key (the throttle-key header, else its type's prefix before ':'),
and say why it waits and when it runs: its reserved slot, the key's
suspension, the tier that has no token, the reservations ahead of it, or
that it is not throttled or not waiting. Workers built WithKeyFunc may use
another key than the one shown for tasks without the header.`,
		Example: "  asynq-throttle why 9b2f6c1e-4a57-4c1e-9d6f-1f0a2b3c4d5e --queue default",
		Args:    args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			info, err := a.findTask(args[0], queue)
			if err != nil {
				return err
			}
			v, err := a.explain(cmd.Context(), lim, info)
			if err != nil {
				return err
			}
			if a.json() {
				return writeJSON(a.stdout, v)
			}
			_, err = fmt.Fprintln(a.stdout, v.Sentence)
			return err
		},
	}
	cmd.Flags().StringVarP(&queue, "queue", "q", "", "the task's queue (default: search every queue)")
	return cmd
}

// findTask looks the task up in queue, or in every queue.
func (a *app) findTask(id, queue string) (*asynq.TaskInfo, error) {
	insp := asynq.NewInspectorFromRedisClient(a.rdb)
	queues := []string{queue}
	if queue == "" {
		var err error
		if queues, err = insp.Queues(); err != nil {
			return nil, fmt.Errorf("list asynq queues: %w", err)
		}
		slices.Sort(queues)
	}
	for _, q := range queues {
		info, err := insp.GetTaskInfo(q, id)
		switch {
		case err == nil:
			return info, nil
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
			continue
		default:
			return nil, fmt.Errorf("look up task %s in queue %s: %w", id, q, err)
		}
	}
	if queue != "" {
		return nil, fmt.Errorf("task %s not found in queue %q (omit --queue to search every queue)", id, queue)
	}
	return nil, fmt.Errorf("task %s not found in any asynq queue (%s); asynq keeps completed tasks only with asynq.Retention", id, strings.Join(queues, ", "))
}

// explain finds why info waits.
func (a *app) explain(ctx context.Context, lim *throttle.Limiter, info *asynq.TaskInfo) (whyView, error) {
	v := whyView{TaskID: info.ID, Queue: info.Queue, Type: info.Type, State: info.State.String()}
	now := time.Now()
	task := fmt.Sprintf("task %s (%s)", info.ID, info.Type)
	runs := "asynq brings it back when it is due"
	if !info.NextProcessAt.IsZero() && (info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry) {
		at := info.NextProcessAt
		v.RunsAt = &at
		runs = "asynq brings it back at " + when(at, now)
	}
	done := func(reason, format string, args ...any) (whyView, error) {
		v.Reason = reason
		v.Sentence = fmt.Sprintf(format, args...)
		return v, nil
	}

	switch info.State {
	case asynq.TaskStateActive:
		return done(reasonNotWaiting, "%s is not waiting: a worker is running it now.", task)
	case asynq.TaskStateCompleted:
		return done(reasonNotWaiting, "%s is not waiting: it has completed.", task)
	case asynq.TaskStateArchived:
		return done(reasonNotWaiting, "%s is not waiting: asynq archived it after its handler failed (%s); throttling never archives a task.", task, lastErr(info))
	case asynq.TaskStateAggregating:
		return done(reasonNotWaiting, "%s is waiting in aggregation group %q; asynq runs it when the group is flushed.", task, info.Group)
	}

	key, err := throttle.KeyOfTask(asynq.NewTaskWithHeaders(info.Type, nil, info.Headers))
	if err != nil {
		return done(reasonInvalidKey, "%s cannot be throttled: %v; the middleware fails it when it runs.", task, err)
	}
	v.Key = key
	if key == "" {
		if info.State == asynq.TaskStatePending {
			return done(reasonNotThrottled, "%s is not throttled (no %s header, and its type has no \"provider:\" prefix); it runs as soon as a worker is free.", task, throttle.HeaderKey)
		}
		return done(reasonNotThrottled, "%s is not throttled (no %s header, and its type has no \"provider:\" prefix); %s.", task, throttle.HeaderKey, runs)
	}
	st, err := lim.Inspect(ctx, key)
	var cfg *throttle.ConfigError
	if errors.As(err, &cfg) {
		return done(reasonNotThrottled, "%s cannot be decided: key %q has invalid limits in Redis (%s: %s), so the workers apply their failure policy; fix it with `asynq-throttle set`.", task, key, cfg.Field, cfg.Reason)
	}
	if err != nil {
		return v, err
	}
	v.Throttled = st.Limits != nil
	task = fmt.Sprintf("task %s (key %q)", info.ID, key)

	if info.State == asynq.TaskStatePending {
		switch tier, _ := emptyTier(st); {
		case st.Suspended > 0:
			return done(reasonSuspended, "%s is pending, but key %q is suspended for another %s, so a worker that picks it up defers it until then.", task, key, formatDur(st.Suspended))
		case st.Limits == nil:
			return done(reasonNotThrottled, "%s is pending and not throttled: key %q has no limits in Redis (the workers' default limits, if any, apply); it runs as soon as a worker is free.", task, key)
		case tier > 0:
			v.Tier = tier
			return done(reasonTier, "%s is pending; a worker that picks it up now defers it, because %s.", task, tierSentence(st, tier, key))
		case st.Reservations > 0:
			return done(reasonQueued, "%s is pending; %d deferred tasks hold reserved slots ahead of it (the backlog drains in %s), so a worker that picks it up waits behind them.", task, st.Reservations, formatDur(st.QueuedFor))
		}
		return done(reasonPending, "%s is pending and key %q has tokens (%s), so it runs as soon as a worker is free.", task, key, tokens(st))
	}

	// Scheduled or retry: it waits for asynq to bring it back.
	deferred := strings.HasPrefix(info.LastErr, deferralPrefix) || info.Headers[throttle.HeaderOrigin] != ""
	if info.State == asynq.TaskStateRetry && !deferred && info.LastErr != "" {
		return done(reasonHandlerError, "%s is waiting to retry after its handler failed (%s), not for throttling; %s.", task, info.LastErr, runs)
	}
	resvID := info.ID
	if origin := info.Headers[throttle.HeaderOrigin]; origin != "" {
		resvID = origin
	}
	slot, ok, err := lim.Reservation(ctx, key, resvID)
	if err != nil {
		return v, err
	}
	if ok {
		v.Slot = &slot
		redisNow, err := a.rdb.Time(ctx).Result()
		if err != nil {
			return v, fmt.Errorf("read the Redis clock: %w", err)
		}
		if st.Suspended > 0 && slot.Before(redisNow.Add(st.Suspended)) {
			return done(reasonSuspended, "%s is waiting because key %q is suspended for another %s (a 429 from the provider, or an operator); its reserved slot at %s falls inside the suspension, so it will be deferred again then, to run after it.",
				task, key, formatDur(st.Suspended), when(slot, redisNow))
		}
		after := ""
		if st.Suspended > 0 {
			after = fmt.Sprintf(", after the key's suspension (%s left)", formatDur(st.Suspended))
		}
		if v.RunsAt != nil && v.RunsAt.Sub(slot).Abs() < 1500*time.Millisecond {
			// asynq's time and the slot agree (one clock is the enqueuer's,
			// the other Redis'): say it once.
			return done(reasonReserved, "%s is waiting for its reserved run slot at %s%s; asynq brings it back then and it runs without contending again.",
				task, when(slot, redisNow), after)
		}
		return done(reasonReserved, "%s holds a reserved run slot at %s%s; %s.", task, when(slot, redisNow), after, runs)
	}
	tier, _ := emptyTier(st)
	switch {
	case st.Suspended > 0:
		return done(reasonSuspended, "%s is waiting because key %q is suspended for another %s (a 429 from the provider, or an operator); %s.", task, key, formatDur(st.Suspended), runs)
	case st.Limits == nil:
		return done(reasonNotThrottled, "%s is waiting, but key %q has no limits in Redis now, so it runs unthrottled (or under the workers' defaults) when %s.", task, key, runs)
	case tier > 0:
		v.Tier = tier
		return done(reasonTier, "%s is waiting because %s; %s.", task, tierSentence(st, tier, key), runs)
	case st.Reservations > 0:
		return done(reasonQueued, "%s is waiting behind %d tasks that reserved the next slots of key %q (the backlog drains in %s); %s.", task, st.Reservations, key, formatDur(st.QueuedFor), runs)
	case !deferred:
		return done(reasonScheduled, "%s was scheduled by its producer, not deferred by throttling; %s, and key %q has tokens now (%s).", task, runs, key, tokens(st))
	}
	return done(reasonTokens, "%s was deferred, but key %q has tokens now (%s), so it should run when %s.", task, key, tokens(st), runs)
}

// emptyTier returns the first tier (1-based) without a whole token, or 0.
func emptyTier(st throttle.Status) (int, float64) {
	for i, t := range st.Tokens {
		if t < 1 {
			return i + 1, t
		}
	}
	return 0, 0
}

// tierSentence says which tier has no token and when the next comes.
func tierSentence(st throttle.Status, tier int, key string) string {
	l, t := st.Limits[tier-1], st.Tokens[tier-1]
	next := time.Duration((1 - t) * float64(l.Per) / float64(l.Rate))
	return fmt.Sprintf("tier %d of key %q (%s) has %.1f of %d tokens and gets the next in %s", tier, key, formatLimit(l), t, burstOf(l), formatDur(next))
}

func tokens(st throttle.Status) string {
	parts := make([]string, len(st.Tokens))
	for i, t := range st.Tokens {
		parts[i] = fmt.Sprintf("%.1f/%d", t, burstOf(st.Limits[i]))
	}
	return strings.Join(parts, " ")
}

// when formats an instant for a sentence: "15:04:05 (in 12s)".
func when(t, now time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return t.Format("15:04:05") + " (due now)"
	}
	return t.Format("15:04:05") + " (in " + formatDur(d) + ")"
}

func lastErr(info *asynq.TaskInfo) string {
	if info.LastErr == "" {
		return "no error recorded"
	}
	return info.LastErr
}
