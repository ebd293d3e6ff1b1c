package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStackedModelMetersPerWorkspaceAndPerApp: a call needs a token of its
// workspace and of the app; a refused call takes from neither, and says
// which quota refused it.
func TestStackedModelMetersPerWorkspaceAndPerApp(t *testing.T) {
	models, refused := newStackedModels([]string{"T1", "T2"}, 10, 15, at)
	ws1, ws2 := models["T1"], models["T2"]
	for i := range 10 {
		require.True(t, ws1.serve(at, http.Header{}), "T1 call %d: its burst", i)
	}
	h := http.Header{}
	assert.False(t, ws1.serve(at, h), "T1's 11th call: its workspace is empty, the app is not")
	assert.Equal(t, "1", h.Get("Retry-After"))
	for i := range 5 {
		require.True(t, ws2.serve(at, http.Header{}), "T2 call %d: the app's last 5 tokens", i)
	}
	assert.False(t, ws2.serve(at, http.Header{}), "T2's 6th call: T2 has 5 left, the app none")
	assert.Equal(t, map[string]int{"workspace": 1, "app": 1}, refused)

	// 100 ms later the app has 1.5 tokens, T1 one, T2 six: one call passes,
	// and the next on T1 is refused by both.
	later := at.Add(100 * time.Millisecond)
	assert.True(t, ws1.serve(later, http.Header{}))
	assert.False(t, ws1.serve(later, http.Header{}), "T1 empty and the app at 0.5")
	assert.Equal(t, 1, refused["both"])
	assert.False(t, ws2.serve(later, http.Header{}), "the refused calls took nothing, but the app has 0.5")
	assert.True(t, ws2.serve(later.Add(40*time.Millisecond), http.Header{}), "the app's 0.5 + 0.6 tokens")
}

func TestIdealDrainIsSetByTheBindingKey(t *testing.T) {
	ideal, binding := mIdeal(mQuotas(mRedis))
	assert.Equal(t, 39*time.Second, ideal, "(600 - 15) / 15: the app binds")
	assert.Equal(t, "slack", binding)
	ideal, binding = mIdeal([]mQuota{{Key: "a", Rate: 10, Burst: 10, Tasks: 500}, {Key: "app", Rate: 15, Burst: 15, Tasks: 600}})
	assert.Equal(t, 49*time.Second, ideal, "a workspace of 500 tasks binds: (500 - 10) / 10")
	assert.Equal(t, "a", binding)
	ws, app := mKeys(mCluster)
	assert.Equal(t, []string{"{slack}:T1", "{slack}:T2"}, ws)
	assert.Equal(t, "{slack}:app", app, "one family on the Cluster")
}

func TestMKeyCheckFlagsAWindowOverBurstPlusRate(t *testing.T) {
	q := mQuota{Key: "ws", Rate: 10, Burst: 10}
	var calls []float64
	for i := range 20 { // burst 10 at 0, then 10 in the next second
		calls = append(calls, float64(max(i-9, 0))*0.1)
	}
	r := mKeyCheck(q, calls)
	assert.Equal(t, 19, r.Most1s, "the burst at 0 and 0.1 to 0.9; the call at 1.0 is a second later")
	assert.LessOrEqual(t, r.Worst.Excess, 1e-9, "a full bucket drained at its rate holds the bound")
	assert.True(t, mRun{Keys: []mKeyResult{r}}.mWindowsOK())

	calls = append(calls, 0.5, 0.55)
	r = mKeyCheck(q, calls)
	assert.Equal(t, 21, r.Most1s, "over burst + rate = 20")
	assert.Greater(t, r.Worst.Excess, 0.0)
	assert.False(t, mRun{Keys: []mKeyResult{r}}.mWindowsOK())
	assert.False(t, mRun{}.mWindowsOK(), "no keys checked is no pass")
}
