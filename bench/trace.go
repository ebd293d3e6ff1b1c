package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// runTrace records what one provider's fleet did in one run of scenario E,
// for -e-trace: every call the handlers made (task ID, answer), every
// middleware decision (Limiter.OnEvent), and the key's state sampled
// every traceEvery (Limiter.Inspect and the raw hash). Times are since the
// run's start on the harness clock, which is also Redis's (one host).
type runTrace struct {
	start time.Time
	mu    sync.Mutex
	lines []traceLine
}

type traceLine struct {
	at   time.Duration
	text string
}

// traceEvery is how often a trace samples the key's state.
const traceEvery = 100 * time.Millisecond

func newRunTrace(start time.Time) *runTrace { return &runTrace{start: start} }

func (t *runTrace) add(format string, args ...any) {
	if t == nil {
		return
	}
	at := time.Since(t.start)
	s := fmt.Sprintf(format, args...)
	t.mu.Lock()
	t.lines = append(t.lines, traceLine{at, s})
	t.mu.Unlock()
}

// event records one middleware decision.
func (t *runTrace) event(ev throttle.Event) {
	if t == nil {
		return
	}
	s := fmt.Sprintf("decision task=%s outcome=%s", ev.TaskID, ev.Outcome)
	if ev.Outcome == throttle.Deferred || ev.Outcome == throttle.Suspended {
		s += fmt.Sprintf(" reason=%s delay=%v reserved=%v", ev.Reason, ev.Delay.Round(time.Millisecond), ev.Reserved)
	}
	if ev.Leased {
		s += " leased"
	}
	if ev.Cached {
		s += " cached"
	}
	if ev.Copied {
		s += " copied"
	}
	if ev.Latency > 0 {
		s += fmt.Sprintf(" latency=%v", ev.Latency.Round(10*time.Microsecond))
	}
	if ev.Err != nil {
		s += fmt.Sprintf(" err=%q", ev.Err.Error())
	}
	t.add("%s", s)
}

// dequeued is a middleware that records when asynq hands each task over,
// before any decision or pacing wait.
func (t *runTrace) dequeued(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		t.add("dequeued task=%s", id)
		return next.ProcessTask(ctx, task)
	})
}

// sample starts sampling key's state through l (and the raw hash at
// hashKey and the first reservation at resvKey through rdb) until the
// returned function is called, which also closes l.
func (t *runTrace) sample(l *throttle.Limiter, rdb *redis.Client, key, hashKey, resvKey string) func() {
	if t == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(traceEvery)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := l.Inspect(ctx, key)
			h, herr := rdb.HGetAll(ctx, hashKey).Result()
			first, ferr := rdb.ZRangeWithScores(ctx, resvKey, 0, 0).Result()
			cancel()
			if err != nil || herr != nil || ferr != nil {
				t.add("state error: %v %v %v", err, herr, ferr)
				continue
			}
			var raw []string
			for _, k := range sortedKeys(h) {
				if k != "L" && k != "D" {
					raw = append(raw, fmt.Sprintf("%s=%q", k, h[k]))
				}
			}
			next := "-"
			if len(first) > 0 {
				next = fmt.Sprintf("%s@%+.3fs", first[0].Member, time.UnixMicro(int64(first[0].Score)).Sub(t.start).Seconds())
			}
			t.add("state tokens=%.2f in_force=%v reservations=%d queued_for=%v suspended=%v first_resv=%s raw{%s}",
				st.Tokens, st.InForce, st.Reservations, st.QueuedFor.Round(time.Millisecond), st.SuspendedFor.Round(time.Millisecond),
				next, strings.Join(raw, " "))
		}
	})
	return func() {
		close(done)
		wg.Wait()
		_ = l.Close()
	}
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// write saves the trace, after a header and the provider's per-second
// counts, to dir/name.
func (t *runTrace) write(dir, name string, header []string) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	lines := append([]traceLine(nil), t.lines...)
	t.mu.Unlock()
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	var b strings.Builder
	for _, h := range header {
		b.WriteString("# " + h + "\n")
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "%+8.3fs %s\n", l.at.Seconds(), l.text)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
}
