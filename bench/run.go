package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// env is what every scenario shares: the Redis, the provider, the flags.
type env struct {
	opts    *redis.Options
	own     bool // we started the Redis: FLUSHALL between runs is ours to do
	ctl     *redis.Client
	prov    *provider
	quick   bool
	verbose bool
	bRounds int // scenario B's rounds (-b-rounds)
	eRounds int // scenario E's rounds (-e-rounds)
	// Scenario E's variants (-e-variants), where its per-run traces go
	// (-e-trace, "" none) and the phase its runs start at (-e-phase).
	eVariants []string
	eTrace    string
	ePhase    float64 // -e-phase: start each run at this fraction of a second, -1 any
	// Scenario F's backlogs (-f-short, -f-long), the long case's run time
	// (-f-long-time), the semaphore variant's retry delay (-f-sema-retry)
	// and the variants to run (-f-variants).
	fShort, fLong         int
	fLongTime, fSemaRetry time.Duration
	fVariants             []string
	// Scenario T's variants (-t-variants) and cases (-t-cases, lower case).
	tVariants, tCases []string
	runID             string
	seq               int
}

func (e *env) newClient(poolSize int) *redis.Client {
	o := *e.opts
	o.PoolSize = poolSize
	// Context deadlines bound socket I/O, as production clients should set:
	// the same for every variant.
	o.ContextTimeoutEnabled = true
	return redis.NewClient(&o)
}

// names returns a fresh queue name and key prefix for one run, so runs on a
// shared Redis never see each other's tasks or buckets.
func (e *env) names(scenario, variant string) (queue, prefix string) {
	e.seq++
	base := fmt.Sprintf("bench-%s-%d-%s-%s", e.runID, e.seq, scenario, variant)
	return base, base
}

// cleanup removes what a run left: everything when we own the Redis, else
// the run's queue and keys.
func (e *env) cleanup(ctx context.Context, queue, prefix string) error {
	if e.own {
		return e.ctl.FlushAll(ctx).Err()
	}
	if queue != "" {
		insp := asynq.NewInspectorFromRedisClient(e.ctl)
		if err := insp.DeleteQueue(queue, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			return err
		}
	}
	// Limiter keys, redis_rate keys, and the statistics asynq keeps after
	// DeleteQueue.
	patterns := []string{prefix + "*", "rate:" + prefix + "*"}
	if queue != "" {
		patterns = append(patterns, "asynq:{"+queue+"}*")
	}
	var keys []string
	for _, pattern := range patterns {
		it := e.ctl.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		if err := it.Err(); err != nil {
			return err
		}
	}
	for k := range slices.Chunk(keys, 500) {
		if err := e.ctl.Del(ctx, k...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// taskSet tracks one class of tasks of one run: every successful run of
// every task, by index, to prove exactly-once and measure latency.
type taskSet struct {
	n    int
	runs []atomic.Int32
	lat  []atomic.Int64 // enqueue to the run that succeeded, ns
	done atomic.Int64   // tasks that succeeded at least once
	last atomic.Int64   // UnixNano of the latest first success
}

func newTaskSet(n int) *taskSet {
	return &taskSet{n: n, runs: make([]atomic.Int32, n), lat: make([]atomic.Int64, n)}
}

func (s *taskSet) complete(idx int, enq, start time.Time) {
	if idx < 0 || idx >= s.n {
		return
	}
	if s.runs[idx].Add(1) != 1 {
		return
	}
	s.lat[idx].Store(int64(start.Sub(enq)))
	now := time.Now().UnixNano()
	for {
		l := s.last.Load()
		if now <= l || s.last.CompareAndSwap(l, now) {
			break
		}
	}
	s.done.Add(1)
}

func (s *taskSet) finished() bool { return s.done.Load() >= int64(s.n) }

// duplicates counts tasks whose handler succeeded more than once.
func (s *taskSet) duplicates() int {
	n := 0
	for i := range s.runs {
		if s.runs[i].Load() > 1 {
			n++
		}
	}
	return n
}

// percentiles of the enqueue-to-run latency of the tasks that ran.
func (s *taskSet) percentiles(ps ...float64) []time.Duration {
	var l []time.Duration
	for i := range s.runs {
		if s.runs[i].Load() > 0 {
			l = append(l, time.Duration(s.lat[i].Load()))
		}
	}
	out := make([]time.Duration, len(ps))
	if len(l) == 0 {
		return out
	}
	slices.Sort(l)
	for i, p := range ps {
		k := int(p*float64(len(l)) + 0.5)
		out[i] = l[min(max(k-1, 0), len(l)-1)]
	}
	return out
}

// elapsed is the time from start to the last first success.
func (s *taskSet) elapsed(start time.Time) time.Duration {
	l := s.last.Load()
	if l == 0 {
		return 0
	}
	return time.Unix(0, l).Sub(start)
}

// payload carries the task's index and its enqueue time.
func payload(idx int) []byte {
	return []byte(strconv.Itoa(idx) + " " + strconv.FormatInt(time.Now().UnixNano(), 10))
}

func parsePayload(b []byte) (int, time.Time, error) {
	a, c, ok := strings.Cut(string(b), " ")
	idx, err1 := strconv.Atoi(a)
	ns, err2 := strconv.ParseInt(c, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return 0, time.Time{}, fmt.Errorf("bad payload %q", b)
	}
	return idx, time.Unix(0, ns), nil
}

// providerHandler calls the provider's endpoint; a 200 completes the task,
// a 429 goes to the variant's onLimited.
func providerHandler(p *provider, set *taskSet, endpoint string) func(limitedFunc) asynq.Handler {
	return func(onLimited limitedFunc) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			idx, enq, err := parsePayload(t.Payload())
			if err != nil {
				return fmt.Errorf("%w: %v", asynq.SkipRetry, err)
			}
			start := time.Now()
			resp, err := p.call(ctx, endpoint)
			if err != nil {
				return err
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				return onLimited(resp)
			}
			set.complete(idx, enq, start)
			return nil
		})
	}
}

// noopHandler completes a task without doing anything (scenario D).
func noopHandler(set *taskSet) func(limitedFunc) asynq.Handler {
	return func(limitedFunc) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			idx, enq, err := parsePayload(t.Payload())
			if err != nil {
				return fmt.Errorf("%w: %v", asynq.SkipRetry, err)
			}
			set.complete(idx, enq, time.Now())
			return nil
		})
	}
}

// enqueue enqueues n tasks made by mk (called at enqueue time, so payloads
// carry their enqueue instant) on queue, from 16 goroutines.
func enqueue(ctx context.Context, e *env, queue string, n int, mk func(i int) *asynq.Task) error {
	client := asynq.NewClientFromRedisClient(e.ctl)
	return enqueueWith(ctx, n, func(ctx context.Context, i int) error {
		_, err := client.EnqueueContext(ctx, mk(i), asynq.Queue(queue))
		return err
	})
}

// waitFor polls until cond holds or the deadline passes; it reports
// whether cond held.
func waitFor(ctx context.Context, deadline time.Time, cond func() bool) bool {
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return cond()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats by command name.
func commandStats(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	m := map[string]cmdStat{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		m[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return m, nil
}

// redisCalls sums the calls of every command in INFO commandstats (Redis
// counts the commands a script runs as well as the script call itself),
// and separately the script calls (EVAL*, FCALL*).
func redisCalls(ctx context.Context, c *redis.Client) (total, scripts int64, err error) {
	m, err := commandStats(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	for name, st := range m {
		total += st.calls
		switch name {
		case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
			scripts += st.calls
		}
	}
	return total, scripts, nil
}

// redisCPU returns the CPU time the Redis server has used (INFO cpu,
// used_cpu_user + used_cpu_sys), in seconds.
func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			sum += f
		}
	}
	return sum, nil
}

// queueLeft is what stayed in a run's queue after the fleet stopped.
type queueLeft struct {
	Pending, Active, Scheduled, Retry, Archived int
}

func (q queueLeft) String() string {
	return fmt.Sprintf("%d/%d/%d/%d/%d", q.Pending, q.Active, q.Scheduled, q.Retry, q.Archived)
}

func inspectQueue(e *env, queue string) queueLeft {
	info, err := asynq.NewInspectorFromRedisClient(e.ctl).GetQueueInfo(queue)
	if err != nil {
		return queueLeft{}
	}
	return queueLeft{info.Pending, info.Active, info.Scheduled, info.Retry, info.Archived}
}
