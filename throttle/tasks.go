package throttle

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// taskStore is the limiter's way to the asynq tasks: it re-enqueues a copy
// of a deferred task when asynq's retry path cannot be used, and looks
// tasks up (a copy that exists already, tasks to bring back after Resume).
// Its asynq client and inspector are made on first use.
type taskStore struct {
	rdb redis.UniversalClient // the tasks' Redis

	once   sync.Once
	client *asynq.Client
	insp   *asynq.Inspector
}

func (s *taskStore) setup(rdb redis.UniversalClient, o options) {
	s.rdb = rdb
	if o.taskRedis != nil {
		s.rdb = o.taskRedis
	}
}

func (s *taskStore) init() {
	s.once.Do(func() {
		s.client = asynq.NewClientFromRedisClient(s.rdb)
		s.insp = asynq.NewInspectorFromRedisClient(s.rdb)
	})
}

// copyRetryFor bounds how long a failed copy enqueue is retried (and never
// past the task's own deadline).
const copyRetryFor = 30 * time.Second

// errCopy wraps a copy that could not be enqueued, saying what happens to the
// original.
type errCopy struct {
	id, kept string
	err      error
}

func (e *errCopy) Error() string {
	return fmt.Sprintf("throttle: could not re-enqueue deferred task %s: %v; the task is %s", e.id, e.err, e.kept)
}

func (e *errCopy) Unwrap() error { return e.err }

// enqueueCopy re-enqueues the task of ctx to run after delay, as a copy with
// a new ID, and returns that ID; the caller lets the original finish. The
// copy keeps type, payload, headers, queue, and the retries left (MaxRetry
// minus the retries already spent, which its header keyspace.Retried counts).
// Its ID is derived from the original's, so that doing it again (the
// original delivered twice after a crash) finds the same copy instead of
// making another. An existing task with that ID counts as the copy only
// when it is live and a copy of this very task (same type and payload,
// keyspace.CopyOf naming it); anything else (a copy left from an earlier run
// of a task ID used again, a task whose handler copied the headers) gets a
// fresh copy under a new ID. A failed enqueue is retried until the task's
// deadline, at most copyRetryFor.
func (s *taskStore) enqueueCopy(ctx context.Context, t *asynq.Task, key, reason string, delay time.Duration) (string, error) {
	s.init()
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, hasMax := asynq.GetMaxRetry(ctx)

	headers := make(map[string]string, len(t.Headers())+6)
	for k, v := range t.Headers() {
		headers[k] = v
	}
	origin := headers[keyspace.Origin]
	if origin == "" {
		origin = id
	}
	n, _ := strconv.Atoi(headers[keyspace.Deferrals])
	n++
	spent, _ := strconv.Atoi(headers[keyspace.Retried])
	spent += retried
	headers[keyspace.Origin] = origin
	headers[keyspace.Deferrals] = strconv.Itoa(n)
	headers[keyspace.CopyOf] = id
	headers[keyspace.DeferredKey] = key
	headers[keyspace.DeferredReason] = reason
	if spent > 0 {
		headers[keyspace.Retried] = strconv.Itoa(spent)
	}
	copyTask := asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers)
	opts := []asynq.Option{asynq.ProcessIn(delay)}
	if queue != "" {
		opts = append(opts, asynq.Queue(queue))
	}
	if hasMax {
		opts = append(opts, asynq.MaxRetry(max(maxRetry-retried, 0)))
	}
	copyID := origin + "~throttle-" + strconv.Itoa(n)

	until := time.Now().Add(copyRetryFor)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	backoff := 50 * time.Millisecond
	for conflicts := 0; ; {
		_, err := s.client.EnqueueContext(ctx, copyTask, append(opts, asynq.TaskID(copyID))...)
		switch {
		case err == nil:
			return copyID, nil
		case errors.Is(err, asynq.ErrTaskIDConflict):
			if s.isCopyOf(queue, copyID, id, t) {
				return copyID, nil
			}
			conflicts++
			if conflicts > 3 {
				return "", s.copyFailed(ctx, id, err)
			}
			copyID = origin + "~throttle-" + strconv.Itoa(n) + "-" + randomSuffix()
			continue
		}
		if time.Now().Add(backoff).After(until) {
			return "", s.copyFailed(ctx, id, err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return "", s.copyFailed(ctx, id, err)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// copyFailed says what becomes of a task whose copy could not be enqueued:
// asynq archives it on its last attempt, and retries it otherwise.
func (s *taskStore) copyFailed(ctx context.Context, id string, err error) error {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, hasMax := asynq.GetMaxRetry(ctx)
	kept := "kept for a retry (one retry spent)"
	if !hasMax || retried >= maxRetry {
		kept = "kept in the archive (asynq archives a task on its last attempt): run it again with the asynq CLI or Inspector.RunTask"
	}
	return &errCopy{id: id, kept: kept, err: err}
}

// isCopyOf reports whether the task copyID in queue is a live copy of the
// task id (of t's type and payload).
func (s *taskStore) isCopyOf(queue, copyID, id string, t *asynq.Task) bool {
	info, err := s.insp.GetTaskInfo(queue, copyID)
	if err != nil {
		return false
	}
	switch info.State {
	case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry, asynq.TaskStateActive, asynq.TaskStateAggregating:
	default:
		return false
	}
	return info.Headers[keyspace.CopyOf] == id && info.Type == t.Type() && bytes.Equal(info.Payload, t.Payload())
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// parkedTask is a task deferred from a process's cached suspension: where it
// waits in asynq.
type parkedTask struct{ queue, id string }

// soonest is how close to its time a waiting task is left alone by run:
// it comes back by itself, and asynq's RunTask would run it again if it
// completed between our look and the call (RunTask moves a task from
// whatever set holds it, the completed one included).
const soonest = 2 * time.Second

// forwardSoonest is soonest for the tasks a refund brings forward:
// adjust.lua picks reservations at least 1.5 s ahead, and asynq holds a
// task until the whole second before its instant, so each is half a second
// or more from coming back by itself. (RunTask runs a task again only if
// it completed between our look and the call; asynq cannot move it to
// pending before that half second is over. Farther, the last 2 s of a
// backlog booked at its estimates drained at them: bench L5 through the
// middleware, 0.89-0.92 of the tokens limit with 2 s and 1 s, 0.90-0.97
// with 1.5 s and 0.5 s, interleaved.)
const forwardSoonest = 500 * time.Millisecond

// run brings tasks back to pending now when they still wait in asynq's retry
// or scheduled set and match (as they did when they were found), and are not
// due within near (soonest, or forwardSoonest). It returns how many it
// brought back.
func (s *taskStore) run(tasks []parkedTask, near time.Duration, match func(*asynq.TaskInfo) bool) int {
	s.init()
	n := 0
	for _, p := range tasks {
		info, err := s.insp.GetTaskInfo(p.queue, p.id)
		if err != nil || (info.State != asynq.TaskStateRetry && info.State != asynq.TaskStateScheduled) ||
			!match(info) || time.Until(info.NextProcessAt) < near {
			continue
		}
		if err := s.insp.RunTask(p.queue, p.id); err == nil {
			n++
		}
	}
	return n
}

// forward runs now the tasks of key whose reservations a refund brought
// forward (see lua.Settle), where they wait: in the queue of the handler
// that settled (ctx), as a backlog's tasks do, and only a task that still
// waits for the instant its reservation held (within forwardSlack: asynq
// brings a task back on whole seconds) is the one that booked it. A task
// found elsewhere, under another ID (a copy the middleware enqueued for a
// task on its last retry), about to come back, or waiting for another time
// (deleted and enqueued again under its ID for later, or retrying after a
// failure of its own) comes at its own time; a reservation whose task does
// not come lapses, as any holder's.
func (l *Limiter) forward(ctx context.Context, key string, fw []lua.Forwarded) {
	queue, ok := asynq.GetQueueName(ctx)
	if !ok {
		return
	}
	tasks := make([]parkedTask, len(fw))
	booked := make(map[string]time.Time, len(fw))
	for i, f := range fw {
		tasks[i] = parkedTask{queue: queue, id: f.ID}
		booked[f.ID] = f.At
	}
	n := l.tasks.run(tasks, forwardSoonest, func(info *asynq.TaskInfo) bool {
		at, ok := booked[info.ID]
		if !ok || info.NextProcessAt.Sub(at).Abs() > forwardSlack {
			return false
		}
		return l.o.hasKey(asynq.NewTaskWithHeaders(info.Type, info.Payload, info.Headers), key)
	})
	l.o.logger.Debug("throttle: a refund brought booked tasks forward", "key", key, "queue", queue, "brought", n, "of", len(fw))
}

// hasKey reports whether task t is throttled by key: its key, or one of
// the keys of a task of several keys (booked in its second key, say).
func (o *options) hasKey(t *asynq.Task, key string) bool {
	k, err := o.keyOf(t)
	if err != nil || k == "" {
		return false
	}
	if k == key {
		return true
	}
	keys, err := keysOfTask(t, k)
	return err == nil && slices.Contains(keys, key)
}

// forwardSlack is how far from its reservation's instant a task brought
// forward may be due: asynq brings a task back on the whole second before
// or after its instant (the middleware's deferDelay), and the clocks of
// Redis and of the process that deferred it may differ a little.
const forwardSlack = 2 * time.Second

// listPage is how many tasks bringBack reads at once.
const listPage = 500

// bringBack finds the tasks that match among those waiting in asynq's retry
// and scheduled sets of every queue, and runs them now. It returns how many
// it brought back.
func (s *taskStore) bringBack(ctx context.Context, match func(*asynq.TaskInfo) bool) (int, error) {
	s.init()
	queues, err := s.insp.Queues()
	if err != nil {
		return 0, err
	}
	var found []parkedTask
	for _, q := range queues {
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){s.insp.ListRetryTasks, s.insp.ListScheduledTasks} {
			for page := 1; ; page++ {
				if err := ctx.Err(); err != nil {
					return s.run(found, soonest, match), err
				}
				infos, err := list(q, asynq.PageSize(listPage), asynq.Page(page))
				if err != nil {
					return s.run(found, soonest, match), err
				}
				for _, info := range infos {
					if match(info) && time.Until(info.NextProcessAt) >= soonest {
						found = append(found, parkedTask{queue: q, id: info.ID})
					}
				}
				if len(infos) < listPage {
					break
				}
			}
		}
	}
	return s.run(found, soonest, match), nil
}

// deferredBy reports whether a task waits in asynq's retry or scheduled set
// because the middleware deferred it on key, for reason ("": any): on the
// retry path (its last error is the deferral), or as a copy made for it.
func deferredBy(info *asynq.TaskInfo, key, reason string) bool {
	switch info.State {
	case asynq.TaskStateScheduled:
		return info.Headers[keyspace.DeferredKey] == key && (reason == "" || info.Headers[keyspace.DeferredReason] == reason)
	case asynq.TaskStateRetry:
		k, r, ok := deferral.Parse(info.LastErr)
		return ok && k == key && (reason == "" || r == reason)
	}
	return false
}
