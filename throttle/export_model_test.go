package throttle

// Hooks for the combined model of property_model_test.go (issues 29 and
// 34): the middleware's decisions, Enqueue's booking and its release when
// asynq refuses the task, and the observe path, each as the library takes
// it, without an asynq server around them.

import (
	"context"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// How long the middleware keeps a task in its worker: at most MaxPaceWait
// for a paced instant (whatever the decision's wait says), at most
// MaxNearWait in all waiting to ask again near its paced instant, at most
// MaxSlotWait for a slot in flight expected free, polling no more often
// than MinSlotPoll.
const (
	MaxPaceWait = maxPaceWait
	MaxSlotWait = maxSlotWait
	MaxNearWait = maxNearWait
	MinSlotPoll = minSlotPoll
)

// DecideTask is the decision the middleware takes for task id of tenant
// ("" the default tenant) costing n requests and uses ("tokens=40", ""
// none): the reservation horizon for a task with an ID, the 1 s granule,
// the headroom and pacing of l's options (no lease), asking as a task
// that waits in its worker for its paced instant (near), as one with a
// deadline far off does.
func DecideTask(l *Limiter, ctx context.Context, key, id, tenant string, n int, uses string) (Decision, error) {
	// (near: a task with its deadline's time to wait, as asynq's 30 min)
	v := variant{granule: granule, headroom: l.o.headroom, pace: l.o.pacing, near: l.o.pacing}
	if l.o.horizon > 0 && id != "" {
		v.horizon = l.o.horizon
	} else {
		id = ""
	}
	return l.decide(ctx, key, v, id, taskCost{n: n, units: uses}, tenant)
}

// ProbeTask is DecideTask for a task waiting in its worker for a slot in
// flight (decideProbe): it keeps its place among the waiters.
func ProbeTask(l *Limiter, ctx context.Context, key, id, tenant string, n int, uses string) (Decision, error) {
	v := variant{granule: granule, headroom: l.o.headroom, pace: l.o.pacing, probe: true}
	if l.o.horizon > 0 && id != "" {
		v.horizon = l.o.horizon
	} else {
		id = ""
	}
	return l.decide(ctx, key, v, id, taskCost{n: n, units: uses}, tenant)
}

// BookTask is the decision Enqueue takes for a task of tenant with ID id,
// costing n requests and uses (BookAs with units).
func BookTask(l *Limiter, ctx context.Context, key, id, tenant string, n int, uses string) (Decision, error) {
	v := variant{horizon: l.o.horizon, granule: granule, headroom: l.o.headroom, pace: l.o.pacing, book: true}
	return l.decide(ctx, key, v, id, taskCost{n: n, units: uses}, tenant)
}

// EnqueueRefused is what Enqueue does when asynq refuses the task it
// booked (a duplicate of an asynq.Unique task, an ID in use): it gives up
// the booking of task id, of tenant, costing n requests and uses
// (Limiter.release).
func EnqueueRefused(l *Limiter, ctx context.Context, key, id, tenant string, n int, uses string) {
	l.release(ctx, key, id, tenant, taskCost{n: n, units: uses})
}

// EnqueueDelay is how long from now Enqueue schedules a task reserved to
// run at at (ProcessIn).
func EnqueueDelay(l *Limiter, at, now time.Time) time.Duration { return l.reservedDelay(at, now) }

// NearRefusal reports a refusal that tells a holder asking as one that
// waits (near) to ask again at its instant from its worker.
func NearRefusal(d Decision) bool { return d.near }

// PacedWait is how far ahead of its decision d admitted its call (a paced
// instant): what the middleware waits in the worker, up to MaxPaceWait.
func PacedWait(d Decision) time.Duration { return d.wait }

// Booked reports whether d refused a booking because its ID holds a
// reservation already.
func Booked(d Decision) bool { return d.booked }

// ObserveQuota runs l's observe path for key as a handler's Observe does
// for a response that states a quota of n calls per per (n 0: none
// stated) and remaining calls left (-1: not said) until reset.
func ObserveQuota(l *Limiter, ctx context.Context, key string, n int, per time.Duration, remaining int, reset time.Duration) error {
	ks, err := l.state(key)
	if err != nil {
		return err
	}
	tc := &taskCharge{l: l, ks: ks, key: key, left: -1}
	q := quota.Info{Remaining: -1}
	if n > 0 {
		q.Policies = []quota.Policy{{Quota: n, Window: per}}
		q.PolicySource = "model"
	}
	if remaining >= 0 {
		q.Remaining, q.Reset, q.Window, q.Source = remaining, reset, per, "model"
	}
	l.observe(ctx, tc, q, quota.LLMInfo{}, time.Now())
	return nil
}
