package throttle_test

// TestPropertyMultiKey's units, refunds and Resume (issue 30), apart from
// the rest of its model (property_multikey_test.go):
//   - units: app, and w1 in some runs, have a tier of tokens beside their
//     requests (PerSecond(n).In("tokens")); w2 never does (a task's tokens
//     limit nothing there). Tasks say what they use (Uses("tokens", e))
//     and their handlers settle it (Used) below the estimate (a refund,
//     often of all of it), above it (a surcharge), or not at all; in a
//     handler run from a queue, a refund may bring booked tasks forward
//     (run now, as Limiter.forward runs them: a task of that key, still
//     waiting for the instant it was booked). The bound per key in tokens:
//     a bucket fed every call's estimate at its admission less what a
//     refund gave back, and every surcharge at its settlement, never goes
//     below empty at an admission (burst + rate x t in every span, the
//     largest burst and rate the tier had); a refund gives back 0 to what
//     was refunded, in each key on its own, and a settlement of tokens
//     changes no other tier;
//   - Resume of a key: the tasks it brings back (those holding a
//     reservation in it while suspended, those deferred by its suspension)
//     come back at once; the bound still holds, and one brought back that
//     is refused as holding an instant is not told to wait for the
//     suspension Resume ended when no key of it is queued that long.

import (
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// mkTokens is what the units part of the model keeps.
type mkTokens struct {
	keys     map[string]bool // the keys with a tier of tokens
	maxRate  map[string]float64
	maxBurst map[string]float64
	minRate  float64
	events   map[string][]*mkEvent
	seq      int
	handlers []*mkHandler // admitted tasks whose handler settles at its end
}

// mkEvent is what a key's tier of tokens counted: a call at its
// admission instant (its estimate, less what refunds gave back), or a
// surcharge at its settlement.
type mkEvent struct {
	at    time.Time
	seq   int
	units float64
	admit bool
	what  string
}

// mkHandler is an admitted task whose handler settles what it used.
type mkHandler struct {
	tk      *mkTask
	d       throttle.Decision
	ends    time.Time
	forward bool // run from a queue: a refund may bring booked tasks forward
	ev      map[string]*mkEvent
}

// mkResumed marks a task Resume brought back: the key and the end of the
// suspension it ended.
type mkResumed struct {
	key string
	end time.Time
	by  string // "" Resume; what else brought it back
}

const (
	mkMaxTokens = 100 // the most a task says it uses
	mkMaxMore   = 100 // the most a surcharge adds
)

func (m *mkModel) initTokens(t *rapid.T) {
	m.tok = &mkTokens{keys: map[string]bool{}, maxRate: map[string]float64{}, maxBurst: map[string]float64{},
		events: map[string][]*mkEvent{}, minRate: math.Inf(1)}
	if !rapid.Bool().Draw(t, "units") {
		return
	}
	m.tok.keys["app"] = true
	if rapid.Bool().Draw(t, "w1 units") {
		m.tok.keys["w1"] = true
	}
}

// tokensLimit is key's tier of tokens (none for a key without one), drawn
// anew at each SetLimits.
func (m *mkModel) tokensLimit(t *rapid.T, key string) []throttle.Limit {
	if !m.tok.keys[key] {
		return nil
	}
	rate := rapid.SampledFrom([]int{50, 80, 100, 200}).Draw(t, "token rate")
	burst := rapid.IntRange(mkMaxTokens, 3*mkMaxTokens).Draw(t, "token burst")
	m.tok.maxRate[key] = max(m.tok.maxRate[key], float64(rate))
	m.tok.maxBurst[key] = max(m.tok.maxBurst[key], float64(burst))
	m.tok.minRate = min(m.tok.minRate, float64(rate))
	return []throttle.Limit{throttle.PerSecond(rate).WithBurst(burst).In("tokens")}
}

// drawUses draws what a new task says it uses of tokens (0: no Uses) and
// what its handler settles (-1: no Used).
func (m *mkModel) drawUses(t *rapid.T, tk *mkTask) {
	tk.used = -1
	if len(m.tok.keys) == 0 {
		return
	}
	if rapid.IntRange(0, 3).Draw(t, "uses") > 0 {
		tk.tokens = rapid.OneOf(rapid.SampledFrom([]int{10, 40, mkMaxTokens}), rapid.IntRange(1, mkMaxTokens)).Draw(t, "tokens")
	}
	switch rapid.IntRange(0, 3).Draw(t, "used") {
	case 1: // a refund (often of all of it), or the estimate exactly
		tk.used = rapid.OneOf(rapid.Just(0), rapid.IntRange(0, tk.tokens)).Draw(t, "usedT")
	case 2: // a surcharge
		tk.used = tk.tokens + rapid.IntRange(1, mkMaxMore).Draw(t, "moreT")
	case 3:
		tk.used = tk.tokens
	}
}

func (tk *mkTask) uses() string {
	if tk.tokens == 0 {
		return ""
	}
	return "tokens=" + strconv.Itoa(tk.tokens)
}

// perTask is how long the slowest key may take per task in the drain: a
// second of requests, or a call's tokens with a surcharge's debt.
func (m *mkModel) perTask() time.Duration {
	if len(m.tok.keys) == 0 {
		return time.Second
	}
	return max(time.Second, time.Duration(float64(mkMaxTokens+mkMaxMore)/m.tok.minRate*float64(time.Second)))
}

// admitTokens counts an admitted task's estimate in its keys' tiers of
// tokens, checks their bound, and starts its handler.
func (m *mkModel) admitTokens(t *rapid.T, tk *mkTask, d throttle.Decision, at time.Time) {
	h := &mkHandler{tk: tk, d: d, ev: map[string]*mkEvent{},
		ends:    m.r.now.Add(time.Duration(rapid.IntRange(0, 2000).Draw(t, "handler")) * time.Millisecond),
		forward: rapid.Bool().Draw(t, "from a queue")}
	for _, k := range tk.keys {
		if m.tok.keys[k] && tk.tokens > 0 {
			h.ev[k] = m.addEvent(k, at, float64(tk.tokens), true, tk.id)
			m.checkTokens(t, k, at)
		}
	}
	if tk.used >= 0 && tk.used != tk.tokens {
		m.tok.handlers = append(m.tok.handlers, h)
	}
}

func (m *mkModel) addEvent(key string, at time.Time, units float64, admit bool, what string) *mkEvent {
	m.tok.seq++
	e := &mkEvent{at: at, seq: m.tok.seq, units: units, admit: admit, what: what}
	m.tok.events[key] = append(m.tok.events[key], e)
	return e
}

// checkTokens checks key's bound in tokens at its admissions from from on
// (one admitted ahead, paced, may complete a span of a later one): a
// bucket of the largest burst and rate the tier had, fed every call and
// the surcharges settled before the admission, is not below empty there
// (less decide.lua's HOLDER_SLACK of 1 us at the rate).
func (m *mkModel) checkTokens(t *rapid.T, key string, from time.Time) {
	evs := slices.Clone(m.tok.events[key])
	slices.SortStableFunc(evs, func(a, b *mkEvent) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	rate, burst := m.tok.maxRate[key], m.tok.maxBurst[key]
	for _, j := range evs {
		if !j.admit || j.at.Before(from) {
			continue
		}
		tok, last := burst, time.Time{}
		var in []string
		for _, e := range evs {
			if e.at.After(j.at) || (!e.admit && e.seq > j.seq) {
				continue
			}
			if !last.IsZero() {
				tok = min(burst, tok+rate*e.at.Sub(last).Seconds())
			}
			tok -= e.units
			last = e.at
			in = append(in, fmt.Sprintf("%s %g at %v", e.what, e.units, e.at.Sub(epoch())))
		}
		if tok < -1e-6-rate*1e-6 {
			t.Fatalf("key %s in tokens: the call of %s at %v leaves a bucket (burst %v, rate %v/s) fed these calls at %g: above burst + rate x t; the calls: %v",
				key, j.what, j.at.Sub(epoch()), burst, rate, tok, in[max(0, len(in)-12):])
		}
	}
}

// tokensOf reads key's tiers: the tokens of each (by position in its
// limits; a window's left out) and which is the tier of tokens (-1 none).
func (m *mkModel) tiersOf(t *rapid.T, key string) (map[int]float64, int) {
	st, err := m.r.lim.Inspect(m.r.ctx, key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	out, tier := map[int]float64{}, -1
	for i, l := range st.Limits {
		if l.Kind == throttle.KindWindow || l.Kind == throttle.KindInFlight || i >= len(st.Tokens) {
			continue
		}
		out[i] = st.Tokens[i]
		if l.Unit == "tokens" {
			tier = i
		}
	}
	return out, tier
}

// settleDue runs the settlements of the handlers ended by now (Used), in
// the order they end.
func (m *mkModel) settleDue(t *rapid.T) {
	slices.SortStableFunc(m.tok.handlers, func(a, b *mkHandler) int { return a.ends.Compare(b.ends) })
	for len(m.tok.handlers) > 0 && !m.tok.handlers[0].ends.After(m.r.now) {
		h := m.tok.handlers[0]
		m.tok.handlers = m.tok.handlers[1:]
		m.settle(t, h)
	}
}

func (m *mkModel) settle(t *rapid.T, h *mkHandler) {
	tk := h.tk
	before, tier := map[string]map[int]float64{}, map[string]int{}
	for _, k := range tk.keys {
		before[k], tier[k] = m.tiersOf(t, k)
	}
	var fw map[string][]throttle.Forwarded
	var err error
	if h.forward {
		fw, err = throttle.SettleKeys(m.r.lim, m.r.ctx, tk.keys, h.d, tk.uses(), "tokens", tk.used)
	} else {
		err = throttle.UsedKeys(m.r.lim, m.r.ctx, tk.keys, h.d, tk.uses(), "tokens", tk.used)
	}
	if err != nil {
		t.Fatalf("Used(tokens, %d) of %s %v: %v", tk.used, tk.id, tk.keys, err)
	}
	delta := float64(tk.used - tk.tokens)
	for _, k := range tk.keys {
		after, _ := m.tiersOf(t, k)
		for i, b := range before[k] {
			a, ok := after[i]
			if !ok {
				continue
			}
			if i != tier[k] {
				if math.Abs(a-b) > 1e-6 {
					t.Fatalf("Used(tokens, %d) of %s %v: key %s's tier %d of requests went from %g to %g tokens", tk.used, tk.id, tk.keys, k, i, b, a)
				}
				continue
			}
			if delta < 0 {
				g := a - b
				if g < -1e-6 || g > -delta+1e-6 {
					t.Fatalf("Used(tokens, %d) of %s %v (estimate %d): key %s's tier of tokens went from %g to %g, not a refund of 0 to %g",
						tk.used, tk.id, tk.keys, tk.tokens, k, b, a, -delta)
				}
				if e := h.ev[k]; e != nil && g > 1e-6 {
					e.units -= g
				}
			} else {
				m.addEvent(k, m.r.now, delta, false, tk.id+" (surcharge)")
			}
		}
	}
	// The tasks a refund brought forward run now (Limiter.forward: a task
	// whose key is the settling key, still due near the instant it held).
	for k, list := range fw {
		for _, f := range list {
			for _, w := range m.waiting {
				if w.id == f.ID && w.keys[0] == k && w.due.Sub(f.At).Abs() <= 2*time.Second {
					w.due = m.r.now
					w.resumed = &mkResumed{key: k, end: f.At, by: "a refund's forward"}
				}
			}
		}
	}
}

// forgetAhead leaves out of key's bounds, from now on, the calls admitted
// at an instant still ahead (paced) when its limits are set, as the
// combined model counts a tier's calls since its limits were set
// (property_model_world_test.go's checkBound): SetLimits carries the
// buckets' tokens over, brought up to date and clamped, but a raised rate
// repays the debt of such a call sooner than the call is made. (Found by
// a soak: on w2 at 2/s burst 1, a call admitted at 1.593 s for 2.093 s,
// SetLimits to 7/s at 1.672 s, and a call admitted at 2 s: two calls in
// 93 ms, above burst 1 + 7/s x t.)
func (m *mkModel) forgetAhead(key string) {
	now := m.r.now
	m.admitted[key] = slices.DeleteFunc(m.admitted[key], func(at time.Time) bool { return at.After(now) })
	m.tok.events[key] = slices.DeleteFunc(m.tok.events[key], func(e *mkEvent) bool { return e.admit && e.at.After(now) })
}

// nextSettlement is when the next handler settles (zero: none).
func (m *mkModel) nextSettlement() time.Time {
	var next time.Time
	for _, h := range m.tok.handlers {
		if next.IsZero() || h.ends.Before(next) {
			next = h.ends
		}
	}
	return next
}

// resume resumes a key (Limiter.Resume) and brings back the tasks it
// brings back (its Inspector's RunTask): those holding a reservation in
// the key while it is suspended, and those deferred by its suspension.
func (m *mkModel) resume(t *rapid.T) {
	k := mkKeys[rapid.IntRange(0, len(mkKeys)-1).Draw(t, "resume")]
	now := m.r.now
	var end time.Time
	for _, s := range m.susp[k] {
		if !now.Before(s[0]) && now.Before(s[1]) && s[1].After(end) {
			end = s[1]
		}
	}
	var held []string
	if !end.IsZero() && m.r.mr.Exists(throttle.DefaultPrefix+":{"+k+"}:r") {
		var err error
		if held, err = m.r.mr.ZMembers(throttle.DefaultPrefix + ":{" + k + "}:r"); err != nil {
			t.Fatalf("reservations of %s: %v", k, err)
		}
	}
	if _, err := m.r.lim.Resume(m.r.ctx, k); err != nil {
		t.Fatalf("Resume(%q): %v", k, err)
	}
	for i, s := range m.susp[k] {
		if s[1].After(now) {
			m.susp[k][i][1] = now
			if s[0].After(now) {
				m.susp[k][i][1] = s[0]
			}
		}
	}
	for _, w := range m.waiting {
		if slices.Contains(held, w.id) || (w.lastKey == k && w.lastReason == throttle.RefusedBySuspension) {
			w.due = now
			if !end.IsZero() {
				w.resumed = &mkResumed{key: k, end: end}
				if len(w.keys) > 1 {
					mkResumedMulti++
				}
			}
		}
	}
	m.comeBack(t)
}

// mkResumedMulti counts the tasks of several keys Resume brought back from
// a suspension, in every run (TestMultiKeyResumeHoldCase's guard).
var mkResumedMulti int

// checkResumed checks the first refusal of a task Resume brought back: held
// to an instant at or past the end of the suspension Resume ended, while
// no key of it is suspended, or queued, that long, it waits for nothing.
// The same for a task a refund brought forward, and the instant it held.
func (m *mkModel) checkResumed(t *rapid.T, tk *mkTask, d throttle.Decision, due time.Time) {
	rs := tk.resumed
	tk.resumed = nil
	if rs == nil || d.Reason != throttle.RefusedReserved || due.Before(rs.end) {
		return
	}
	now := m.r.now
	longest := time.Duration(0)
	for _, k := range tk.keys {
		st, err := m.r.lim.Inspect(m.r.ctx, k)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", k, err)
		}
		longest = max(longest, st.SuspendedFor, st.QueuedFor)
	}
	if now.Add(longest+m.perTask()+time.Second).Before(due) && rs.by != "" {
		t.Fatalf("%s in %s at %v brought %s %v forward from %v, but it is held (%+v) to %v: no key of it is suspended or queued past %v",
			rs.by, rs.key, now.Sub(epoch()), tk.id, tk.keys, rs.end.Sub(epoch()), d, due.Sub(epoch()), now.Add(longest).Sub(epoch()))
	}
	if now.Add(longest + m.perTask() + time.Second).Before(due) {
		t.Fatalf("Resume(%q) at %v ended a suspension until %v, but %s %v, brought back, is held (%+v) to %v: no key of it is suspended or queued past %v",
			rs.key, now.Sub(epoch()), rs.end.Sub(epoch()), tk.id, tk.keys, d, due.Sub(epoch()), now.Add(longest).Sub(epoch()))
	}
}

// The case TestPropertyMultiKey found (shrunk by rapid; its draws are in
// testdata/multikey/resume-hold.fail, replayed here): granule 1 s, app
// InFlight(1), w1 a window of 2 per 2 s, every key at 1/s; w2 suspended
// for 4.9 s, tasks of [w2 app] refused meanwhile book its end in w2 and
// hold it in app; Resume("w2") at 234 ms brings t10 back, and the hold in
// app (whose queue is open) held it to 9 s with no key queued past 5 s.
// Fails before the fix with "Resume("w2") at 234ms ended a suspension
// until 4.9s, but t10 [w2 app], brought back, is held ... to 9s". (The
// file is rapid's, then zeros: the fixed code draws more after t10, and
// the least of every draw ends the run. The draws are the model's as of
// this test: a change to what the model draws replays another case, which
// the guard on mkResumedMulti tells; shrink the failure anew, or rely on
// TestResumeDoesNotHoldATaskOfSeveralKeysToTheEndedSuspension.)
func TestMultiKeyResumeHoldCase(t *testing.T) {
	f := flag.Lookup("rapid.failfile")
	old := f.Value.String()
	require.NoError(t, f.Value.Set("testdata/multikey/resume-hold.fail"))
	defer func() { _ = f.Value.Set(old) }()
	defer withChecks(0)()
	before := mkResumedMulti
	checkMultiKey(t)
	require.Greater(t, mkResumedMulti, before, "the case replayed brings a task of several keys back with Resume: the model's draws changed since resume-hold.fail was found")
}
