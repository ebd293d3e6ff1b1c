package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// TestKeyBelowItsConfiguredLimitsShowsTheLimitInForce: a key running below its configured limits (a quota
// learned from the provider's headers through Observe, or adaptive mode's
// cut after a 429) says so in list and get, with the limit in force, and
// its tokens are shown against the burst in force, never below 0.
func TestKeyBelowItsConfiguredLimitsShowsTheLimitInForce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	tr := &transcript{t: t, redisURL: "redis://" + srv.Addr + "/0"}
	tr.run("set", "crm", "20/s")
	tr.run("set", "hubspot", "10/s", "30s:adaptive")

	// A handler under the middleware reads crm's published quota, 10/s.
	lim := throttle.NewLimiter(rdb, throttle.WithLease(0, 0))
	rec := httptest.NewRecorder()
	rec.Header().Set("RateLimit-Policy", `"default";q=10;w=1`)
	rec.WriteHeader(http.StatusOK)
	task := mustTask(t, "crm:sync", nil, throttle.Key("crm"))
	err := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		return throttle.Observe(ctx, rec.Result())
	})).ProcessTask(ctx, task)
	require.NoError(t, err)
	// A 429 on hubspot: adaptive mode halves its rate.
	err = lim.Suspend(ctx, "hubspot", time.Second)
	require.NoError(t, err)

	r := tr.run("list")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `crm +20/s \(in force: 10/s, learned for (10m0s|9m5\ds)\) +9\.\d/10 `, r.stdout)
	assert.Regexp(t, `hubspot +10/s 30s:adaptive \(in force: 5/s, adaptive\) +\d\.\d/5 `, r.stdout)

	r = tr.run("get", "crm", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), r.stdout)
	require.Len(t, v.Limits, 1)
	assert.Equal(t, "20/s", v.Limits[0].Limit, "configured")
	assert.Equal(t, "10/s", v.Limits[0].InForce, "in force")
	assert.Equal(t, 10, v.Limits[0].Burst, "the burst in force")
	assert.InDelta(t, 600, v.Limits[0].LearnedSeconds, 10, "learned for 10 min")

	// why explains a refusal by the limit in force: at 10/s, 0.5 tokens
	// short of one call is 50 ms away (at the configured 20/s: 25 ms).
	st0 := throttle.Status{Limits: []throttle.Limit{throttle.PerSecond(20)}, InForce: []throttle.Limit{throttle.PerSecond(10)}, Tokens: []float64{0.5}}
	assert.Contains(t, tierSentence(st0, 1, "crm", 1), `tier 1 of key "crm" (20/s, in force 10/s)`)
	assert.Contains(t, tierSentence(st0, 1, "crm", 1), "50ms")

	// A bucket in debt shows 0 tokens, not a negative count.
	st := throttle.Status{Limits: []throttle.Limit{throttle.PerSecond(18)}, InForce: []throttle.Limit{throttle.PerSecond(18)}, Tokens: []float64{-1.7}}
	assert.Equal(t, "0.0/18", rateTokens(st))
}

// A key with a reservation queue shows its tokens as the queue's: a full
// bucket next to 188 reserved tasks read as a contradiction.
func TestTokensOfAQueueSayWhoseTheyAre(t *testing.T) {
	st := throttle.Status{Limits: []throttle.Limit{throttle.PerSecond(5)}, InForce: []throttle.Limit{throttle.PerSecond(5)},
		Tokens: []float64{5}, Reservations: 188, QueuedFor: 37 * time.Second}
	v := newKeyView("slack", st, nil)
	tokens := keyColumns[2]
	require.Equal(t, "TOKENS", tokens.name)
	assert.Equal(t, "5.0/5 (for the queue)", tokens.value(v))
	st.Reservations, st.QueuedFor = 0, 0
	assert.Equal(t, "5.0/5", tokens.value(newKeyView("slack", st, nil)))
}
