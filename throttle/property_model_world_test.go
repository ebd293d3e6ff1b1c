package throttle_test

// The combined model's world (property_model_test.go): the library on
// miniredis, with asynq around it (waiting tasks brought back at their
// told times, handlers running, renewing their slots and settling what
// they used), and the checks made after every step.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// mTierID names a rate tier as the scripts do: its kind, period and unit.
type mTierID struct {
	kind  throttle.Kind
	perUS int64
	unit  string
}

func tierIDOf(l throttle.Limit) mTierID {
	return mTierID{kind: l.Kind, perUS: l.Per.Microseconds(), unit: l.Unit}
}

func (id mTierID) String() string {
	u := ""
	if id.unit != "" {
		u = " in " + id.unit
	}
	if id.kind == throttle.KindWindow {
		return fmt.Sprintf("window of %v%s", time.Duration(id.perUS)*time.Microsecond, u)
	}
	return fmt.Sprintf("bucket per %v%s", time.Duration(id.perUS)*time.Microsecond, u)
}

// mParams are a tier's numbers: a bucket's rate per period and burst, a
// window's n.
type mParams struct{ rate, burst, n int64 }

func paramsOf(l throttle.Limit) mParams {
	if l.Kind == throttle.KindWindow {
		return mParams{n: int64(l.N)}
	}
	b := l.Burst
	if b == 0 {
		b = l.N
	}
	return mParams{rate: int64(l.N), burst: int64(b)}
}

// mEvent is what a tier counted: a call (admit) at the instant its handler
// starts, with its cost less what a refund gave back, or a surcharge at its
// settlement.
type mEvent struct {
	at    int64
	seq   int64
	units float64
	admit bool
	what  string
}

// mLearned is a quota learned from the provider, in force from from to
// until.
type mLearned struct {
	p           mParams
	from, until int64
	seq         int64 // the events after it
}

// mTier is the log of one tier: its events, the configured numbers since
// they were set, and the quotas learned.
type mTier struct {
	id      mTierID
	p       mParams
	since   int64 // the numbers are in force since then,
	seq     int64 // for the events after this one
	live    bool  // in the limits now
	events  []*mEvent
	learned []*mLearned
}

// mTask is a task in the model's asynq: waiting (told to come back at
// back) or running.
type mTask struct {
	id, tenant   string
	n, tokens    int
	usedN, usedT int
	run, lag     int64
	lim          int
	via          string // opArrive (the middleware's) or opEnqueue
	back         int64  // when asynq hands it to a worker (us)
	reason       throttle.Reason
	resv         int64 // its reserved instant, as Redis should hold it (0 none)
	probe        bool  // waiting in its worker for a slot in flight
	waited       int64
	nearWaited   int64 // waited in its worker to ask again near its paced instant
	decisions    int
}

func (k *mTask) uses() string {
	if k.tokens == 0 {
		return ""
	}
	return "tokens=" + strconv.Itoa(k.tokens)
}

func (k *mTask) cost(unit string) int {
	if unit == "" {
		return k.n
	}
	return k.tokens
}

func (k *mTask) String() string {
	t := k.tenant
	if t == "" {
		t = "(default)"
	}
	lim := ""
	if k.lim == 1 {
		lim = ", Limiter B"
	}
	return fmt.Sprintf("%s of tenant %s (cost %d, tokens %d, via %s%s)", k.id, t, k.n, k.tokens, k.via, lim)
}

// mRun is a handler running (or a direct caller's call under way).
type mRun struct {
	task    *mTask
	d       throttle.Decision
	lim     int
	start   int64
	end     int64
	renew   int64
	slot    string
	charged map[string]int
	ev      map[mTierID]*mEvent
}

// mFailer is what the model needs of *testing.T and *rapid.T.
type mFailer interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	FailNow()
}

// modelWorld is the model: the library on miniredis and asynq around it.
type modelWorld struct {
	t     mFailer
	mr    *miniredis.Miniredis
	ctx   context.Context
	lims  [2]*throttle.Limiter
	slotX [2]int64
	shape modelShape
	start int64
	now   int64
	seq   int64

	limits   []throttle.Limit // configured (SetLimits, or the defaults)
	inflight int
	tiers    map[mTierID]*mTier
	waiting  []*mTask
	running  []*mRun
	nextID   int
	susp     int64            // suspended until (us), 0 none
	booked   int64            // the latest instant any booking was made for
	dropped  []*mTask         // tasks deleted from asynq while booked, since the last drain
	bookings map[string]int64 // every reservation told, by task ID
	released map[string]bool  // bookings given up (an enqueue asynq refused)
	weights  map[string]int   // set by SetWeights
	trail    []string         // what happened lately, for messages
	skip     map[string]bool  // checks THROTTLE_MODEL_OPS leaves out ("-lapse")
	debug    bool             // THROTTLE_MODEL_DUMP: log the key's storage at each decision and SetWeights
}

func newModelWorld(t mFailer, mr *miniredis.Miniredis, rdb *redis.Client, sh modelShape) *modelWorld {
	t.Helper()
	w := &modelWorld{
		t: t, mr: mr, ctx: context.Background(), shape: sh, tiers: map[mTierID]*mTier{},
		bookings: map[string]int64{}, released: map[string]bool{}, slotX: [2]int64{modelSlotA, modelSlotB},
		skip: modelSkips(), debug: os.Getenv("THROTTLE_MODEL_DUMP") != "",
	}
	w.start = epoch().UnixMicro()
	w.now = w.start
	mr.SetTime(time.UnixMicro(w.now))
	quiet := throttle.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	// No bound of the Limiters' own on a call: the model checks what the
	// scripts decide, and a call that a loaded machine (the suite beside a
	// CPU hog) delays past WithTimeout's default second would be a Redis
	// error the model does not expect.
	untimed := throttle.WithTimeout(0)
	optsA := []throttle.Option{quiet, untimed}
	optsB := []throttle.Option{quiet, untimed, throttle.WithSlotExpiry(time.Duration(modelSlotB) * time.Microsecond)}
	if sh.Defaults {
		optsA = append(optsA, throttle.WithDefaultLimits(sh.Limits...))
		optsB = append(optsB, throttle.WithDefaultLimits(sh.Limits...))
	}
	w.lims[0] = throttle.NewLimiter(rdb, optsA...)
	w.lims[1] = throttle.NewLimiter(rdb, optsB...)
	if !sh.Defaults {
		require.NoError(t, w.lims[0].SetLimits(w.ctx, modelKey, sh.Limits...), "SetLimits(%v)", sh.Limits)
	}
	w.configure(sh.Limits)
	w.note("start: %#v", sh)
	return w
}

func (w *modelWorld) close() {
	_ = w.lims[0].Close()
	_ = w.lims[1].Close()
}

// at formats an instant for messages.
func (w *modelWorld) at(us int64) string {
	return "epoch+" + (time.Duration(us-w.start) * time.Microsecond).String()
}

func (w *modelWorld) note(format string, args ...any) {
	w.trail = append(w.trail, w.at(w.now)+": "+fmt.Sprintf(format, args...))
	if n := modelTrail(); len(w.trail) > n {
		w.trail = w.trail[len(w.trail)-n:]
	}
}

// modelTrail is how many lines of what happened a failure shows (30, or
// THROTTLE_MODEL_TRAIL).
func modelTrail() int {
	if n, err := strconv.Atoi(os.Getenv("THROTTLE_MODEL_TRAIL")); err == nil && n > 0 {
		return n
	}
	return 30
}

func (w *modelWorld) failf(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("%s: %s\nlately:\n  %s", w.at(w.now), fmt.Sprintf(format, args...), strings.Join(w.trail, "\n  "))
}

// configure makes limits the configured ones: a tier whose numbers change
// (or that is new) is checked from now on.
func (w *modelWorld) configure(limits []throttle.Limit) {
	w.limits = limits
	w.inflight = 0
	was := map[mTierID]bool{}
	for id, tr := range w.tiers {
		was[id] = tr.live
		tr.live = false
	}
	for _, l := range limits {
		if l.Kind == throttle.KindInFlight {
			w.inflight = l.N
			continue
		}
		id := tierIDOf(l)
		tr := w.tiers[id]
		if tr == nil {
			tr = &mTier{id: id, since: w.now}
			w.tiers[id] = tr
		}
		// (A tier dropped and set again starts afresh, as one whose numbers
		// changed: its state was dropped or clamped.)
		if p := paramsOf(l); tr.p != p || !was[id] {
			tr.p, tr.since, tr.seq = p, w.now, w.seq
		}
		tr.live = true
	}
}

// rateTiers are the tiers in force, in the order of the limits.
func (w *modelWorld) rateTiers() []*mTier {
	var out []*mTier
	for _, l := range w.limits {
		if l.Kind != throttle.KindInFlight {
			out = append(out, w.tiers[tierIDOf(l)])
		}
	}
	return out
}

// setClock moves Redis TIME and key expiry to us.
func (w *modelWorld) setClock(us int64) {
	if us < w.now {
		w.failf("model: the clock may not step back (to %s)", w.at(us))
	}
	d := us - w.now
	w.now = us
	w.mr.SetTime(time.UnixMicro(us))
	if d > 0 {
		w.mr.FastForward(time.Duration(d) * time.Microsecond)
	}
}

// inspect reads the key's status.
func (w *modelWorld) inspect() throttle.Status {
	w.t.Helper()
	s, err := w.lims[0].Inspect(w.ctx, modelKey)
	if err != nil {
		w.failf("Inspect: %v", err)
	}
	return s
}

// tokens returns each rate tier's tokens in s, by tier.
func tokensOf(s throttle.Status) map[mTierID]float64 {
	out := map[mTierID]float64{}
	for i, l := range s.Limits {
		if l.Kind != throttle.KindInFlight && l.Kind != throttle.KindAdaptive && i < len(s.Tokens) {
			out[tierIDOf(l)] = s.Tokens[i]
		}
	}
	return out
}

// --- the ops ---

func (w *modelWorld) do(op modelOp) {
	w.t.Helper()
	switch op.Kind {
	case opArrive, opEnqueue, opDup, opTake:
		w.nextID++
		k := &mTask{
			id: fmt.Sprintf("t%d", w.nextID), tenant: op.Tenant, n: max(op.N, 1), tokens: op.Tokens,
			usedN: op.UsedN, usedT: op.UsedT, run: op.Run * 1000, lag: op.Lag * 1000, lim: op.Lim, via: op.Kind,
		}
		if op.Kind == opDup || op.Kind == opEnqueue {
			k.lim = 0 // (the enqueuing process's)
		}
		switch op.Kind {
		case opArrive:
			w.note("%s arrives", k)
			w.decide(k, false)
		case opEnqueue:
			w.enqueue(k)
		case opDup:
			w.dup(k)
		case opTake:
			w.take(k)
		}
	case opDrop:
		var pool []*mTask
		for _, k := range w.waiting {
			if !k.probe {
				pool = append(pool, k)
			}
		}
		if len(pool) == 0 {
			return
		}
		k := pool[op.Pick%len(pool)]
		w.waiting = slices.DeleteFunc(w.waiting, func(x *mTask) bool { return x == k })
		if k.resv != 0 {
			w.dropped = append(w.dropped, k)
		}
		w.note("%s is deleted from asynq (booked at %s): it never comes back", k, w.at(k.resv))
	case opStep:
		w.note("step %v", time.Duration(op.D)*time.Millisecond)
		w.advanceTo(w.now + op.D*1000)
	case opSetLimits:
		if w.shape.Defaults {
			return // (a key of default limits stays one)
		}
		w.setLimits(op.Limits)
	case opWeights:
		var m map[string]int
		if len(op.Weight) > 0 {
			m = op.Weight
		}
		require.NoError(w.t, w.lims[0].SetWeights(w.ctx, modelKey, m), "SetWeights(%v)", m)
		w.weights = m
		w.note("SetWeights(%v)", m)
		if w.debug {
			w.dump()
		}
	case opSuspend:
		d := op.D * 1000
		require.NoError(w.t, w.lims[op.Lim].Suspend(w.ctx, modelKey, time.Duration(d)*time.Microsecond), "Suspend")
		w.susp = max(w.susp, w.now+min(d, modelMaxSusp))
		w.note("Suspend(%v) by Limiter %d: suspended until %s", time.Duration(d)*time.Microsecond, op.Lim, w.at(w.susp))
	case opResume:
		w.resume()
	case opObserve:
		w.observe(op)
	case opDrain:
		w.drain()
	default:
		w.failf("model: unknown op %q", op.Kind)
	}
	w.checkState()
}

// decide is the middleware's decision for task k (back from asynq, or
// dequeued for the first time), and what it does with it: run it (after
// the paced wait), wait in the worker for a slot expected free, or defer
// it to come back as asynq brings it back.
func (w *modelWorld) decide(k *mTask, fromPool bool) {
	w.t.Helper()
	l := w.lims[k.lim]
	before, held := w.inspect(), w.holds(k.id)
	var d throttle.Decision
	var err error
	if k.probe {
		d, err = throttle.ProbeTask(l, w.ctx, modelKey, k.id, k.tenant, k.n, k.uses())
	} else {
		d, err = throttle.DecideTask(l, w.ctx, modelKey, k.id, k.tenant, k.n, k.uses())
	}
	k.decisions++
	if w.debug {
		w.dump()
	}
	if fromPool {
		w.waiting = slices.DeleteFunc(w.waiting, func(x *mTask) bool { return x == k })
	}
	if errors.Is(err, throttle.ErrCostTooHigh) {
		// The middleware fails it for good (asynq archives it).
		w.note("%s refused for good: %v", k, err)
		return
	}
	if err != nil {
		w.failf("decision of %s: %v", k, err)
	}
	w.checkAllOrNothing(before, held, d, k, fmt.Sprintf("the decision of %s by Limiter %d", k, k.lim))
	if d.Allowed {
		wait := throttle.PacedWait(d).Microseconds()
		start := w.now + min(wait, throttle.MaxPaceWait.Microseconds())
		w.note("%s admitted (wait %v, counted at %s, starts at %s, slot %q)", k, time.Duration(wait)*time.Microsecond,
			w.at(throttle.AdmittedAt(d).UnixMicro()), w.at(start), d.Slot)
		w.admit(k, d, start)
		return
	}
	probed := k.probe
	k.probe = false
	if !probed && throttle.NearRefusal(d) {
		// decideAndWait: a paced task told to wait for its instant (it
		// asked as one that waits, near) waits in its worker and asks
		// again, a paced wait at most, MaxNearWait in all.
		p := d.RetryAfter.Microseconds()
		if p <= throttle.MaxPaceWait.Microseconds() && k.nearWaited+p <= throttle.MaxNearWait.Microseconds() {
			k.nearWaited, k.back = k.nearWaited+p, w.now+p
			w.waiting = append(w.waiting, k)
			w.note("%s waits %v in its worker for its paced instant", k, time.Duration(p)*time.Microsecond)
			return
		}
	}
	if d.Reason == throttle.RefusedBySlots {
		// decideAndWait: a slot expected free within a second is waited
		// for in the worker, asking again with its place kept.
		p := max(d.RetryAfter, throttle.MinSlotPoll).Microseconds()
		if k.waited+p <= throttle.MaxSlotWait.Microseconds() {
			k.probe, k.waited, k.back = true, k.waited+p, w.now+p
			w.waiting = append(w.waiting, k)
			w.note("%s waits %v in its worker for a slot", k, time.Duration(p)*time.Microsecond)
			return
		}
	}
	k.waited, k.nearWaited = 0, 0
	k.reason = d.Reason
	k.resv = 0
	if throttle.Reserved(d) {
		k.resv = throttle.ReservedAt(d).UnixMicro()
		w.book(k.id, k.resv)
	}
	// deferDelay, then asynq: a delay scored in whole seconds.
	at := throttle.ReservedAt(d).UnixMicro()
	var back int64
	switch {
	case d.Reason == throttle.RefusedBySlots:
		back = floorSec(w.now + d.RetryAfter.Microseconds())
	case throttle.Reserved(d) && at%modelSecond != 0:
		back = floorSec(at) // paced: the worker waits for the instant
	case throttle.Reserved(d):
		back = ceilSec(at)
	default:
		back = ceilSec(w.now + d.RetryAfter.Microseconds())
	}
	if back <= w.now {
		back = w.now + modelForward // (retried at once: the forwarder's next tick)
	}
	k.back = back
	w.waiting = append(w.waiting, k)
	told := "not reserved"
	if throttle.Reserved(d) {
		told = "reserved at " + w.at(at)
	}
	w.note("%s refused (%v, retry after %v, %s): back at %s", k, d.Reason, d.RetryAfter, told, w.at(back))
	if k.decisions > 1000 {
		w.failf("liveness: %s decided %d times and never admitted", k, k.decisions)
	}
}

func floorSec(us int64) int64 { return us - ((us%modelSecond)+modelSecond)%modelSecond }

func ceilSec(us int64) int64 {
	if f := floorSec(us); f < us {
		return f + modelSecond
	}
	return us
}

// dump logs what the key holds in Redis (binary fields as numbers).
func (w *modelWorld) dump() {
	b := w.keyName("b")
	fields, _ := w.mr.HKeys(b)
	out := ""
	for _, f := range fields {
		v := w.mr.HGet(b, f)
		if f == "G" || f == "T" || f == "V" || f == "M" || strings.HasPrefix(f, "t:") {
			var xs []float64
			for i := 0; i+8 <= len(v); i += 8 {
				xs = append(xs, math.Float64frombits(uint64(v[i])|uint64(v[i+1])<<8|uint64(v[i+2])<<16|uint64(v[i+3])<<24|uint64(v[i+4])<<32|uint64(v[i+5])<<40|uint64(v[i+6])<<48|uint64(v[i+7])<<56))
			}
			out += fmt.Sprintf(" %s=%v", f, xs)
		} else {
			out += fmt.Sprintf(" %s=%q", f, v)
		}
	}
	for _, part := range []string{"r", "t", "a", "f"} {
		ids, _ := w.mr.ZMembers(w.keyName(part))
		var sc []string
		for _, id := range ids {
			x, _ := w.mr.ZScore(w.keyName(part), id)
			sc = append(sc, fmt.Sprintf("%s:%.17g", id, x))
		}
		out += fmt.Sprintf(" :%s=%v", part, sc)
	}
	w.t.Logf("%s state:%s", w.at(w.now), out)
}

// holds reports whether task id holds a reservation in Redis.
func (w *modelWorld) holds(id string) bool {
	_, err := w.mr.ZScore(w.keyName("r"), id)
	return err == nil
}

// book records a reservation told for id.
func (w *modelWorld) book(id string, at int64) {
	w.bookings[id] = at
	w.booked = max(w.booked, at)
}

// enqueue is Limiter.Enqueue: a booking, then asynq holds the task until
// its reserved time (ProcessIn), or, not reserved, it is pending now.
func (w *modelWorld) enqueue(k *mTask) {
	w.t.Helper()
	before, held := w.inspect(), w.holds(k.id)
	d, err := throttle.BookTask(w.lims[0], w.ctx, modelKey, k.id, k.tenant, k.n, k.uses())
	if errors.Is(err, throttle.ErrCostTooHigh) {
		w.note("Enqueue(%s) refused: %v", k, err)
		return
	}
	if err != nil {
		w.failf("Enqueue's decision of %s: %v", k, err)
	}
	w.checkAllOrNothing(before, held, d, k, fmt.Sprintf("Enqueue's booking of %s", k))
	if d.Allowed {
		w.failf("Enqueue's booking of %s took its tokens: %+v", k, d)
	}
	k.back = w.now
	if throttle.Reserved(d) {
		k.resv = throttle.ReservedAt(d).UnixMicro()
		w.book(k.id, k.resv)
		k.back = w.now + throttle.EnqueueDelay(w.lims[0], throttle.ReservedAt(d), time.UnixMicro(w.now)).Microseconds()
		k.back = floorSec(k.back) // (asynq scores ProcessIn in whole seconds)
		if k.back < w.now {
			k.back = w.now
		}
	}
	w.waiting = append(w.waiting, k)
	w.note("Enqueue(%s): reserved %v at %s, scheduled for %s", k, throttle.Reserved(d), w.at(k.resv), w.at(k.back))
}

// dup is Enqueue of a duplicate: the booking is made, asynq refuses the
// task, Enqueue releases the booking.
func (w *modelWorld) dup(k *mTask) {
	w.t.Helper()
	before, held := w.inspect(), w.holds(k.id)
	d, err := throttle.BookTask(w.lims[0], w.ctx, modelKey, k.id, k.tenant, k.n, k.uses())
	if errors.Is(err, throttle.ErrCostTooHigh) {
		return
	}
	if err != nil {
		w.failf("Enqueue's decision of duplicate %s: %v", k, err)
	}
	w.checkAllOrNothing(before, held, d, k, fmt.Sprintf("Enqueue's booking of duplicate %s", k))
	if !throttle.Reserved(d) {
		w.note("Enqueue(duplicate %s): not reserved, asynq refuses it", k)
		return
	}
	w.book(k.id, throttle.ReservedAt(d).UnixMicro())
	throttle.EnqueueRefused(w.lims[0], w.ctx, modelKey, k.id, k.tenant, k.n, k.uses())
	w.released[k.id] = true
	w.note("Enqueue(duplicate %s) booked %s; asynq refuses it as a duplicate, the booking is released", k, w.at(throttle.ReservedAt(d).UnixMicro()))
}

// take is a direct caller's Take; admitted, its call holds its slot (if
// any) for its run.
func (w *modelWorld) take(k *mTask) {
	w.t.Helper()
	opts := []asynq.Option{throttle.Cost(k.n)}
	if k.tokens > 0 {
		opts = append(opts, throttle.Uses("tokens", k.tokens))
	}
	if k.tenant != "" {
		opts = append(opts, throttle.Tenant(k.tenant))
	}
	before, held := w.inspect(), w.holds(k.id)
	d, err := w.lims[k.lim].Take(w.ctx, modelKey, opts...)
	if errors.Is(err, throttle.ErrCostTooHigh) {
		return
	}
	if err != nil {
		w.failf("Take(%s): %v", k, err)
	}
	w.checkAllOrNothing(before, held, d, k, fmt.Sprintf("Take(%s) by Limiter %d", k, k.lim))
	if !d.Allowed {
		w.note("Take(%s) refused: %v, retry after %v", k, d.Reason, d.RetryAfter)
		return
	}
	w.note("Take(%s) admitted (slot %q)", k, d.Slot)
	k.usedN, k.usedT = -1, -1 // (a direct caller settles nothing)
	w.admit(k, d, w.now)
}

// admit records an admitted call: its events on every tier of its units,
// its slot, its run; and checks the bound and the slots.
func (w *modelWorld) admit(k *mTask, d throttle.Decision, start int64) {
	w.t.Helper()
	if w.susp > w.now {
		w.failf("suspension: %s admitted while the key is suspended until %s", k, w.at(w.susp))
	}
	r := &mRun{task: k, d: d, lim: k.lim, start: start, end: start + k.run, slot: d.Slot,
		charged: map[string]int{"": k.n, "tokens": k.tokens}, ev: map[mTierID]*mEvent{}}
	for _, tr := range w.rateTiers() {
		c := k.cost(tr.id.unit)
		if c == 0 {
			continue
		}
		r.ev[tr.id] = w.addEvent(tr, start, float64(c), true, k.id)
	}
	if d.Slot != "" {
		r.renew = w.now + w.slotX[k.lim]/3
		held := 1
		for _, o := range w.running {
			if o.slot != "" {
				held++
			}
		}
		if w.inflight > 0 && held > w.inflight {
			w.failf("InFlight(%d): %s admitted with slot %q while %d other handlers hold one: %d at once", w.inflight, k, d.Slot, held-1, held)
		}
	} else if w.inflight > 0 {
		w.failf("InFlight(%d): %s admitted without a slot", w.inflight, k)
	}
	w.running = append(w.running, r)
	for _, tr := range w.rateTiers() {
		w.checkBound(tr, start)
	}
}

// addEvent logs units at the instant at on tier tr.
func (w *modelWorld) addEvent(tr *mTier, at int64, units float64, admit bool, what string) *mEvent {
	w.seq++
	e := &mEvent{at: at, seq: w.seq, units: units, admit: admit, what: what}
	tr.events = append(tr.events, e)
	return e
}

// checkBound checks tier tr's bound at its admissions at or after from
// (an admission may be counted ahead of now, paced, so a later one at an
// earlier instant can complete its span): under the configured numbers
// since they were set, and under each quota learned while it is in
// force. An admission is checked against the calls at every instant and
// the surcharges settled before it was decided: a surcharge settled after
// a call was admitted ahead puts the bucket into debt, which is allowed.
func (w *modelWorld) checkBound(tr *mTier, from int64) {
	w.t.Helper()
	evs := slices.Clone(tr.events)
	slices.SortFunc(evs, func(a, b *mEvent) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return int(a.seq - b.seq)
	})
	check := func(j *mEvent, p mParams, lo, hi, seq int64, label string) {
		var in []*mEvent
		for _, e := range evs {
			if e.at >= lo && e.at < hi && e.seq > seq && e.at <= j.at && (e.admit || e.seq < j.seq) {
				in = append(in, e)
			}
		}
		if tr.id.kind == throttle.KindWindow {
			sum := 0.0
			first := len(in)
			for i, e := range in {
				if e.at > j.at-tr.id.perUS {
					sum += e.units
					first = min(first, i)
				}
			}
			if sum > float64(p.n)+modelEps {
				w.failf("bound: %s (%s): %g units in the window (%s, %s] ending with the call of %s, more than n = %d; the calls: %s", tr.id, label, sum,
					w.at(j.at-tr.id.perUS), w.at(j.at), j.what, p.n, w.eventsStr(in[first:]))
			}
			return
		}
		tok, last := float64(p.burst), lo
		for _, e := range in {
			tok = math.Min(float64(p.burst), tok+float64(p.rate)*float64(e.at-last)/float64(tr.id.perUS)) - e.units
			last = e.at
		}
		if tok < -modelEps {
			w.failf("bound: %s (%s, rate %d burst %d): the call of %s at %s leaves a bucket fed these calls at %g: more than burst + rate x t in a span ending there; the calls: %s",
				tr.id, label, p.rate, p.burst, j.what, w.at(j.at), tok, w.eventsStr(in))
		}
	}
	for _, j := range evs {
		if !j.admit || j.at < from {
			continue
		}
		if j.seq > tr.seq {
			check(j, tr.p, tr.since, math.MaxInt64, tr.seq, "configured")
		}
		for _, lr := range tr.learned {
			if lr.from <= j.at && j.at < lr.until && j.seq > lr.seq {
				check(j, lr.p, lr.from, lr.until, lr.seq, fmt.Sprintf("learned at %s, in force until %s", w.at(lr.from), w.at(lr.until)))
			}
		}
	}
}

func (w *modelWorld) eventsStr(evs []*mEvent) string {
	if len(evs) > 12 {
		evs = evs[len(evs)-12:]
	}
	parts := make([]string, len(evs))
	for i, e := range evs {
		kind := "call"
		if !e.admit {
			kind = "surcharge"
		}
		parts[i] = fmt.Sprintf("%s %s %g at %s", kind, e.what, e.units, w.at(e.at))
	}
	return strings.Join(parts, "; ")
}

// checkAllOrNothing compares the tokens Inspect showed before decision d
// of task k (held: its ID held a reservation) with those after: a refusal changes no tier (a window's
// reserved calls aside), an admission at now takes the cost from every
// tier of its units and nothing from the others.
func (w *modelWorld) checkAllOrNothing(before throttle.Status, held bool, d throttle.Decision, k *mTask, call string) {
	w.t.Helper()
	after := w.inspect()
	b, a := tokensOf(before), tokensOf(after)
	for id, tb := range b {
		ta, ok := a[id]
		if !ok {
			continue
		}
		c := float64(k.cost(id.unit))
		switch {
		case !d.Allowed && id.kind == throttle.KindWindow:
			if !throttle.Reserved(d) && !held && math.Abs(ta-tb) > modelEps {
				w.failf("all or nothing: %s was refused (%v) but the %s went from %g to %g", call, d.Reason, id, tb, ta)
			}
		case !d.Allowed:
			if math.Abs(ta-tb) > modelEps {
				w.failf("all or nothing: %s was refused (%v) but the %s went from %g to %g tokens", call, d.Reason, id, tb, ta)
			}
		case c == 0:
			if math.Abs(ta-tb) > modelEps {
				w.failf("all or nothing: %s uses none of the %s's unit, yet its tokens went from %g to %g", call, id, tb, ta)
			}
		case throttle.PacedWait(d) == 0:
			if id.kind == throttle.KindWindow && (tb < c-modelEps || held) {
				continue // (a surcharge's debt shows as 0; a holder's reserved calls were counted)
			}
			if math.Abs((tb-ta)-c) > modelEps {
				w.failf("all or nothing: %s was admitted with a cost of %g, but the %s went from %g to %g tokens", call, c, id, tb, ta)
			}
		case id.kind != throttle.KindWindow:
			if tb-ta < c-modelEps {
				w.failf("all or nothing: %s was admitted ahead with a cost of %g, but the %s went from %g to %g tokens", call, c, id, tb, ta)
			}
		}
	}
}

// --- asynq around the library: the event loop ---

// nextEvent returns the next thing to happen, and when (ok false: none).
// Renewals first, then handlers ending, then tasks coming back (in the
// order asynq hands them out: time, then ID).
func (w *modelWorld) nextEvent() (at int64, run func(), ok bool) {
	best := int64(math.MaxInt64)
	var fn func()
	bestRank, bestID := 9, ""
	consider := func(t int64, r int, id string, f func()) {
		if t < best || (t == best && (r < bestRank || (r == bestRank && id < bestID))) {
			best, bestRank, bestID, fn = t, r, id, f
		}
	}
	for _, r := range w.running {
		r := r
		if r.slot != "" && r.renew < r.end {
			consider(r.renew, 0, r.task.id, func() { w.renewSlot(r) })
		}
		consider(r.end, 1, r.task.id, func() { w.finish(r) })
	}
	for _, k := range w.waiting {
		k := k
		consider(k.back+k.lag, 2, k.id, func() { w.decide(k, true) })
	}
	if fn == nil {
		return 0, nil, false
	}
	return best, fn, true
}

// advanceTo runs every event up to to, then sets the clock to it.
func (w *modelWorld) advanceTo(to int64) {
	w.t.Helper()
	for {
		at, fn, ok := w.nextEvent()
		if !ok || at > to {
			break
		}
		w.setClock(max(at, w.now))
		fn()
		w.checkKeys()
	}
	w.setClock(to)
	w.checkKeys()
}

// renewSlot renews a live handler's slot, as the middleware does every
// third of its Limiter's slot expiry.
func (w *modelWorld) renewSlot(r *mRun) {
	w.t.Helper()
	n, err := throttle.Extend(w.lims[r.lim], w.ctx, modelKey, r.slot)
	if err != nil {
		w.failf("renewing the slot of %s: %v", r.task, err)
	}
	if n != 1 {
		w.failf("slots: the slot %q of %s (running since %s until %s, renewed every %v by Limiter %d) was taken back while its handler runs",
			r.slot, r.task, w.at(r.start), w.at(r.end), time.Duration(w.slotX[r.lim]/3)*time.Microsecond, r.lim)
	}
	r.renew = w.now + w.slotX[r.lim]/3
}

// finish ends a handler: it settles what it used (Used), then gives its
// slot back.
func (w *modelWorld) finish(r *mRun) {
	w.t.Helper()
	w.running = slices.DeleteFunc(w.running, func(x *mRun) bool { return x == r })
	k := r.task
	for _, u := range []struct {
		unit, name string
		used       int
	}{{"", "requests", k.usedN}, {"tokens", "tokens", k.usedT}} {
		if u.used < 0 || u.used == r.charged[u.unit] {
			continue
		}
		charged := r.charged[u.unit]
		delta := u.used - charged
		before, calls := tokensOf(w.inspect()), w.windowCalls()
		// (with the task's tenant, as Used: settled without, every tenant's
		// extra use moved the default tenant's place in line)
		if err := throttle.AdjustUnitAs(w.lims[r.lim], w.ctx, modelKey, k.tenant, u.name, delta, r.d, charged); err != nil {
			w.failf("Used(%q, %d) of %s: %v", u.name, u.used, k, err)
		}
		after, callsAfter := tokensOf(w.inspect()), w.windowCalls()
		for id, c := range calls {
			// (A window's tokens show no more than n, nor less than none:
			// what it gave back is read from the calls it counts.)
			before[id], after[id] = -c, -callsAfter[id]
		}
		r.charged[u.unit] = u.used
		for _, tr := range w.rateTiers() {
			if tr.id.unit != u.unit {
				continue
			}
			tb, okb := before[tr.id]
			ta, oka := after[tr.id]
			if !okb || !oka {
				continue
			}
			if delta < 0 {
				g := ta - tb
				if g < -modelEps || g > float64(-delta)+modelEps {
					w.failf("Used(%q, %d) of %s (charged %d): the %s went from %g to %g tokens, not a refund of 0 to %d",
						u.name, u.used, k, charged, tr.id, tb, ta, -delta)
				}
				if e := r.ev[tr.id]; e != nil && g > modelEps {
					e.units -= g
				}
			} else {
				w.addEvent(tr, w.now, float64(delta), false, k.id)
			}
		}
		w.note("%s settles Used(%q, %d), charged %d", k, u.name, u.used, charged)
	}
	if r.slot != "" {
		if err := w.lims[r.lim].Release(w.ctx, modelKey, r.slot); err != nil {
			w.failf("Release(%q): %v", r.slot, err)
		}
	}
	w.note("%s ends", k)
}

// windowCalls is what each window tier counts of calls admitted (not
// reserved) in its sub-windows still in the window, from its state in the
// key's hash (window.lua's W field: "base c0,c1,...|reserved").
func (w *modelWorld) windowCalls() map[mTierID]float64 {
	out := map[mTierID]float64{}
	for _, tr := range w.rateTiers() {
		if tr.id.kind != throttle.KindWindow {
			continue
		}
		raw := w.mr.HGet(w.keyName("b"), fmt.Sprintf("Ww%d", tr.id.perUS/1000))
		sub := tr.id.perUS / 20
		oldest := floorDiv(w.now-tr.id.perUS, sub) - 1
		head, _, _ := strings.Cut(raw, "|")
		base, counts, ok := strings.Cut(head, " ")
		i, err := strconv.ParseInt(base, 10, 64)
		sum := 0.0
		for _, tok := range strings.Split(counts, ",") {
			c, _, _ := strings.Cut(tok, "+")
			if n, err2 := strconv.Atoi(c); ok && err == nil && err2 == nil && i >= oldest {
				sum += float64(n)
			}
			i++
		}
		out[tr.id] = sum
	}
	return out
}

// --- operators and providers ---

func (w *modelWorld) setLimits(limits []throttle.Limit) {
	w.t.Helper()
	same := slices.Equal(limits, w.limits)
	require.NoError(w.t, w.lims[0].SetLimits(w.ctx, modelKey, limits...), "SetLimits(%v)", limits)
	w.note("SetLimits(%v)", limits)
	if same {
		return
	}
	w.configure(limits)
	w.relearn()
	// The queue is dropped (the fair state with it), and the tasks deferred
	// under the old limits are brought back now (asynq's Inspector; here,
	// the model's pool) unless they are due within 2 s.
	w.booked, w.dropped = 0, nil
	for _, k := range w.waiting {
		k.resv = 0
		if !k.probe && k.back >= w.now+2*modelSecond {
			k.back = w.now
		}
	}
}

func (w *modelWorld) resume() {
	w.t.Helper()
	_, err := w.lims[0].Resume(w.ctx, modelKey)
	require.NoError(w.t, err, "Resume")
	if w.susp <= w.now {
		w.note("Resume (not suspended)")
		return
	}
	w.note("Resume: the suspension until %s ends", w.at(w.susp))
	w.susp = 0
	w.booked, w.dropped = 0, nil
	for _, k := range w.waiting {
		k.resv = 0
		if k.via == opArrive && k.reason == throttle.RefusedBySuspension && !k.probe && k.back >= w.now+2*modelSecond {
			k.back = w.now
		}
	}
}

func (w *modelWorld) observe(op modelOp) {
	w.t.Helper()
	per := time.Duration(op.Per) * time.Millisecond
	reset := time.Duration(op.Reset) * time.Millisecond
	require.NoError(w.t, throttle.ObserveQuota(w.lims[op.Lim], w.ctx, modelKey, op.Quota, per, op.Left, reset), "Observe")
	w.note("Observe by Limiter %d: %d per %v, remaining %d, reset %v", op.Lim, op.Quota, per, op.Left, reset)
	if op.Left == 0 && reset >= 10*time.Second {
		w.susp = max(w.susp, w.now+min(reset.Microseconds(), modelMaxSusp))
	}
	w.relearn()
}

// relearn records what the provider's quotas lowered, as Inspect shows
// it in force right after a change: each such quota binds until it lapses.
func (w *modelWorld) relearn() {
	w.t.Helper()
	s := w.inspect()
	for i, l := range s.Limits {
		if l.Kind == throttle.KindInFlight || l.Kind == throttle.KindAdaptive || i >= len(s.InForce) {
			continue
		}
		tr := w.tiers[tierIDOf(l)]
		if tr == nil {
			continue
		}
		var cur *mLearned
		for _, lr := range tr.learned {
			if lr.from <= w.now && w.now < lr.until {
				cur = lr
			}
		}
		p := paramsOf(s.InForce[i])
		if cur != nil && cur.p == p {
			if until := w.now + s.LearnedFor[i].Microseconds(); until > cur.until {
				cur.until = until
			}
			continue
		}
		if cur != nil {
			cur.until = w.now
		}
		if p != paramsOf(l) && s.LearnedFor[i] > 0 {
			tr.learned = append(tr.learned, &mLearned{p: p, from: w.now, until: w.now + s.LearnedFor[i].Microseconds(), seq: w.seq})
			w.note("learned: %s in force at %+v until %s", tr.id, p, w.at(w.now+s.LearnedFor[i].Microseconds()))
		}
	}
}

// --- liveness ---

// deadline is when every waiting task must have run, draining from now
// with no new work: from when the key can serve them (the suspension's
// end, two granules past the last instant booked, and the end of a learned
// quota that holds less than a task costs), their work, the work booked by
// tasks deleted from asynq since the last drain, and what the tiers owe at
// the rates in force, plus the slack of asynq's whole seconds, the
// worker's paced wait and a tier's interval; and no earlier than a granule
// after the last of them comes back at its told time.
//
// Work that never comes back holds its tenant's next tasks, and the
// others' share, back for the work it booked and two granules of grace at
// most (TestFairWorkThatNeverComesBackDoesNotStarveItsTenant): it stays in
// its tenant's finish tag, and its tenant's weight in the clock's W, until
// the clock has served it. Two granules past the last instant booked
// covers that work only when a booking told after it lies past its end;
// when none does (it was the last booked, or the turns moved after the
// bookings were told: a SetWeights, a surcharge), the key's other tenants
// wait for it on a key with room, and the bound must count it.
func (w *modelWorld) deadline() (int64, string) {
	s := w.inspect()
	tok := tokensOf(s)
	from := max(w.now, w.susp, w.booked+2*modelGranule)
	need, interval, lastBack := int64(0), int64(0), int64(0)
	for _, k := range w.waiting {
		lastBack = max(lastBack, k.back+k.lag)
	}
	for _, tr := range w.rateTiers() {
		p := tr.p
		for _, lr := range tr.learned {
			if lr.from <= w.now && w.now < lr.until {
				p = lr.p
				// A task costing more than a lowered tier holds waits for
				// the tier to come back up, when what was learned lapses.
				most := lr.p.burst
				if tr.id.kind == throttle.KindWindow {
					most = lr.p.n
				}
				for _, k := range w.waiting {
					if int64(k.cost(tr.id.unit)) > most {
						from, p = max(from, lr.until), tr.p
					}
				}
			}
		}
		var work float64
		for _, k := range w.waiting {
			c := k.cost(tr.id.unit)
			if u := k.usedT; tr.id.unit == "tokens" && u > c {
				c = u
			}
			if u := k.usedN; tr.id.unit == "" && u > c {
				c = u
			}
			work += float64(c)
		}
		for _, k := range w.dropped {
			work += float64(k.cost(tr.id.unit))
		}
		for _, r := range w.running {
			if u := r.task.usedT; tr.id.unit == "tokens" && u > r.charged["tokens"] {
				work += float64(u - r.charged["tokens"])
			}
			if u := r.task.usedN; tr.id.unit == "" && u > r.charged[""] {
				work += float64(u - r.charged[""])
			}
		}
		if tr.id.kind == throttle.KindWindow {
			used := float64(p.n) - tok[tr.id]
			periods := math.Ceil((work+used)/float64(p.n)) + 1
			need = max(need, int64(periods*float64(tr.id.perUS+tr.id.perUS/20+modelHeadroom)))
			interval = max(interval, tr.id.perUS)
			continue
		}
		owed := max(0, float64(p.burst)-tok[tr.id])
		need = max(need, int64((work+owed)*float64(tr.id.perUS)/float64(p.rate)))
		interval = max(interval, tr.id.perUS/p.rate)
	}
	if w.inflight > 0 {
		n := int64(len(w.waiting))
		need = max(need, (n/int64(w.inflight)+2)*(modelMaxRun+modelGranule))
	}
	slack := 2*interval + 3*modelGranule + throttle.MaxPaceWait.Microseconds()
	dl := max(from+need, lastBack+modelGranule) + slack
	booked := "none"
	if w.booked > 0 {
		booked = w.at(w.booked)
	}
	why := fmt.Sprintf("from %s (the latest of now, the suspension's end and 2 granules past the last instant booked, %s), the work outstanding (with %d tasks deleted while booked) and owed %v, slack %v; the last told back at %s",
		w.at(from), booked, len(w.dropped), time.Duration(need)*time.Microsecond, time.Duration(slack)*time.Microsecond, w.at(lastBack))
	return dl, why
}

// drain lets every waiting task come back and run, with no new work, and
// fails when one has not run by the deadline.
func (w *modelWorld) drain() {
	w.t.Helper()
	if len(w.waiting) == 0 {
		return
	}
	dl, why := w.deadline()
	w.note("drain: %d waiting, all must run by %s (%s)", len(w.waiting), w.at(dl), why)
	for len(w.waiting) > 0 {
		at, _, ok := w.nextEvent()
		if !ok || at > dl {
			w.advanceTo(dl)
			var left []string
			for _, k := range w.waiting {
				left = append(left, fmt.Sprintf("%s, decided %d times, next back at %s", k, k.decisions, w.at(k.back)))
			}
			s := w.inspect()
			w.failf("liveness: %d tasks still wait at %s on a key with room (the bound: %s): %s; Inspect: suspended %v, tokens %v, reservations %d, tenants %+v",
				len(w.waiting), w.at(dl), why, strings.Join(left, "; "), s.SuspendedFor, s.Tokens, s.Reservations, s.Tenants)
		}
		w.advanceTo(at)
	}
	w.dropped = nil
}

// finishRun drains, lets every handler end, then idles past every lapse
// and expiry: what remains of the key must be configuration only.
func (w *modelWorld) finishRun() {
	w.t.Helper()
	w.drain()
	w.checkState()
	w.note("idle for %v", time.Duration(modelIdle)*time.Microsecond)
	w.advanceTo(w.now + modelIdle)
	w.checkIdle()
}

// --- bounded state ---

func (w *modelWorld) keyName(part string) string { return "throttle:{" + modelKey + "}:" + part }

// checkKeys checks what the key holds besides the hash: reservations are
// bookings the model knows of, none older than two lapses and the horizon;
// every start tag has a reservation; every tenant record an active tenant;
// every live handler its slot, and no slot is held by anything else.
func (w *modelWorld) checkKeys() {
	w.t.Helper()
	resv := map[string]bool{}
	if w.mr.Exists(w.keyName("r")) {
		ids, _ := w.mr.ZMembers(w.keyName("r"))
		for _, id := range ids {
			resv[id] = true
			at, _ := w.mr.ZScore(w.keyName("r"), id)
			told, ok := w.bookings[id]
			switch {
			case w.released[id]:
				w.failf("state: the reservation of %s remains after Enqueue released it (asynq refused the task)", id)
			case !ok:
				w.failf("state: a reservation of %s at %s that no decision told", id, w.at(int64(at)))
			// (a lapsed reservation is swept by the next booking a second
			// or more after the last sweep, else it goes with the set,
			// which the latest booking keeps for its own lapse: it may
			// stay a lapse and a horizon past its own)
			case int64(at) < w.now-2*modelLapse-modelHorizon-2*modelGranule && !w.skip["lapse"]:
				w.failf("state: the reservation of %s at %s (told %s) outlives its lapse", id, w.at(int64(at)), w.at(told))
			}
		}
	}
	if w.mr.Exists(w.keyName("t")) {
		ids, _ := w.mr.ZMembers(w.keyName("t"))
		for _, id := range ids {
			if !resv[id] {
				why := ""
				if w.released[id] {
					why = " (Enqueue released its booking: asynq refused the task)"
				}
				w.failf("state: the start tag of %s remains without its reservation%s: its tenant's place in line counts work no task will do", id, why)
			}
		}
	}
	active := map[string]bool{}
	if w.mr.Exists(w.keyName("a")) {
		ids, _ := w.mr.ZMembers(w.keyName("a"))
		for _, id := range ids {
			active[id] = true
		}
	}
	if w.mr.Exists(w.keyName("b")) {
		fields, _ := w.mr.HKeys(w.keyName("b"))
		for _, f := range fields {
			if name, ok := strings.CutPrefix(f, "t:"); ok && !active[name] {
				w.failf("state: tenant %q keeps a record (%s) but is not active (not in the active set%s)", name, f, map[bool]string{true: "", false: "; the fair clock G is gone"}[w.mr.HGet(w.keyName("b"), "G") != ""])
			}
		}
	}
	held := map[string]bool{}
	if w.mr.Exists(w.keyName("f")) {
		ids, _ := w.mr.ZMembers(w.keyName("f"))
		for _, id := range ids {
			if sc, _ := w.mr.ZScore(w.keyName("f"), id); int64(sc) >= w.now {
				held[id] = true
			}
		}
	}
	live := 0
	for _, r := range w.running {
		if r.slot == "" {
			continue
		}
		live++
		if !held[r.slot] {
			w.failf("slots: the slot %q of %s (Limiter %d, slots expire in %v, renewed every third of it; running %s to %s) is gone while its handler runs",
				r.slot, r.task, r.lim, time.Duration(w.slotX[r.lim])*time.Microsecond, w.at(r.start), w.at(r.end))
		}
	}
	if len(held) > live {
		w.failf("slots: %d slots held, but only %d handlers run", len(held), live)
	}
}

// checkState is checkKeys plus what Inspect shows: the suspension, the
// quotas learned and the weights stay as long as they were promised.
func (w *modelWorld) checkState() {
	w.t.Helper()
	w.checkKeys()
	s := w.inspect()
	want := time.Duration(max(0, w.susp-w.now)) * time.Microsecond
	if s.SuspendedFor != want {
		w.failf("suspension: Inspect says suspended for %v, want %v (until %s)", s.SuspendedFor, want, w.at(w.susp))
	}
	for i, l := range s.Limits {
		if l.Kind == throttle.KindInFlight || l.Kind == throttle.KindAdaptive || i >= len(s.InForce) {
			continue
		}
		tr := w.tiers[tierIDOf(l)]
		if tr == nil {
			continue
		}
		for _, lr := range tr.learned {
			if lr.from <= w.now && w.now < lr.until {
				got := paramsOf(s.InForce[i])
				if got.rate > lr.p.rate || got.burst > lr.p.burst || got.n > lr.p.n {
					w.failf("learned: the %s learned at %s (%+v) should be in force until %s, but %+v is", tr.id, w.at(lr.from), lr.p, w.at(lr.until), got)
				}
			}
		}
	}
	for name, wt := range w.weights {
		ts, ok := tenantNamed(s, name)
		if !ok || ts.Weight != wt {
			w.failf("weights: tenant %q's weight %d set by SetWeights is gone (Inspect: %+v)", name, wt, s.Tenants)
		}
	}
}

// checkIdle: after an idle period past every lapse and expiry, only
// configuration may remain (limits, weights, what they were learned or
// computed under); no bucket state, windows, schedule, fair clock, tenant
// records, tags, reservations, active set or slots.
func (w *modelWorld) checkIdle() {
	w.t.Helper()
	for _, part := range []string{"r", "t", "a", "f"} {
		if w.mr.Exists(w.keyName(part)) && !(part == "r" && w.skip["lapse"]) {
			ids, _ := w.mr.ZMembers(w.keyName(part))
			w.failf("state: after %v idle, %s still holds %v", time.Duration(modelIdle)*time.Microsecond, w.keyName(part), ids)
		}
	}
	if !w.mr.Exists(w.keyName("b")) {
		return
	}
	fields, _ := w.mr.HKeys(w.keyName("b"))
	for _, f := range fields {
		switch {
		case f == "T", f == "V", f == "M", f == "FL", f == "G", f == "Y",
			strings.HasPrefix(f, "W"), strings.HasPrefix(f, "t:"):
			w.failf("state: after %v idle, the key's hash still holds %s (fields %v): only configuration may remain", time.Duration(modelIdle)*time.Microsecond, f, fields)
		}
	}
}
