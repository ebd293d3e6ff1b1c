package throttle

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// Enqueue enqueues task on client, throttled at enqueue time rather than
// only when a worker dequeues it. It takes the task's decision now: the
// task reserves its run time in its key's schedule and is enqueued to be
// processed then (asynq.ProcessAt), so asynq keeps it in its scheduled set
// until then, a worker dequeues it once, and the middleware admits it
// against its reservation. On a key that is not paced (WithPacing) the
// earliest run time is the next whole second, asynq's resolution, even
// when the key has room now: such a task is scheduled, not pending.
// Without Enqueue, a task of a
// backlog is dequeued, refused, deferred and dequeued again: the same
// fleet-wide rate, for more Redis commands per task (bench/README.md,
// scenario A).
//
// Every guarantee still holds at run time: the middleware decides as
// always, so limits changed after enqueue, a suspension, or a reservation
// that lapsed are obeyed then (the task is refused and deferred like any
// other). A task whose run time lies beyond the reservation horizon
// (WithReservationHorizon), one already given ProcessAt or ProcessIn, a
// grouped one (asynq.Group: only the task its group is aggregated into
// runs, under its own ID), one without a key, and any task when Redis
// cannot decide now, is enqueued as is: the middleware throttles it at run
// time. A task of several keys (Key with more than one name) books one
// run time that every key admits, held in each. Enqueue gives the task an
// ID (asynq.TaskID) when opts have none:
// its reservation is held under it. Use Enqueue with the same Limiter
// options as the workers' middleware (key function, horizon, headroom,
// pacing).
func (l *Limiter) Enqueue(ctx context.Context, client *asynq.Client, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	key, err := l.o.keyOf(task)
	if err != nil {
		return nil, err
	}
	id := ""
	for _, o := range opts {
		switch o.Type() {
		case asynq.ProcessAtOpt, asynq.ProcessInOpt:
			key = "" // scheduled by the caller: decided when it runs
		case asynq.GroupOpt:
			key = "" // runs only as part of the aggregated task, under its ID
		case asynq.TaskIDOpt:
			id, _ = o.Value().(string)
		}
	}
	if key == "" {
		return client.EnqueueContext(ctx, task, opts...)
	}
	cost, err := costOf(task)
	if err != nil {
		return nil, err
	}
	tenant, err := tenantOf(task)
	if err != nil {
		return nil, err
	}
	keys, err := keysOfTask(task, key)
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = uuid.NewString()
		opts = append(opts, asynq.TaskID(id))
	}
	v := variant{horizon: l.o.horizon, granule: granule, headroom: l.o.headroom, pace: l.o.pacing, book: true}
	var d Decision
	if keys != nil {
		d, err = l.decideMulti(ctx, keys, v, id, cost, tenant)
	} else {
		d, err = l.decide(ctx, key, v, id, cost, tenant)
	}
	switch {
	case errors.Is(err, ErrCostTooHigh):
		return nil, err
	case err != nil || !d.reserved:
		// Redis cannot decide, the key has no limits, the run time is beyond
		// the horizon, or the ID holds a reservation already (another
		// task's, which asynq refuses to enqueue again, or this task's
		// left from an enqueue that failed): the middleware decides when
		// the task runs.
		return client.EnqueueContext(ctx, task, opts...)
	}
	if delay := l.reservedDelay(d.reservedAt, time.Now()); delay > 0 {
		opts = append(opts, asynq.ProcessIn(delay))
	}
	info, err := client.EnqueueContext(ctx, task, opts...)
	if err != nil {
		if keys == nil {
			keys = []string{key}
		}
		for _, k := range keys {
			// (the booking, or the hold '~' and the ID, in every key)
			l.release(ctx, k, id, tenant, cost)
		}
		return nil, err
	}
	return info, nil
}

// reservedDelay is how long from now a task reserved to run at at should
// wait in asynq: to that time, rounded up to a whole second (asynq's
// granularity), or, for a paced reservation inside a second, to the whole
// second before it (the middleware then waits for the time itself).
func (l *Limiter) reservedDelay(at, now time.Time) time.Duration {
	if l.o.pacing && at.Truncate(time.Second) != at {
		return max(at.Truncate(time.Second).Sub(now), 0)
	}
	if t := at.Truncate(time.Second); t.Before(at) {
		at = t.Add(time.Second)
	}
	return max(at.Sub(now), 0)
}

// release gives up the booking of task id, of tenant and cost (its enqueue
// failed: asynq refused a duplicate, say), and undoes what it wrote: the
// reservation, the tenant's place in line and, when it was the last
// booking, the schedule (see lua.Unbook). Nobody waits behind work that
// never comes.
func (l *Limiter) release(ctx context.Context, key, id, tenant string, cost taskCost) {
	keys, err := redisKeys(l.o.prefix, key)
	if err != nil {
		return
	}
	_, err = bounded(l, context.WithoutCancel(ctx), func(ctx context.Context) (bool, error) {
		return lua.Unbook(ctx, l.runner, keys, id, tenant, cost.orOne().arg(), l.defaults(key))
	})
	if err != nil {
		l.o.logger.Warn("throttle: cannot give up the booking of a task that was not enqueued; it lapses by itself",
			"key", key, "task_id", id, "lapse", l.o.lapse, "err", err)
	}
}

// errNoTaskContext is returned by Used outside a handler run by the
// middleware.
var errNoTaskContext = errors.New("throttle: Used needs the context of a handler run by the throttle middleware")

// taskCharge is what the middleware tells a handler's context: how to
// settle the task's actual cost (Used) and what its decision saw
// (Observe).
type taskCharge struct {
	l      *Limiter
	ks     *keyState
	key    string
	tenant string    // the task's tenant ("" the default), settled with the tiers
	left   int       // tokens the decision left, -1 unknown
	at     time.Time // when the task was admitted (Redis clock; zero for a leased token)
	gen    int64     // the limits' generation it was admitted under

	// A handler may call Used from several goroutines: one settles at a
	// time, so that each tells Redis what the task was charged before it.
	mu   sync.Mutex
	cost taskCost       // what the task was admitted with
	used map[string]int // what Used settled since, by unit

	also []*taskCharge // a task of several keys: the charge in each other key
}

type chargeKey struct{}
