package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSpreadTenantsPlacesEachTenantsTasksEvenly(t *testing.T) {
	tenants := []tTenant{{Name: "a", Tasks: 6}, {Name: "b", Tasks: 2}, {Name: "late", Tasks: 3, After: time.Second}}
	seq := spreadTenants(tenants, []int{0, 1})
	assert.Equal(t, []tSlot{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {0, 3}, {0, 4}, {1, 1}, {0, 5}}, seq,
		"b's two tasks at 1/4 and 3/4 of the sequence, a's at (k + 1/2) / 6, ties in the group's order; late not in the group")
	assert.Equal(t, []tSlot{{0, 0}, {1, 0}, {0, 1}, {1, 1}}, spreadTenants([]tTenant{{Tasks: 2}, {Tasks: 2}}, []int{0, 1}), "equal backlogs alternate")
}

func TestSharesAreCountedWhileEveryTenantWaits(t *testing.T) {
	s := time.Second
	ts := []tenantResult{
		{Name: "heavy", Tasks: 4, Completed: 4, Enqueued: 0, Took: 5 * s},
		{Name: "light", Tasks: 2, Completed: 2, Enqueued: 2 * s, Took: 1 * s},
	}
	from, to := bothWait(ts)
	assert.Equal(t, 2*s, from, "the last tenant's enqueue")
	assert.Equal(t, 3*s, to, "the first tenant's last run")
	runs := []tRunAt{{"heavy", 0}, {"heavy", s}, {"heavy", 2 * s}, {"light", 2 * s}, {"light", 3 * s}, {"heavy", 5 * s}}
	shares, n := sharesIn(runs, from, to)
	assert.Equal(t, 3, n, "runs at 2 s and 3 s, both ends in")
	assert.InDelta(t, 2.0/3, shares["light"], 1e-9)
	assert.InDelta(t, 1.0/3, shares["heavy"], 1e-9)

	ts[1].Completed = 1
	_, to = bothWait(ts)
	assert.Equal(t, 5*s, to, "a tenant that did not finish ends no window")
	ts[0].Completed = 3
	_, to = bothWait(ts)
	assert.Less(t, to, time.Duration(0), "no tenant finished: no window")
}

func TestMostWithinCountsCallsInAnyWindowShorterThanTheSpan(t *testing.T) {
	assert.Equal(t, 4, mostWithin([]float64{2.5, 0, 0.2, 0.99, 1.0, 1.1}, 1), "0.2 to 1.1; 0 and 1.0 are a second apart, not in one window")
	assert.Equal(t, 0, mostWithin(nil, 1))
}

func TestIdealDrainIsEachKeysBurstThenItsRate(t *testing.T) {
	c := tCase{Tenants: []tTenant{{Name: "heavy", Tasks: 600, Weight: 1}, {Name: "light", Tasks: 40, Weight: 1, After: 3 * time.Second}}}
	assert.Equal(t, 15*time.Second, c.ideal(tFair), "(640 - 40) / 40")
	assert.Equal(t, 29*time.Second, c.ideal(tCaps), "heavy's own key: (600 - 20) / 20")
	w := tCase{Tenants: []tTenant{{Name: "gold", Tasks: 300, Weight: 3}, {Name: "plain", Tasks: 300, Weight: 1}}}
	assert.Equal(t, 30, w.capRate(w.Tenants[0]))
	assert.Equal(t, 10, w.capRate(w.Tenants[1]))
	assert.Equal(t, 29*time.Second, w.ideal(tCaps), "plain's own key: (300 - 10) / 10")
}
