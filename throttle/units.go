package throttle

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// unitRequests is the default unit: what a tier counts unless In says
// otherwise, and what Cost sets.
const unitRequests = "requests"

// validateUnit checks a unit's name: 1 to 32 of a-z, 0-9, '_' and '-',
// starting with a letter.
func validateUnit(unit string) error { return keyspace.ValidateUnit(unit) }

// taskCost is what a task takes: n requests (its Cost, 1 without one) and,
// as the uses header spells it, what it uses of other units.
type taskCost struct {
	n     int
	units string // "tokens=1200,input-tokens=300" sorted by unit; "" none
}

// orOne is c with at least one request (a zero taskCost: one request).
func (c taskCost) orOne() taskCost {
	c.n = max(c.n, 1)
	return c
}

// of returns what c says of unit (0 when it says nothing).
func (c taskCost) of(unit string) int {
	if unit == unitRequests || unit == "" {
		return c.n
	}
	for part := range strings.SplitSeq(c.units, ",") {
		u, v, _ := strings.Cut(part, "=")
		if u == unit {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// each calls f for every unit c uses besides requests.
func (c taskCost) each(f func(unit string, n int)) {
	if c.units == "" {
		return
	}
	for part := range strings.SplitSeq(c.units, ",") {
		u, v, _ := strings.Cut(part, "=")
		n, _ := strconv.Atoi(v)
		f(u, n)
	}
}

// arg is the cost argument of the decide script: the requests, then the
// other units (lua.Decide).
func (c taskCost) arg() any {
	if c.units == "" {
		return c.n
	}
	return strconv.Itoa(c.n) + "," + c.units
}

// String formats c for errors: "3", or "1 request, 1200 tokens".
func (c taskCost) String() string {
	if c.units == "" {
		return strconv.Itoa(c.n)
	}
	s := strconv.Itoa(c.n) + " requests"
	c.each(func(u string, n int) { s += ", " + strconv.Itoa(n) + " " + u })
	return s
}

// refund gives back all of cost, admitted at at under the limits of
// generation gen, to key: its requests and each other unit, from where
// they were counted (see adjust), and to its tenant's share.
func (l *Limiter) refund(ctx context.Context, key string, at time.Time, gen int64, cost taskCost, tenant string) error {
	err := l.adjust(ctx, key, -cost.n, lua.Call{At: at, Charged: cost.n, Generation: gen, Tenant: tenant})
	cost.each(func(unit string, n int) {
		if n > 0 && err == nil {
			err = l.adjust(ctx, key, -n, lua.Call{At: at, Charged: n, Generation: gen, Unit: unit, Tenant: tenant})
		}
	})
	return err
}

// usesOption is the asynq.Option returned by Uses.
type usesOption struct {
	unit string
	n    int
}

// optionTypeUses is outside asynq's option types, as optionTypeKey.
const optionTypeUses asynq.OptionType = 1<<20 + 3

// String, Type and Value make Uses an asynq.Option.
func (u usesOption) String() string         { return fmt.Sprintf("throttle.Uses(%q, %d)", u.unit, u.n) }
func (u usesOption) Type() asynq.OptionType { return optionTypeUses }
func (u usesOption) Value() interface{}     { return u.n }

// Uses says that a task uses n of unit: it takes n from every tier of its
// key counted in that unit (Limit.In), beside the request it is, all or
// nothing in one decision. An estimate is fine: settle it with Used once
// the call says what it used. For example, an LLM call of a 1,000-token
// prompt that may answer with up to 500:
//
//	throttle.NewTask("llm:summarize", p, throttle.Key("openai:gpt-4o"),
//		throttle.Uses("tokens", 1500))
//
// A task takes nothing from the tiers of a unit it does not use, and the
// units a key has no tier of limit nothing. Uses("requests", n) is Cost(n).
// n is from 0 to 1000000000; a unit is 1 to 32 of a-z, 0-9, '_' and '-',
// starting with a letter. Like Key, it must go through NewTask (or be given
// to Limiter.Take).
func Uses(unit string, n int) asynq.Option {
	if unit == unitRequests {
		return costOption(n)
	}
	return usesOption{unit: unit, n: n}
}

// addUses adds u to the uses header value s, refusing a bad unit or count
// and a unit given twice.
func addUses(s string, u usesOption) (string, error) {
	if err := validateUnit(u.unit); err != nil {
		return "", fmt.Errorf("%v: %w", u, err)
	}
	if u.n < 0 || u.n > maxBurst {
		return "", fmt.Errorf("%v: the count must be from 0 to %d", u, maxBurst)
	}
	parts := []string{}
	if s != "" {
		parts = strings.Split(s, ",")
	}
	for _, p := range parts {
		if name, _, _ := strings.Cut(p, "="); name == u.unit {
			return "", fmt.Errorf("%v: a second Uses of unit %q", u, u.unit)
		}
	}
	parts = append(parts, u.unit+"="+strconv.Itoa(u.n))
	sort.Strings(parts)
	return strings.Join(parts, ","), nil
}

// usesOf reads the uses header of t ("" when absent); a malformed one is
// an error, the enqueuer's bug.
func usesOf(t *asynq.Task) (string, error) {
	s, ok := t.Headers()[keyspace.Uses]
	if !ok || s == "" {
		return "", nil
	}
	out := ""
	for part := range strings.SplitSeq(s, ",") {
		u, v, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return "", fmt.Errorf("throttle: task type %q: header %s = %q: want unit=n,... (Uses)", t.Type(), keyspace.Uses, s)
		}
		if out, err = addUses(out, usesOption{unit: u, n: n}); err != nil {
			return "", fmt.Errorf("throttle: task type %q: header %s: %w", t.Type(), keyspace.Uses, err)
		}
	}
	return out, nil
}

// Used settles what the task whose handler ctx belongs to actually used of
// unit, once the call says (an LLM response's usage): the task was
// admitted with its estimate (Uses; for "requests" its Cost, 1 without
// one), and Used takes the difference from every tier of the key counted in
// unit, or gives it back, atomically in one Redis call. A refund never lets
// a tier admit more than it would have had the task asked for less: a
// bucket gets back what has not refilled since, a window takes it back
// only from the window it was counted in. Used for a unit again replaces
// what the task was charged of it. It returns an error outside a handler
// run by the middleware, for a negative count or a bad unit; for a key
// without limits it does nothing. When Redis cannot record the settlement
// (unreachable, or the task ran under WithFailOpen because it could not
// decide), Used logs it, reports an Event with Outcome Unsettled and
// returns nil: the handler's call was made, and an error would fail the
// task and make it again; the next Used of the unit settles the whole
// difference.
func Used(ctx context.Context, unit string, n int) error {
	tc, ok := ctx.Value(chargeKey{}).(*taskCharge)
	if !ok {
		return errNoTaskContext
	}
	if unit != unitRequests {
		if err := validateUnit(unit); err != nil {
			return fmt.Errorf("throttle: key %q: Used: %w", tc.key, err)
		}
	}
	if n < 0 || n > maxBurst {
		return fmt.Errorf("throttle: key %q: Used(%q, %d): the count must be from 0 to %d", tc.key, unit, n, maxBurst)
	}
	for _, c := range append([]*taskCharge{tc}, tc.also...) {
		ids := c.settle(ctx, unit, n)
		if len(ids) > 0 {
			// (outside the lock: other settlements of the task need not wait)
			c.l.forward(ctx, c.key, ids)
		}
	}
	return nil
}

// settle is Used's settlement of unit to n, one at a time; it returns the
// reservations a refund brought forward.
func (tc *taskCharge) settle(ctx context.Context, unit string, n int) []lua.Forwarded {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	charged := tc.cost.of(unit)
	if u, ok := tc.used[unit]; ok {
		charged = u
	}
	if n == charged {
		return nil
	}
	call := lua.Call{At: tc.at, Charged: charged, Generation: tc.gen, Tenant: tc.tenant, Estimate: tc.cost.of(unit)}
	if unit != unitRequests {
		// A refund of another unit may bring booked tasks forward, to run
		// now in this handler's queue (Limiter.forward).
		_, inQueue := asynq.GetQueueName(ctx)
		call.Unit, call.Forward = unit, inQueue
	}
	ids, err := tc.l.settle(ctx, tc.key, n-charged, call)
	if err != nil {
		// Not settled (the next Used settles it). Never the task's error:
		// its call to the provider was made, and a failed task would be
		// retried and make it again.
		tc.l.unsettled(ctx, tc, unit, n, charged, err)
		return nil
	}
	if tc.used == nil {
		tc.used = map[string]int{}
	}
	tc.used[unit] = n
	return ids
}

// unsettled reports a settlement of unit (the task charged charged, using
// n) that Redis could not record: logged, and an Event for metrics.
func (l *Limiter) unsettled(ctx context.Context, tc *taskCharge, unit string, n, charged int, err error) {
	id, _ := asynq.GetTaskID(ctx)
	l.o.logger.Warn("throttle: cannot record what a task used; the key counts its estimate, the task's result stands",
		"key", tc.key, "task_id", id, "unit", unit, "used", n, "charged", charged, "err", err)
	if fs := l.onEvent.Load(); fs != nil {
		ev := Event{Key: tc.key, TaskID: id, Outcome: Unsettled, HandlerRan: true, Err: err, left: -1}
		for _, f := range *fs {
			f(ev)
		}
	}
}
