package throttle_test

// The property test of tasks of several keys (property_multikey_test.go)
// with tenants: each task is of one of three tenants (or the default one),
// whose weights SetWeights changes at random on any key, so that the keys
// the tasks share are decided in tenants' fair order (fair.lua), by the
// one-key path and by the decision across keys (multi.lua) alike. The same
// checks hold: all or nothing, the bound per key, and liveness: every
// waiting task of every tenant runs in the drain at the end.

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// reserveOne decides task tk of one key, as its tenant.
func (m *mkModel) reserveOne(tk *mkTask) (throttle.Decision, error) {
	return throttle.ReserveUses(m.r.lim, m.r.ctx, tk.keys[0], tk.id, tk.tenant, tk.uses(), m.horizon, m.granule)
}

// reserveKeys decides task tk of several keys, as its tenant, and checks
// that a task of a named tenant is counted in its keys' fair state: its
// reservation has its start tag on a key at least (on every key when it
// was booked; a key's tags may have been dropped since by SetLimits, or
// passed over when it came back late). (Once admitted, a tag may be left
// as the one-key path leaves it: admitted on buckets alone once no tenant
// is active, it lapses with its reservation.)
func (m *mkModel) reserveKeys(t *rapid.T, tk *mkTask) (throttle.Decision, error) {
	d, err := throttle.ReserveKeysUses(m.r.lim, m.r.ctx, tk.keys, tk.id, tk.tenant, tk.uses(), m.horizon, m.granule, m.granule > 0)
	if err != nil || tk.tenant == "" || d.Allowed || !throttle.Reserved(d) {
		return d, err
	}
	var tagged []string
	for _, k := range tk.keys {
		if _, err := m.r.rdb.ZScore(m.r.ctx, "throttle:{"+k+"}:t", tk.id).Result(); err == nil {
			tagged = append(tagged, k)
		}
	}
	if len(tagged) == 0 {
		t.Fatalf("%s %v of %q reserved (%+v), with a start tag on none of its keys: not in its tenant's turn", tk.id, tk.keys, tk.tenant, d)
	}
	return d, err
}

// mkTenants are the tenants of the tenants' model ("" the default tenant:
// a task that names none).
var mkTenants = []string{"acme", "globex", "initech", ""}

// setWeights gives key's named tenants random weights (1 to 5), some of
// them left at 1.
func (m *mkModel) setWeights(t *rapid.T, key string) {
	w := map[string]int{}
	for _, tn := range mkTenants[:3] {
		if rapid.Bool().Draw(t, "weighted") {
			w[tn] = rapid.IntRange(1, 5).Draw(t, "weight")
		}
	}
	if err := m.r.lim.SetWeights(m.r.ctx, key, w); err != nil {
		t.Fatalf("SetWeights(%q, %v): %v", key, w, err)
	}
}

func TestPropertyMultiKeyTenants(t *testing.T) {
	// (60 runs, about 20 s; 10 under -race; -rapid.checks=N for a soak)
	defer withChecks(racedChecks(60))()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	rapid.Check(t, func(t *rapid.T) {
		mr.FlushAll()
		mr.SetTime(epoch())
		m := newMkModel(t, mr, rdb)
		defer m.r.lim.Close()
		if rapid.Bool().Draw(t, "weights") {
			m.setWeights(t, "app")
		}
		sets := [][]string{{"w1", "app"}, {"w2", "app"}, {"app"}, {"w1"}}
		steps := rapid.IntRange(10, 120).Draw(t, "steps")
		for range steps {
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); {
			case op < 5:
				m.made++
				tk := &mkTask{id: fmt.Sprintf("t%d", m.made), keys: sets[rapid.IntRange(0, len(sets)-1).Draw(t, "set")],
					tenant: mkTenants[rapid.IntRange(0, len(mkTenants)-1).Draw(t, "tenant")]}
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
				m.setWeights(t, mkKeys[rapid.IntRange(0, 2).Draw(t, "setWeights")])
			default:
				m.setLimits(t, mkKeys[rapid.IntRange(0, 2).Draw(t, "setLimits")])
			}
		}
		m.drainAll(t)
	})
}

// drainAll is the drain at the end: no new work; every waiting task, of
// every tenant, runs within the deadline (the tasks at the slowest rate
// any key can have, after the horizon and the longest suspension).
func (m *mkModel) drainAll(t *rapid.T) {
	deadline := m.r.now.Add(m.horizon + 5*time.Second + time.Duration(len(m.waiting)+1)*time.Second)
	for len(m.waiting) > 0 {
		slices.SortStableFunc(m.waiting, func(a, b *mkTask) int { return a.due.Compare(b.due) })
		next := m.waiting[0].due
		for _, r := range m.running {
			if r.ends.Before(next) {
				next = r.ends
			}
		}
		if next.After(deadline) {
			by := map[string]int{}
			for _, tk := range m.waiting {
				by[tk.tenant]++
			}
			t.Fatalf("liveness: %d tasks still waiting at %v (deadline %v), by tenant %v, the next due at %v: %+v",
				len(m.waiting), m.r.now.Sub(epoch()), deadline.Sub(epoch()), by, next.Sub(epoch()), m.waiting[0])
		}
		if next.After(m.r.now) {
			m.r.advance(next.Sub(m.r.now))
		}
		m.comeBack(t)
	}
}
