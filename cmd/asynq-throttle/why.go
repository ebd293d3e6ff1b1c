package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// whyView is the answer of `why`, as one sentence or JSON.
type whyView struct {
	TaskID string `json:"task_id"`
	Queue  string `json:"queue"`
	Type   string `json:"type"`
	State  string `json:"state"`
	Key    string `json:"key,omitempty"`
	// Keys are all the task's keys, the first its key, when it has more
	// than one (throttle.Key with several names); Key is then the one
	// that makes it wait.
	Keys      []string `json:"keys,omitempty"`
	Throttled bool     `json:"throttled"`
	Reason    string   `json:"reason"` // see the Reason* constants
	// DeferredFor is why the middleware last deferred the task, as it
	// recorded it ("tier", "in flight", "suspended", ...); absent when it
	// was not deferred.
	DeferredFor string     `json:"deferred_for,omitempty"`
	RunsAt      *time.Time `json:"runs_at,omitempty"`
	ReservedAt  *time.Time `json:"reserved_at,omitempty"` // its reserved run time (Redis clock)
	Tier        int        `json:"tier,omitempty"`        // the limit that refuses (1-based, as listed)
	Limit       string     `json:"limit,omitempty"`       // that limit, as set takes it
	// Unit is what the refusing limit counts: "requests" or another unit
	// (absent for an in-flight limit).
	Unit string `json:"unit,omitempty"`
	Cost int    `json:"cost,omitempty"` // the requests the task takes from every request tier
	// Uses is what the task takes of other units than requests from their
	// tiers (the throttle-uses header: throttle.Uses); absent when none.
	Uses map[string]int `json:"uses,omitempty"`
	// Generation counts the changes of the key's limits (every set bumps it).
	Generation int64                `json:"generation,omitempty"`
	InFlight   *limitspec.SlotsView `json:"in_flight,omitempty"` // the key's in-flight slots now
	// Tenant is the task's tenant on its key (the throttle-tenant header;
	// name "" the default tenant, shown only while tenants share the key):
	// its weight (0 when not read: past the 100 tenants next in line), its
	// share of the key's rate, its backlog. Absent for a task that is not
	// waiting, not throttled or never admitted.
	Tenant   *tenantView `json:"tenant,omitempty"`
	Sentence string      `json:"sentence"`
}

// Reasons of whyView.
const (
	reasonReserved     = "reserved"      // waiting for its reserved run time
	reasonSuspended    = "suspended"     // the key is suspended
	reasonTier         = "tier"          // a bucket or window has no room for it
	reasonSlots        = "in_flight"     // every slot of the in-flight limit is held (refused by slots)
	reasonQueued       = "queued"        // other tasks reserved the next run times
	reasonTokens       = "tokens"        // waiting, but the key has room now
	reasonRejected     = "rejected"      // it costs more than a limit ever holds: failed for good
	reasonScheduled    = "scheduled"     // its producer scheduled it
	reasonHandlerError = "handler_error" // retrying after a handler error
	reasonPending      = "pending"       // ready, waiting for a worker
	reasonNotThrottled = "not_throttled" // no key, or the key has no limits
	reasonNotWaiting   = "not_waiting"   // running, done or archived
	reasonInvalidKey   = "invalid_key"   // its key (or tenant, or uses) header is invalid
)

func (a *app) whyCmd() *cobra.Command {
	var queue string
	cmd := &cobra.Command{
		Use:   "why TASK_ID",
		Short: "Say in one sentence why a task is waiting and when it will run",
		Long: `Find a task with asynq's Inspector (in --queue, else in every queue), its
throttle key (the throttle-key header, else its type's prefix before ':'),
and say why it waits and when it runs: its reserved run time, the key's
suspension, the bucket or window without room for its cost (or for what it
uses of the tier's unit: the throttle-uses header), the in-flight
limit whose slots are all held (refused by slots), the reservations ahead
of it, or that it is not throttled or not waiting. A task of a tenant (the
throttle-tenant header), or any task of a key its tenants share, is told of
its tenant's weight, share of the key's rate and backlog. -o json adds the
refusing limit and its unit, the task's cost and uses, the key's slots in flight, the generation
of its limits and the tenant. Workers built WithKeyFunc may use
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
	e := newExplanation(info, time.Now())
	if v, ok := e.notWaiting(); ok {
		return v, nil
	}
	key, _, err := keyspace.KeyOfTask(asynq.NewTaskWithHeaders(info.Type, nil, info.Headers), nil)
	if err != nil {
		return e.say(reasonInvalidKey, "%s cannot be throttled: %v; the middleware fails it when it runs.", e.task, err)
	}
	e.v.Key, e.key = key, key
	if key == "" {
		return e.withoutKey()
	}
	more, err := keyspace.KeysOfTask(asynq.NewTaskWithHeaders(info.Type, nil, info.Headers), key)
	if err != nil {
		return e.say(reasonInvalidKey, "%s cannot be throttled: %v; the middleware fails it when it runs.", e.task, err)
	}
	e.tenant, e.hasTenant = tenantOfTask(info.Headers)
	if err := throttle.ValidateKey(e.tenant); e.hasTenant && err != nil {
		return e.say(reasonInvalidKey, "%s cannot be throttled: header %s: %v; the middleware fails it when it runs.", e.task, keyspace.Tenant, err)
	}
	if e.uses, err = usesOf(info); err != nil {
		return e.say(reasonInvalidKey, "%s cannot be throttled: %v; the middleware fails it when it runs.", e.task, err)
	}
	if more != nil {
		e.v.Keys = append([]string{key}, more...)
		key = a.waitingKey(ctx, lim, e, e.v.Keys)
		e.v.Key, e.key = key, key
	}
	st, err := lim.Inspect(ctx, key)
	var cfg *throttle.ConfigError
	if errors.As(err, &cfg) {
		return e.say(reasonNotThrottled, "%s cannot be decided: key %q has invalid limits in Redis (%s: %s), so the workers apply their failure policy; fix it with `asynq-throttle set`.", e.task, key, cfg.Field, cfg.Reason)
	}
	if err != nil {
		return e.v, err
	}
	e.withStatus(st)
	var v whyView
	if info.State == asynq.TaskStatePending {
		v, err = e.pending()
	} else {
		v, err = a.explainDelayed(ctx, e)
	}
	if err != nil {
		return v, err
	}
	if len(e.v.Keys) > 1 {
		waits := fmt.Sprintf("key %q is the one it waits on", key)
		if tier := slowestBlocking(e.st, e.need); tier > 0 {
			// (a reserved or queued task: the tier of that key with no room
			// for it now that takes longest to have it, which its run time
			// waits out)
			waits += fmt.Sprintf(", its tier %d (%s) without room for it now", tier, formatLimit(e.st.Limits[tier-1]))
			if v.Tier == 0 {
				v.Tier = tier
			}
		}
		v.Sentence += fmt.Sprintf(" (A task of keys %s, decided all or nothing: %s.)", quoteAll(e.v.Keys), waits)
	}
	return e.withTenant(v), nil
}

// waitingKey picks, among a task's keys, the one that makes it wait: the
// key suspended longest, else the first whose limits refuse it now, else
// the first that booked its reserved run time in its schedule, else its
// first key. A key that cannot be read is passed over.
func (a *app) waitingKey(ctx context.Context, lim *throttle.Limiter, e *explanation, keys []string) string {
	resvID := e.info.ID
	if origin := e.info.Headers[keyspace.Origin]; origin != "" {
		resvID = origin
	}
	suspended, longest, blocked, booked := "", time.Duration(0), "", ""
	e.v.Cost = costOf(e.info) // (need reads it; withStatus sets it again)
	for _, k := range keys {
		st, err := lim.Inspect(ctx, k)
		if err != nil {
			continue
		}
		if st.SuspendedFor > longest {
			suspended, longest = k, st.SuspendedFor
		}
		if blocked == "" && st.Limits != nil && blocking(st, e.need) > 0 {
			blocked = k
		}
		if booked == "" {
			if _, ok, err := a.reservation(ctx, k, resvID); err == nil && ok {
				booked = k
			}
		}
	}
	for _, k := range []string{suspended, blocked, booked} {
		if k != "" {
			return k
		}
	}
	return keys[0]
}

// quoteAll quotes names for a sentence: "a", "b" and "c".
func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	if len(q) <= 1 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

// explanation is what explain has found out about a task so far.
type explanation struct {
	v    whyView
	info *asynq.TaskInfo
	task string // the task as sentences name it
	runs string // when asynq brings it back, as sentences say it
	key  string
	// tenant is the task's tenant ("" the default), hasTenant whether its
	// header names one.
	tenant    string
	hasTenant bool
	// uses is what the task uses of units other than requests (its
	// throttle-uses header), nil when none.
	uses map[string]int
	st   throttle.Status
	// tooHigh and blocked are the limits (1-based, 0 for none) that can
	// never hold the task's cost, and that refuse it now.
	tooHigh, blocked int
}

func newExplanation(info *asynq.TaskInfo, now time.Time) *explanation {
	e := &explanation{
		v:    whyView{TaskID: info.ID, Queue: info.Queue, Type: info.Type, State: info.State.String()},
		info: info,
		task: fmt.Sprintf("task %s (%s)", info.ID, info.Type),
		runs: "asynq brings it back when it is due",
	}
	if !info.NextProcessAt.IsZero() && (info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry) {
		at := info.NextProcessAt
		e.v.RunsAt = &at
		e.runs = "asynq brings it back at " + when(at, now)
	}
	return e
}

// say ends the explanation: the task waits for reason, in a sentence.
// What a producer wrote into it (the task's type, its last error) is shown
// with control characters escaped: a task type must not send escape
// sequences to the operator's terminal.
func (e *explanation) say(reason, format string, args ...any) (whyView, error) {
	e.v.Reason = reason
	e.v.Sentence = printable(fmt.Sprintf(format, args...))
	return e.v, nil
}

// printable escapes what a terminal would act on instead of showing:
// control characters (ESC, CR, BEL, ...) and invalid UTF-8, as Go quotes
// them (\x1b, \r, \u202e).
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// refuses records that limit i (1-based) of the key refuses the task.
func (e *explanation) refuses(i int) {
	l := e.st.Limits[i-1]
	e.v.Tier, e.v.Limit, e.v.Unit = i, formatLimit(l), limitspec.Unit(l)
}

// need is what the task takes of limit l: its cost from a request tier,
// what it uses of another unit from that unit's tiers (0 when it says
// nothing of it: the tier takes nothing and does not hold it back), one
// slot from an in-flight limit.
func (e *explanation) need(l throttle.Limit) int {
	switch unit := limitspec.Unit(l); unit {
	case "":
		if l.Kind == throttle.KindInFlight {
			return 1 // a task holds one slot whatever its cost
		}
		return 0
	case limitspec.Requests:
		return e.v.Cost
	default:
		return e.uses[unit]
	}
}

// costs says what the task takes of limit tier (1-based): "costs 50", or
// "uses 40000 tokens" for a tier of another unit.
func (e *explanation) costs(tier int) string {
	l := e.st.Limits[tier-1]
	if u := limitspec.Unit(l); u != limitspec.Requests {
		return fmt.Sprintf("uses %d %s", e.need(l), u)
	}
	return fmt.Sprintf("costs %d", e.need(l))
}

// notWaiting explains a task that is running, done, archived or grouped:
// asynq holds it (a task the middleware rejected is archived).
func (e *explanation) notWaiting() (whyView, bool) {
	var v whyView
	switch state := e.info.State; {
	case state == asynq.TaskStateActive:
		v, _ = e.say(reasonNotWaiting, "%s is not waiting: a worker is running it now.", e.task)
	case state == asynq.TaskStateCompleted:
		v, _ = e.say(reasonNotWaiting, "%s is not waiting: it has completed.", e.task)
	case state == asynq.TaskStateArchived && rejected(e.info.LastErr):
		v, _ = e.say(reasonRejected, "%s is not waiting: the middleware rejected it, and asynq archived it, because it can never be throttled (%s); fix how it is enqueued or the key's limits, then run it again from the archive.", e.task, lastErr(e.info))
	case state == asynq.TaskStateArchived:
		v, _ = e.say(reasonNotWaiting, "%s is not waiting: asynq archived it after its handler failed (%s); throttling never archives a task it can throttle.", e.task, lastErr(e.info))
	case state == asynq.TaskStateAggregating:
		v, _ = e.say(reasonNotWaiting, "%s is waiting in aggregation group %q; asynq runs it when the group is flushed.", e.task, e.info.Group)
	default:
		return v, false
	}
	return v, true
}

// rejected reports the last error of a task the middleware rejected: one
// it can never throttle (outcome throttle.Rejected), failed with
// asynq.SkipRetry.
func rejected(lastErr string) bool {
	return strings.HasPrefix(lastErr, "throttle: ") && strings.HasSuffix(lastErr, asynq.SkipRetry.Error())
}

// withoutKey explains a task with no throttle key: nothing throttles it.
func (e *explanation) withoutKey() (whyView, error) {
	if e.info.State == asynq.TaskStatePending {
		return e.say(reasonNotThrottled, "%s is not throttled (no %s header, and its type has no \"provider:\" prefix); it runs as soon as a worker is free.", e.task, throttle.HeaderKey)
	}
	return e.say(reasonNotThrottled, "%s is not throttled (no %s header, and its type has no \"provider:\" prefix); %s.", e.task, throttle.HeaderKey, e.runs)
}

// withStatus records the key's state, and which of its limits refuse the
// task now or could never admit it.
func (e *explanation) withStatus(st throttle.Status) {
	e.st = st
	e.v.Throttled = st.Limits != nil
	e.v.Generation = st.Generation
	e.v.Cost = costOf(e.info)
	if len(e.uses) > 0 {
		e.v.Uses = e.uses
	}
	_, e.v.InFlight = limitspec.Views(st)
	e.task = fmt.Sprintf("task %s (key %q)", e.info.ID, e.key)
	if e.hasTenant {
		e.task = fmt.Sprintf("task %s (key %q, tenant %q)", e.info.ID, e.key, e.tenant)
	}
	e.tooHigh = costTooHigh(st, e.need)
	e.blocked = blocking(st, e.need)
}

// blockedBySlots reports whether the limit that refuses the task now is
// an in-flight limit.
func (e *explanation) blockedBySlots() bool {
	return e.blocked > 0 && e.st.Limits[e.blocked-1].Kind == throttle.KindInFlight
}

// pending explains a task ready to run: what a worker that picks it up now
// would decide.
func (e *explanation) pending() (whyView, error) {
	task, key, st := e.task, e.key, e.st
	switch {
	case st.SuspendedFor > 0:
		return e.say(reasonSuspended, "%s is pending, but key %q is suspended for another %s, so a worker that picks it up defers it until then.", task, key, formatDur(st.SuspendedFor))
	case st.Limits == nil:
		return e.say(reasonNotThrottled, "%s is pending and not throttled: key %q has no limits in Redis (the workers' default limits, if any, apply); it runs as soon as a worker is free.", task, key)
	case e.tooHigh > 0:
		e.refuses(e.tooHigh)
		return e.say(reasonRejected, "%s can never be admitted: it %s, and %s; a worker that picks it up rejects it (fails it for good: asynq archives it); run it again from the archive once the limits or its cost change.", task, e.costs(e.tooHigh), capacitySentence(st, e.tooHigh, key))
	case e.blockedBySlots():
		e.refuses(e.blocked)
		return e.say(reasonSlots, "%s is pending; a worker that picks it up now is refused by slots, because %s, and defers it to when one is expected to free (or waits for it, when that is within a second).", task, slotsSentence(st, e.blocked, key))
	case e.blocked > 0:
		e.refuses(e.blocked)
		return e.say(reasonTier, "%s is pending; a worker that picks it up now defers it, because %s.", task, tierSentence(st, e.blocked, key, e.need(st.Limits[e.blocked-1])))
	case st.Reservations > 0:
		return e.say(reasonQueued, "%s is pending; %d deferred tasks hold reserved run times ahead of it (the backlog drains in %s), so a worker that picks it up waits behind them.", task, st.Reservations, formatDur(st.QueuedFor))
	}
	return e.say(reasonPending, "%s is pending and key %q has room (%s), so it runs as soon as a worker is free.", task, key, room(st))
}

// explainDelayed explains a scheduled or retry task, which waits for asynq
// to bring it back: after a handler error, for its reserved run time, or for
// what refused it.
func (a *app) explainDelayed(ctx context.Context, e *explanation) (whyView, error) {
	deferred := e.readDeferral()
	if e.info.State == asynq.TaskStateRetry && !deferred && e.info.LastErr != "" {
		return e.say(reasonHandlerError, "%s is waiting to retry after its handler failed (%s), not for throttling; %s.", e.task, e.info.LastErr, e.runs)
	}
	resvID := e.info.ID
	if origin := e.info.Headers[keyspace.Origin]; origin != "" {
		resvID = origin // a deferred copy holds its original's reservation
	}
	at, ok, err := a.reservation(ctx, e.key, resvID)
	if err != nil {
		return e.v, err
	}
	if !ok {
		return e.delayed(deferred)
	}
	e.v.ReservedAt = &at
	redisNow, err := a.rdb.Time(ctx).Result()
	if err != nil {
		return e.v, fmt.Errorf("read the Redis clock: %w", err)
	}
	return e.reserved(at, redisNow)
}

// readDeferral records why the middleware last deferred the task, and
// reports whether throttling deferred it (it may have been scheduled by
// its producer).
func (e *explanation) readDeferral() bool {
	if _, why, ok := deferral.Parse(e.info.LastErr); ok {
		e.v.DeferredFor = why
	} else if why := e.info.Headers[keyspace.DeferredReason]; why != "" && e.info.Headers[keyspace.Origin] != "" {
		e.v.DeferredFor = why // a deferred copy
	}
	return e.v.DeferredFor != "" || e.info.Headers[keyspace.Origin] != ""
}

// reserved explains a task that holds a reserved run time (on the Redis clock,
// whose now is redisNow).
func (e *explanation) reserved(at, redisNow time.Time) (whyView, error) {
	task, key, st := e.task, e.key, e.st
	if st.SuspendedFor > 0 && at.Before(redisNow.Add(st.SuspendedFor)) {
		return e.say(reasonSuspended, "%s is waiting because key %q is suspended for another %s (a 429 from the provider, or an operator); its reserved run time, %s, falls inside the suspension, so it will be deferred again then, to run after it.",
			task, key, formatDur(st.SuspendedFor), when(at, redisNow))
	}
	after := ""
	if st.SuspendedFor > 0 {
		after = fmt.Sprintf(", after the key's suspension (%s left)", formatDur(st.SuspendedFor))
	}
	if e.v.RunsAt != nil && e.v.RunsAt.Sub(at).Abs() < 1500*time.Millisecond {
		// asynq's time and the reserved one agree (one clock is the enqueuer's,
		// the other Redis'): say it once.
		return e.say(reasonReserved, "%s is waiting for its reserved run time, %s%s; asynq brings it back then and it runs without contending again.",
			task, when(at, redisNow), after)
	}
	return e.say(reasonReserved, "%s holds a reserved run time, %s%s; %s.", task, when(at, redisNow), after, e.runs)
}

// delayed explains a scheduled or retry task without a reservation:
// what refuses it now, or that nothing does. deferred: throttling deferred
// it.
func (e *explanation) delayed(deferred bool) (whyView, error) {
	task, key, st, runs := e.task, e.key, e.st, e.runs
	bySlots := e.v.DeferredFor == throttle.RefusedBySlots.String()
	switch {
	case st.SuspendedFor > 0:
		return e.say(reasonSuspended, "%s is waiting because key %q is suspended for another %s (a 429 from the provider, or an operator); %s.", task, key, formatDur(st.SuspendedFor), runs)
	case st.Limits == nil:
		return e.say(reasonNotThrottled, "%s is waiting, but key %q has no limits in Redis now, so it runs unthrottled (or under the workers' defaults) when %s.", task, key, runs)
	case e.tooHigh > 0:
		e.refuses(e.tooHigh)
		return e.say(reasonRejected, "%s can never be admitted: it %s, and %s; when %s, a worker rejects it (fails it for good: asynq archives it), unless the limits or its cost change first.", task, e.costs(e.tooHigh), capacitySentence(st, e.tooHigh, key), runs)
	case e.blockedBySlots():
		e.refuses(e.blocked)
		if bySlots {
			return e.say(reasonSlots, "%s was refused by slots: %s, so it was deferred to when one is expected to free; %s.", task, slotsSentence(st, e.blocked, key), runs)
		}
		return e.say(reasonSlots, "%s is waiting because %s; %s.", task, slotsSentence(st, e.blocked, key), runs)
	case e.blocked > 0:
		e.refuses(e.blocked)
		return e.say(reasonTier, "%s is waiting because %s; %s.", task, tierSentence(st, e.blocked, key, e.need(st.Limits[e.blocked-1])), runs)
	case st.Reservations > 0:
		return e.say(reasonQueued, "%s is waiting behind %d tasks that reserved the next slots of key %q (the backlog drains in %s); %s.", task, st.Reservations, key, formatDur(st.QueuedFor), runs)
	case !deferred:
		return e.say(reasonScheduled, "%s was scheduled by its producer, not deferred by throttling; %s, and key %q has room now (%s).", task, runs, key, room(st))
	case bySlots:
		return e.say(reasonTokens, "%s was refused by slots (every in-flight slot of key %q was held), but key %q has room now (%s), so it should run when %s.", task, key, key, room(st), runs)
	}
	return e.say(reasonTokens, "%s was deferred, but key %q has room now (%s), so it should run when %s.", task, key, room(st), runs)
}

// costOf is what the task takes from every request tier of its key (its
// throttle-cost header; 1 without one).
func costOf(info *asynq.TaskInfo) int {
	if n, err := strconv.Atoi(info.Headers[keyspace.Cost]); err == nil && n > 1 {
		return n
	}
	return 1
}

// usesOf reads what the task uses of other units than requests, from its
// throttle-uses header ("tokens=12000,input-tokens=300", as throttle.Uses
// writes it); nil without one. A malformed header is an error: the
// middleware fails such a task.
func usesOf(info *asynq.TaskInfo) (map[string]int, error) {
	h := info.Headers[keyspace.Uses]
	if h == "" {
		return nil, nil
	}
	uses := map[string]int{}
	for part := range strings.SplitSeq(h, ",") {
		unit, v, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(v)
		_, twice := uses[unit]
		if !ok || err != nil || n < 0 || twice || limitspec.CheckUnit(unit) != nil {
			return nil, fmt.Errorf("header %s = %q: want unit=n,... (throttle.Uses)", keyspace.Uses, h)
		}
		uses[unit] = n
	}
	return uses, nil
}

// blocking returns the first limit (1-based) that refuses a task now: a
// bucket or window without what it needs of the tier (need), or an
// in-flight limit without a free slot; 0 when none does.
// slowestBlocking is the tier of st with no room for the task now (need)
// that takes longest to have it, at its rate in force: the one a task
// reserved for later waits out (0 none).
func slowestBlocking(st throttle.Status, need func(throttle.Limit) int) int {
	best, longest := 0, -1.0
	for i, l := range st.Limits {
		if i >= len(st.Tokens) {
			break
		}
		n := need(l)
		if n <= 0 || st.Tokens[i] >= float64(n) {
			continue
		}
		if i < len(st.InForce) {
			l = st.InForce[i]
		}
		wait := 0.0
		if l.N > 0 && l.Per > 0 {
			wait = (float64(n) - st.Tokens[i]) * l.Per.Seconds() / float64(l.N)
		}
		if wait > longest {
			best, longest = i+1, wait
		}
	}
	return best
}

func blocking(st throttle.Status, need func(throttle.Limit) int) int {
	for i, l := range st.Limits {
		if i >= len(st.Tokens) {
			break
		}
		n := need(l)
		if n > 0 && st.Tokens[i] < float64(n) {
			return i + 1
		}
	}
	return 0
}

// costTooHigh returns the first rate limit (1-based) that can never hold
// what the task needs of it, or 0.
func costTooHigh(st throttle.Status, need func(throttle.Limit) int) int {
	for i, l := range st.Limits {
		if l.Kind != throttle.KindInFlight && l.Kind != throttle.KindAdaptive && burstOf(l) < need(l) {
			return i + 1
		}
	}
	return 0
}

// tierSentence says which bucket or window has no room for the need of a
// task and when it will: in calls and tokens for a request tier, in its
// unit for another (12000 tokens).
func tierSentence(st throttle.Status, tier int, key string, need int) string {
	l, t := st.Limits[tier-1], st.Tokens[tier-1]
	unit := limitspec.Unit(l)
	name := fmt.Sprintf("tier %d of key %q (%s)", tier, key, formatLimit(l))
	if tier <= len(st.InForce) && st.InForce[tier-1] != l {
		// Below its configured limit (learned from the provider, or
		// adaptive mode): the tokens come back at the rate in force.
		name = fmt.Sprintf("tier %d of key %q (%s, in force %s)", tier, key, formatLimit(l), formatLimit(st.InForce[tier-1]))
		l = st.InForce[tier-1]
	}
	if unit != limitspec.Requests {
		return unitTierSentence(name, l, t, need, unit)
	}
	cost := need
	if l.Kind == throttle.KindFixedWindow {
		left := max(int(math.Floor(t)), 0)
		return fmt.Sprintf("%s has %d of %d calls left in this fixed %s window (short of the task's cost of %d); the next window opens on the clock", name, left, l.N, shortDur(l.Per), cost)
	}
	if l.Kind == throttle.KindWindow {
		left := max(int(math.Floor(t)), 0)
		if left == 0 {
			return fmt.Sprintf("%s has used all %d calls of its sliding %s window, which frees calls only as it slides past them", name, l.N, shortDur(l.Per))
		}
		return fmt.Sprintf("%s has %d of %d calls left in its sliding %s window, short of the task's cost of %d, and frees calls only as it slides past them", name, left, l.N, shortDur(l.Per), cost)
	}
	next := time.Duration((float64(cost) - t) * float64(l.Per) / float64(l.N))
	if cost > 1 {
		return fmt.Sprintf("%s has %.1f of %d tokens, short of the task's cost of %d, and has them in %s", name, t, burstOf(l), cost, formatDur(next))
	}
	return fmt.Sprintf("%s has %.1f of %d tokens and gets the next in %s", name, t, burstOf(l), formatDur(next))
}

// unitTierSentence is tierSentence for a tier counted in unit (not
// requests), named name, with t of it left (below 0: in debt, after a
// task used more than its estimate) and the task needing need.
func unitTierSentence(name string, l throttle.Limit, t float64, need int, unit string) string {
	left := max(int(math.Floor(t)), 0)
	switch l.Kind {
	case throttle.KindFixedWindow:
		return fmt.Sprintf("%s has %d of %d %s left in this fixed %s window, short of the task's %d %s; the next window opens on the clock", name, left, l.N, unit, shortDur(l.Per), need, unit)
	case throttle.KindWindow:
		return fmt.Sprintf("%s has %d of %d %s left in its sliding %s window, short of the task's %d %s, and frees them only as it slides past the calls that used them", name, left, l.N, unit, shortDur(l.Per), need, unit)
	}
	next := formatDur(time.Duration((float64(need) - t) * float64(l.Per) / float64(l.N)))
	if t < 0 {
		// Calls used more than they said (throttle.Used): the bucket owes.
		return fmt.Sprintf("%s is %.1f %s in debt (of %d: calls used more than their estimates), short of the task's %d %s, and has them in %s", name, -t, unit, burstOf(l), need, unit, next)
	}
	return fmt.Sprintf("%s has %.1f of %d %s, short of the task's %d %s, and has them in %s", name, t, burstOf(l), unit, need, unit, next)
}

// slotsSentence says that every slot of the in-flight limit is held.
func slotsSentence(st throttle.Status, tier int, key string) string {
	l := st.Limits[tier-1]
	if l.N == 1 {
		return fmt.Sprintf("the one in-flight slot of key %q is held (%d of 1 in flight)", key, st.InFlight)
	}
	return fmt.Sprintf("all %d in-flight slots of key %q are held (%d of %d in flight)", l.N, key, st.InFlight, l.N)
}

// capacitySentence says how much a rate limit holds at most.
func capacitySentence(st throttle.Status, tier int, key string) string {
	l := st.Limits[tier-1]
	unit := limitspec.Unit(l)
	if l.Kind == throttle.KindWindow || l.Kind == throttle.KindFixedWindow {
		what := "calls"
		if unit != limitspec.Requests {
			what = unit
		}
		return fmt.Sprintf("tier %d of key %q (%s) admits at most %d %s per window", tier, key, formatLimit(l), l.N, what)
	}
	what := "tokens"
	if unit != limitspec.Requests {
		what = unit
	}
	return fmt.Sprintf("tier %d of key %q (%s) holds at most %d %s", tier, key, formatLimit(l), burstOf(l), what)
}

// room shows what a key has left now: its rate limits' tokens and its
// slots in flight ("10.0/10; 1 of 4 in flight").
func room(st throttle.Status) string {
	var parts []string
	if s := rateTokens(st); s != "" {
		parts = append(parts, s)
	}
	for _, l := range st.Limits {
		if l.Kind == throttle.KindInFlight {
			parts = append(parts, fmt.Sprintf("%d of %d in flight", st.InFlight, l.N))
		}
	}
	return strings.Join(parts, "; ")
}

// shortDur writes a period without its zero tails: 1h, 1m, 1m30s.
func shortDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
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

// reservation returns the run time reserved for taskID under key on the
// Redis clock, and false when the task holds none (a deferred copy holds
// its original's, see keyspace.Origin).
func (a *app) reservation(ctx context.Context, key, taskID string) (time.Time, bool, error) {
	keys, err := keyspace.RedisKeys(a.prefix, key)
	if err != nil {
		return time.Time{}, false, err
	}
	us, err := a.rdb.ZScore(ctx, keys.Reservations, taskID).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("read the reservation of task %q under key %q: %w", taskID, key, err)
	}
	return time.UnixMicro(int64(us)), true, nil
}
