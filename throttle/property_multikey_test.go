package throttle_test

// The property test of tasks of several keys (issue 30), in the style of
// the combined model (property_model_test.go), smaller: three keys, two
// workspaces under one app ("w1", "w2", "app"), each a token bucket whose
// limits SetLimits changes at random; tasks of [w1 app], [w2 app] (the
// decision across keys) and of [app] or [w1] alone (the one-key decision)
// arrive, are refused and come back at the instant they were told (rounded
// up to asynq's second when the granule is), holding their reservations;
// keys are suspended at random. The scripts run on miniredis: its TIME is
// the model's clock. After every step it checks:
//   - all or nothing: a refused decision of several keys leaves every key's
//     tokens as they were (Inspect), an admitted one took from each of its
//     keys;
//   - the bound per key: never more than burst + rate x t admitted in any
//     span ending with an admission (the largest burst and rate the key had),
//     and nothing while a suspension of the key is in force;
//   - liveness: in a drain at the end, with no new work, every task runs
//     within a deadline.
//
// Units (tiers of tokens, Uses and Used, refunds that bring booked tasks
// forward) and Resume are in property_multikey_units_test.go.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

type mkTask struct {
	id     string
	keys   []string
	due    time.Time
	tenant string // "" the default tenant (property_multikey_tenants_test.go)
	// tokens it says it uses (0 none) and its handler settles (-1 none),
	// the key and reason of its last refusal, and Resume's mark
	// (property_multikey_units_test.go)
	tokens, used int
	lastKey      string
	lastReason   throttle.Reason
	resumed      *mkResumed
}

type mkModel struct {
	r       *mkRig
	granule time.Duration
	horizon time.Duration
	waiting []*mkTask
	made    int
	// per key: admissions (the instant counted), the largest rate (per s)
	// and burst it had, and its suspensions
	admitted map[string][]time.Time
	maxRate  map[string]float64
	maxBurst map[string]float64
	susp     map[string][][2]time.Time
	// slots: app's InFlight limit (0 none); running: the admitted tasks
	// holding slots, until their handler ends
	slots   int
	running []mkRun
	// window: w1's sliding window of window calls per 2 s (0 none)
	window int
	// tiers of tokens, settlements (property_multikey_units_test.go)
	tok *mkTokens
}

const mkWindowPer = 2 * time.Second

type mkRun struct {
	key, slot string
	app       bool
	ends      time.Time
}

var mkKeys = []string{"w1", "w2", "app"}

func (m *mkModel) setLimits(t *rapid.T, key string) {
	rate := rapid.IntRange(1, 12).Draw(t, "rate")
	burst := rapid.IntRange(1, 2*rate).Draw(t, "burst")
	limits := []throttle.Limit{throttle.PerSecond(rate).WithBurst(burst)}
	if key == "app" && m.slots > 0 {
		limits = append(limits, throttle.InFlight(m.slots))
	}
	if key == "w1" && m.window > 0 {
		limits = append(limits, throttle.Window(m.window, mkWindowPer))
	}
	limits = append(limits, m.tokensLimit(t, key)...)
	if err := m.r.lim.SetLimits(m.r.ctx, key, limits...); err != nil {
		t.Fatalf("SetLimits(%q): %v", key, err)
	}
	m.forgetAhead(key)
	m.maxRate[key] = max(m.maxRate[key], float64(rate))
	m.maxBurst[key] = max(m.maxBurst[key], float64(burst))
}

// tokens reads what every key's buckets hold and its free slots (a
// window's count is left out: a reservation counts in it at its instant,
// as it should, refused or not).
func (m *mkModel) tokens(t *rapid.T) map[string][]float64 {
	out := map[string][]float64{}
	for _, k := range mkKeys {
		st, err := m.r.lim.Inspect(m.r.ctx, k)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", k, err)
		}
		for i, l := range st.Limits {
			if l.Kind != throttle.KindWindow && i < len(st.Tokens) {
				out[k] = append(out[k], st.Tokens[i])
			}
		}
	}
	return out
}

// decide decides task tk now; refused, it waits to come back when told.
func (m *mkModel) decide(t *rapid.T, tk *mkTask) {
	now := m.r.now
	var d throttle.Decision
	var err error
	if len(tk.keys) == 1 {
		d, err = m.reserveOne(tk)
	} else {
		before := m.tokens(t)
		d, err = m.reserveKeys(t, tk)
		if err == nil && !d.Allowed {
			if after := m.tokens(t); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("%s %v refused (%+v) but a key's tokens changed: %v -> %v", tk.id, tk.keys, d, before, after)
			}
			if !slices.Contains(tk.keys, d.Key) {
				t.Fatalf("%s %v refused by key %q, not one of its keys", tk.id, tk.keys, d.Key)
			}
		}
		if err == nil && d.Allowed && !slices.Equal(throttle.TookFrom(d), tk.keys) {
			t.Fatalf("%s %v admitted, taken from %v only", tk.id, tk.keys, throttle.TookFrom(d))
		}
	}
	if err != nil {
		t.Fatalf("decide %s %v: %v", tk.id, tk.keys, err)
	}
	if d.Allowed {
		at := throttle.AdmittedAt(d)
		if at.IsZero() {
			at = now
		}
		for _, k := range tk.keys {
			m.admitted[k] = append(m.admitted[k], at)
			m.checkBound(t, k)
		}
		m.admitTokens(t, tk, d, at)
		if d.Slot != "" {
			run := mkRun{key: tk.keys[0], slot: d.Slot, app: slices.Contains(tk.keys, "app"),
				ends: now.Add(time.Duration(rapid.IntRange(0, 2000).Draw(t, "runs")) * time.Millisecond)}
			m.running = append(m.running, run)
		}
		if m.slots > 0 {
			n := 0
			for _, r := range m.running {
				if r.app {
					n++
				}
			}
			if n > m.slots {
				t.Fatalf("%d tasks of app hold slots at %v: above InFlight(%d)", n, now.Sub(epoch()), m.slots)
			}
		}
		return
	}
	if d.RetryAfter <= 0 && !throttle.Reserved(d) {
		t.Fatalf("%s %v refused without a wait: %+v", tk.id, tk.keys, d)
	}
	// (a reservation at once, behind a slot held: back a moment later, as
	// the middleware's deferral brings it)
	due := now.Add(max(d.RetryAfter, time.Millisecond))
	if m.granule > 0 {
		// asynq brings a task back on a whole second, at or after its time
		if tr := due.Truncate(time.Second); tr.Before(due) {
			due = tr.Add(time.Second)
		}
	}
	tk.due = due
	tk.lastKey, tk.lastReason = cmp.Or(d.Key, tk.keys[0]), d.Reason
	m.checkResumed(t, tk, d, due)
	m.waiting = append(m.waiting, tk)
}

// checkBound checks key's admissions: within burst + rate x t of any
// earlier one, and none inside a suspension.
func (m *mkModel) checkBound(t *rapid.T, key string) {
	got := m.admitted[key]
	last := got[len(got)-1]
	for _, s := range m.susp[key] {
		if !last.Before(s[0]) && last.Before(s[1]) {
			t.Fatalf("key %s admitted at %v while suspended from %v to %v", key, last.Sub(epoch()), s[0].Sub(epoch()), s[1].Sub(epoch()))
		}
	}
	sorted := slices.Clone(got)
	slices.SortFunc(sorted, func(a, b time.Time) int { return a.Compare(b) })
	if key == "w1" && m.window > 0 {
		for i := range sorted {
			n := 0
			for j := i; j < len(sorted) && sorted[j].Sub(sorted[i]) < mkWindowPer; j++ {
				n++
			}
			if n > m.window {
				t.Fatalf("key w1 admitted %d calls in the %v from %v: above its window of %d", n, mkWindowPer, sorted[i].Sub(epoch()), m.window)
			}
		}
	}
	for i := range sorted {
		for j := i; j < len(sorted); j++ {
			// (+ 1 us at the rate: a holder at its reserved instant, whole
			// microseconds, is let through that short: decide.lua's
			// HOLDER_SLACK)
			bound := m.maxBurst[key] + m.maxRate[key]*(sorted[j].Sub(sorted[i]).Seconds()+1e-6)
			if float64(j-i+1) > bound+1e-6 {
				t.Fatalf("key %s admitted %d calls from %v to %v: above burst %v + rate %v/s x elapsed",
					key, j-i+1, sorted[i].Sub(epoch()), sorted[j].Sub(epoch()), m.maxBurst[key], m.maxRate[key])
			}
		}
	}
}

// finish ends the handlers due by now: each gives its slots back.
func (m *mkModel) finish(t *rapid.T) {
	m.settleDue(t)
	kept := m.running[:0]
	for _, r := range m.running {
		if r.ends.After(m.r.now) {
			kept = append(kept, r)
			continue
		}
		if err := m.r.lim.Release(m.r.ctx, r.key, r.slot); err != nil {
			t.Fatalf("Release(%q): %v", r.key, err)
		}
	}
	m.running = kept
}

// comeBack decides, in the order they are due, the tasks due by now.
func (m *mkModel) comeBack(t *rapid.T) {
	m.finish(t)
	slices.SortStableFunc(m.waiting, func(a, b *mkTask) int { return a.due.Compare(b.due) })
	var due []*mkTask
	for len(m.waiting) > 0 && !m.waiting[0].due.After(m.r.now) {
		due = append(due, m.waiting[0])
		m.waiting = m.waiting[1:]
	}
	for _, tk := range due {
		m.decide(t, tk)
	}
}

// mkRig is a rig for rapid: one miniredis, flushed for each run, and a
// new Limiter on it.
type mkRig struct {
	mr  *miniredis.Miniredis
	rdb *redis.Client
	lim *throttle.Limiter
	now time.Time
	ctx context.Context
}

func (r *mkRig) advance(d time.Duration) {
	r.now = r.now.Add(d)
	r.mr.SetTime(r.now)
	r.mr.FastForward(d)
}

func TestPropertyMultiKey(t *testing.T) {
	// (60 runs, about 20 s: each takes about 0.3 s of scripts in
	// miniredis; 10 under -race; -rapid.checks=2000 for a soak)
	defer withChecks(racedChecks(60))()
	checkMultiKey(t)
}

// newMkModel is a model on mr, its keys' limits set, its shape drawn: a
// granule or none, InFlight on app or none, a window on w1 or none, tiers
// of tokens or none. Its Limiter is untimed, as the combined model's: on
// a loaded machine a script in miniredis may take longer than
// WithTimeout's default second. The caller closes m.r.lim.
func newMkModel(t *rapid.T, mr *miniredis.Miniredis, rdb *redis.Client) *mkModel {
	r := &mkRig{mr: mr, rdb: rdb, lim: throttle.NewLimiter(rdb, throttle.WithTimeout(0)), now: epoch(), ctx: context.Background()}
	m := &mkModel{
		r:        r,
		horizon:  60 * time.Second,
		admitted: map[string][]time.Time{},
		maxRate:  map[string]float64{},
		maxBurst: map[string]float64{},
		susp:     map[string][][2]time.Time{},
	}
	if rapid.Bool().Draw(t, "granule") {
		m.granule = time.Second
	}
	if rapid.Bool().Draw(t, "inflight") {
		m.slots = rapid.IntRange(1, 3).Draw(t, "slots")
	}
	if rapid.Bool().Draw(t, "window") {
		m.window = rapid.IntRange(2, 10).Draw(t, "window calls")
	}
	m.initTokens(t)
	for _, k := range mkKeys {
		m.setLimits(t, k)
	}
	return m
}

// checkMultiKey checks the property (rapid.Check) on a miniredis of its
// own.
func checkMultiKey(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	rapid.Check(t, func(t *rapid.T) {
		mr.FlushAll()
		mr.SetTime(epoch())
		m := newMkModel(t, mr, rdb)
		defer m.r.lim.Close()
		sets := [][]string{{"w1", "app"}, {"w2", "app"}, {"app"}, {"w1"}}
		steps := rapid.IntRange(10, 120).Draw(t, "steps")
		for range steps {
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); {
			case op < 5:
				m.made++
				tk := &mkTask{id: fmt.Sprintf("t%d", m.made), keys: sets[rapid.IntRange(0, len(sets)-1).Draw(t, "set")]}
				m.drawUses(t, tk)
				m.decide(t, tk)
			case op < 8:
				m.r.advance(time.Duration(rapid.IntRange(0, 700).Draw(t, "ms")) * time.Millisecond)
				m.comeBack(t)
			case op == 8:
				k := mkKeys[rapid.IntRange(0, 2).Draw(t, "suspend")]
				d := time.Duration(rapid.IntRange(1, 50).Draw(t, "for")) * 100 * time.Millisecond
				if err := m.r.lim.Suspend(m.r.ctx, k, d); err != nil {
					t.Fatalf("Suspend(%q): %v", k, err)
				}
				m.susp[k] = append(m.susp[k], [2]time.Time{m.r.now, m.r.now.Add(d)})
			case op == 9:
				m.setLimits(t, mkKeys[rapid.IntRange(0, 2).Draw(t, "setLimits")])
			default:
				m.resume(t)
			}
		}
		// Drain: no new work; every task runs within the deadline (the
		// tasks at the slowest rate any key can have, after the horizon
		// and the longest suspension).
		deadline := m.r.now.Add(m.horizon + 5*time.Second + time.Duration(len(m.waiting)+1)*m.perTask())
		for len(m.waiting) > 0 {
			slices.SortStableFunc(m.waiting, func(a, b *mkTask) int { return a.due.Compare(b.due) })
			next := m.waiting[0].due
			for _, r := range m.running {
				if r.ends.Before(next) {
					next = r.ends
				}
			}
			if s := m.nextSettlement(); !s.IsZero() && s.Before(next) {
				next = s
			}
			if next.After(deadline) {
				t.Fatalf("liveness: %d tasks still waiting at %v (deadline %v), the next due at %v: %v",
					len(m.waiting), m.r.now.Sub(epoch()), deadline.Sub(epoch()), next.Sub(epoch()), m.waiting[0])
			}
			if next.After(m.r.now) {
				m.r.advance(next.Sub(m.r.now))
			}
			m.comeBack(t)
		}
	})
}
