package throttle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// A task of several keys (issue 30): Key("slack:T0123:chat.postMessage",
// "slack:T0123", "slack"). One decision in Redis (lua.DecideMulti) takes
// its cost from every key or from none; this file carries it through the
// middleware, Take and Enqueue. A task of one key never comes here.

// keyPart is what a decision of several keys admitted in one of them: the
// slot it holds there, and the instant and generation its refunds count
// from.
type keyPart struct {
	key  string
	slot string
	at   time.Time
	gen  int64
}

// Slots held in several keys travel in one Decision.Slot: slotsMark, then
// "key\x1fslot" pairs separated by slotsMark. Key names are printable, so
// neither byte is in one.
const (
	slotsMark = "\x1e"
	slotSep   = "\x1f"
)

// joinSlots writes the slots of parts as one Decision.Slot ("" none).
func joinSlots(parts []keyPart) string {
	var b strings.Builder
	for _, p := range parts {
		if p.slot != "" {
			b.WriteString(slotsMark + p.key + slotSep + p.slot)
		}
	}
	return b.String()
}

// splitSlots reads the slots of a Decision.Slot of several keys, by key;
// false for a slot of one key.
func splitSlots(s string) (map[string][]string, bool) {
	if !strings.HasPrefix(s, slotsMark) {
		return nil, false
	}
	out := map[string][]string{}
	for _, pair := range strings.Split(s[len(slotsMark):], slotsMark) {
		if k, slot, ok := strings.Cut(pair, slotSep); ok && slot != "" {
			out[k] = append(out[k], slot)
		}
	}
	return out, true
}

// moreKeys checks the keys of a call: key, then more (none for a call of
// one key), at most keyspace.MaxKeys, none twice.
func moreKeys(key string, more []string) ([]string, error) {
	if len(more) == 0 {
		return nil, nil
	}
	names := append([]string{key}, more...)
	if err := keyspace.SetKeys(map[string]string{}, names); err != nil {
		return nil, err
	}
	return names, nil
}

// decideMulti decides one call of cost and tenant ("" the default) across
// keys (2 to MaxKeys, the call's key first), all or nothing. On each key
// where the call names a tenant, or whose tenants are active, it waits for
// its tenant's turn there (fair.lua), as a call of that key alone would. A
// refusal names the key that made the call wait (Decision.Key).
func (l *Limiter) decideMulti(ctx context.Context, keys []string, v variant, id string, cost taskCost, tenant string) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: keys %q: decide: %w", keys, err)
	}
	if _, ok := l.rdb.(*redis.ClusterClient); ok && !oneFamily(keys) {
		// Each key has its own hash slot unless they share a family tag:
		// one script cannot touch several slots.
		return Decision{}, fmt.Errorf("throttle: keys %q: on Redis Cluster the keys of one task must be of one family, e.g. {slack}:T0123 and {slack}:app (one hash slot, see docs/limits.md); rename them so, or give the task one key", keys)
	}
	rks := make([]lua.Keys, len(keys))
	for i, k := range keys {
		rk, err := redisKeys(l.o.prefix, k)
		if err != nil {
			return Decision{}, err
		}
		rks[i] = rk
	}
	a := lua.DecideArgs{TaskID: id, Granule: v.granule, Horizon: v.horizon, Lapse: l.o.lapse,
		Defaults: l.o.defaultTiers, Headroom: v.headroom, Book: v.book, Pace: v.pace, Probe: v.probe,
		SlotExpiry: l.o.slotExpiry, Cost: cost.orOne().n, Units: cost.units, Tenant: tenant}
	r, err := bounded(l, ctx, func(ctx context.Context) (lua.MultiReply, error) {
		return lua.DecideMulti(ctx, l.runner, rks, a)
	})
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: keys %q: decide: %w", keys, err)
	}
	for i, k := range keys {
		if r.Keys == nil || r.Keys[i].Status != lua.StatusNoLimits {
			l.touch(l.keys.get(k), k, true)
		}
	}
	name := keys[0]
	if r.Key >= 0 {
		name = keys[r.Key]
	}
	d, err := l.decision(name, cost, r.DecideReply)
	if err != nil {
		return Decision{}, err
	}
	if !d.Allowed {
		d.Key = name
		return d, nil
	}
	if r.Key >= 0 {
		d.waitsFor = name
	}
	for i, k := range keys {
		if kr := r.Keys[i]; kr.Status == lua.StatusAllowed {
			d.parts = append(d.parts, keyPart{key: k, slot: kr.Slot, at: kr.At, gen: kr.Generation})
		}
	}
	d.Slot = joinSlots(d.parts)
	if len(d.parts) > 0 {
		d.at, d.gen = d.parts[0].at, d.parts[0].gen
	}
	return d, nil
}

// giveBackMulti undoes the admission d of a task of several keys that
// will not run now: in every key, its slot and its cost.
func (m *middleware) giveBackMulti(ctx context.Context, d Decision, cost taskCost, tenant string) {
	for _, p := range d.parts {
		m.giveBack(ctx, p.key, Decision{Slot: p.slot, at: p.at, gen: p.gen}, cost, tenant)
	}
}

// processMulti is process for a task of several keys (keys, its key
// first): cached suspensions, one decision in Redis, then as act does.
// Leases are not used: a leased token is one key's.
func (m *middleware) processMulti(ctx context.Context, t *asynq.Task, next asynq.Handler, keys []string, ev Event) error {
	ks := m.l.keys.get(keys[0])
	now := m.now()
	if by, latest, ok := m.suspendedKnown(keys, now); ok {
		ev.Cached, ev.Key = true, by
		return m.deferDecision(ctx, t, m.l.keys.get(by), Decision{RetryAfter: latest.Sub(now), Reason: RefusedBySuspension, Key: by}, ev, Deferred)
	}
	sent := m.now()
	d, err := m.decideMultiTask(ctx, keys, t, ev.TaskID, ev.cost, false)
	ev.Latency = m.now().Sub(sent)
	// Refused a slot expected free within a granule: wait for it in the
	// worker, asking again with its place kept (as decideAndWait does).
	for waited := time.Duration(0); err == nil && !d.Allowed && d.Reason == RefusedBySlots; {
		w := max(d.RetryAfter, minSlotPoll)
		if waited+w > maxSlotWait || w > m.waitBudget(ctx, m.l.o.timeout) {
			break
		}
		if serr := m.sleep(ctx, w); serr != nil {
			return serr
		}
		waited += w
		d, err = m.decideMultiTask(ctx, keys, t, ev.TaskID, ev.cost, true)
	}
	if err == nil && !d.Allowed && !d.reserved && d.Reason == RefusedBySuspension {
		m.l.keys.get(d.Key).cacheSuspension(m.now(), d.RetryAfter, false)
	}
	if err == nil && !d.Allowed {
		ev.Key = d.Key
		return m.deferDecision(ctx, t, m.l.keys.get(d.Key), d, ev, Deferred)
	}
	if err == nil && m.tooFarAhead(ctx, d.wait) {
		// (named as a refusal is: the key whose turn it waits for)
		m.giveBackMulti(ctx, d, ev.cost, ev.Tenant)
		by := keys[0]
		if d.waitsFor != "" {
			by = d.waitsFor
		}
		ev.Key = by
		return m.deferDecision(ctx, t, m.l.keys.get(by), Decision{RetryAfter: d.wait, Reason: RefusedByQueue, Key: by}, ev, Deferred)
	}
	if err == nil {
		for _, p := range d.parts {
			if p.slot != "" {
				release := m.l.holdSlot(p.key, p.slot)
				defer release() // also when the handler panics
			}
		}
		ev.Outcome, ev.left, ev.at, ev.gen, ev.Wait = Ran, d.Remaining, d.at, d.gen, d.wait
		ev.parts = d.parts
		return m.run(ctx, t, next, ks, ev)
	}
	return m.act(ctx, t, next, ks, ev, d, err)
}

// decideMultiTask asks Redis for a decision on task t of several keys,
// as decideAs does for one; probe: it waits in its worker for a slot, and
// keeps its place.
func (m *middleware) decideMultiTask(ctx context.Context, keys []string, t *asynq.Task, id string, cost taskCost, probe bool) (Decision, error) {
	if origin := t.Headers()[keyspace.Origin]; origin != "" {
		id = origin
	}
	v := variant{granule: granule, headroom: m.l.o.headroom, pace: m.l.o.pacing, probe: probe}
	if m.l.o.horizon > 0 && id != "" {
		v.horizon = m.l.o.horizon
	} else {
		id = ""
	}
	tenant, _ := tenantOf(t) // (validated by process)
	return m.l.decideMulti(ctx, keys, v, id, cost, tenant)
}

// keysOfTask returns every key of task t, its key first, when it names
// more than one; nil otherwise.
func keysOfTask(t *asynq.Task, key string) ([]string, error) {
	more, err := keyspace.KeysOfTask(t, key)
	if err != nil || more == nil {
		return nil, err
	}
	return append([]string{key}, more...), nil
}

// oneFamily reports whether every key has the same family tag, so that
// all their Redis keys are in one Cluster slot (keyspace.Family).
func oneFamily(keys []string) bool {
	f := keyspace.Family(keys[0])
	if f == "" {
		return false
	}
	for _, k := range keys[1:] {
		if keyspace.Family(k) != f {
			return false
		}
	}
	return true
}

// observedFor picks the charge Observe learns into: for a task of several
// keys, the first of its keys with a rate tier of a period and unit the
// response states a quota for (so each limit is learned where it lives);
// its first key when none has one, or for a task of one key. A key whose
// tiers this process was not told yet is inspected once.
func (tc *taskCharge) observedFor(ctx context.Context, q quota.Info, li quota.LLMInfo) *taskCharge {
	if len(tc.also) == 0 {
		return tc
	}
	type said struct {
		perMS int64
		unit  string
	}
	var quotas []said
	for _, p := range q.Policies {
		if p.Window > 0 && p.Quota > 0 {
			quotas = append(quotas, said{p.Window.Milliseconds(), ""})
		}
	}
	for _, u := range li.Units {
		if u.Window > 0 && u.Limit > 0 {
			unit := u.Unit
			if unit == quota.UnitRequests {
				unit = ""
			}
			quotas = append(quotas, said{u.Window.Milliseconds(), unit})
		}
	}
	if len(quotas) == 0 {
		return tc
	}
	for _, c := range append([]*taskCharge{tc}, tc.also...) {
		for _, t := range c.l.tiersOf(ctx, c.key, c.ks) {
			for _, s := range quotas {
				if t.PerMS == s.perMS && t.Unit == s.unit {
					return c
				}
			}
		}
	}
	return tc
}

// tiersOf returns the rate tiers of key (their period and unit): as
// Redis last told this process (Observe), else read with Inspect.
func (l *Limiter) tiersOf(ctx context.Context, key string, ks *keyState) []lua.ObservedTier {
	ks.mu.Lock()
	told, tiers := ks.obs.told, ks.obs.tiers
	ks.mu.Unlock()
	if told {
		return tiers
	}
	st, err := l.Inspect(ctx, key)
	if err != nil {
		return nil
	}
	for _, lim := range st.Limits {
		if lim.Kind == KindInFlight || lim.Kind == KindAdaptive {
			continue
		}
		unit := lim.Unit
		if unit == unitRequests {
			unit = ""
		}
		tiers = append(tiers, lua.ObservedTier{PerMS: lim.Per.Milliseconds(), Unit: unit})
	}
	return tiers
}
