package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

var (
	// reTenantBacklog is a tenant's backlog in get's table (normalised: two
	// spaces between columns); reCostUnits the same in why's sentence. They
	// shrink as time passes.
	reTenantBacklog = regexp.MustCompile(`(?m)^(  \S+  \d+  \S+  )\d+\.\d(  \d+)$`)
	reCostUnits     = regexp.MustCompile(`has \d+\.\d cost units`)
)

// get shows the tenants of a key, with their weights, shares, backlogs and
// work admitted, and why tells a task of its tenant's share, for tasks
// booked by the library's Enqueue for three tenants (one the default);
// weights sets and resets the weights.
func TestGetAndWhyShowTheTenantsOfAKey(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	tr := &transcript{t: t, redisURL: "redis://" + srv.Addr}
	tr.run("set", "llm", "30/m")
	tr.run("weights", "llm", "gold=3", "silver=2")

	lim := throttle.NewLimiter(rdb)
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	for i := range 4 {
		for _, tenant := range []string{"gold", "plain", ""} {
			opts, id := []asynq.Option{throttle.Key("llm")}, fmt.Sprintf("default-%d", i)
			if tenant != "" {
				opts, id = append(opts, throttle.Tenant(tenant)), fmt.Sprintf("%s-%d", tenant, i)
			}
			_, err := lim.Enqueue(ctx, client, mustTask(t, "llm:chat", nil, opts...), asynq.TaskID(id))
			require.NoError(t, err)
		}
	}
	tr.run("get", "llm")
	tr.run("why", "gold-3")
	tr.run("why", "default-3")
	tr.run("weights", "llm", "--reset")
	out := reTenantBacklog.ReplaceAllString(normalise(tr.b.String()), "$1<n>$2")
	golden(t, "tenants", reCostUnits.ReplaceAllString(out, "has <n> cost units"))

	// What the golden hides: the backlogs, in cost units booked and not yet
	// due (4 tasks each, some due already).
	r := cli(t, tr.redisURL, "get", "llm", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Len(t, v.Tenants, 3, r.stdout)
	names := map[string]tenantView{}
	sum := 0.0
	for _, tv := range v.Tenants {
		names[tv.Name] = tv
		sum += tv.Share
		assert.Equal(t, 1, tv.Weight, "weights reset: %+v", tv)
		assert.Greater(t, tv.Backlog, 0.0, "%+v", tv)
		assert.LessOrEqual(t, tv.Backlog, 5.0, "about its 4 tasks: %+v", tv)
	}
	assert.InDelta(t, 1, sum, 1e-9, "the shares of the tenants with work booked add up to the rate")
	assert.Contains(t, names, "", "the default tenant")
	assert.Contains(t, names, "gold")
	assert.Contains(t, names, "plain")

	r = cli(t, tr.redisURL, "why", "plain-3", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var w whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &w))
	require.NotNil(t, w.Tenant, w.Sentence)
	assert.Equal(t, "plain", w.Tenant.Name)
	assert.InDelta(t, 1.0/3, w.Tenant.Share, 1e-9)
	assert.Contains(t, w.Sentence, `(key "llm", tenant "plain")`)
	assert.Contains(t, w.Sentence, `Its tenant "plain" (weight 1) gets 33.3% of key "llm"'s rate while 3 tenants have work booked`)

	// The weights the command set are those the library reads.
	r = cli(t, tr.redisURL, "weights", "llm", "plain=7")
	require.Equal(t, 0, r.code, r.stderr)
	st, err := lim.Inspect(ctx, "llm")
	require.NoError(t, err)
	for _, ts := range st.Tenants {
		want := 1
		if ts.Name == "plain" {
			want = 7
		}
		assert.Equal(t, want, ts.Weight, ts.Name)
	}
	assert.Regexp(t, `(?m)^  plain +7 +77\.8% `, r.stdout, "7 of 9")
}

// A key without tenants shows no tenants block, nor a tenants field.
func TestGetShowsNoTenantsBlockWithoutTenants(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	r := cli(t, url, "set", "slack", "1/s")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "tenants")
	r = cli(t, url, "get", "slack", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "tenants")
}

func TestTenantsSummarySaysWhenMoreHaveWorkBooked(t *testing.T) {
	few := []tenantView{{Name: "a", Weight: 1, Share: 0.5}, {Name: "", Weight: 1, Share: 0.5}, {Name: "idle", Weight: 4}}
	assert.Equal(t, "2 with work booked", tenantsSummary(few))
	assert.Equal(t, "none with work booked", tenantsSummary([]tenantView{{Name: "idle", Weight: 4}}))
	assert.Equal(t, "1 with work booked", tenantsSummary([]tenantView{{Name: "a", Weight: 1, Share: 1}}))

	var many []tenantView
	for i := range maxActiveShown {
		many = append(many, tenantView{Name: fmt.Sprint("t", i), Weight: 1, Share: 1.0 / 101})
	}
	assert.Equal(t, "more than 100 with work booked (the 100 next in line shown)", tenantsSummary(many))
	for i := range many {
		many[i].Share = 1.0 / maxActiveShown
	}
	assert.Equal(t, "100 with work booked", tenantsSummary(many), "exactly 100: their shares make the whole rate")

	for share, want := range map[float64]string{0: "-", 0.6: "60.0%", 1.0 / 3: "33.3%", 1: "100.0%", 1e-6: "<0.1%"} {
		assert.Equal(t, want, formatShare(share), "%v", share)
	}
}

// why's tenant sentence in each case: alone, idle, among others, past the
// 100 tenants Inspect reads, and the default tenant of a shared key.
func TestWhyTellsOfTheTenantInEachCase(t *testing.T) {
	active := func(n int, share float64) []throttle.TenantStatus {
		var ts []throttle.TenantStatus
		for i := range n {
			ts = append(ts, throttle.TenantStatus{Name: fmt.Sprint("t", i), Weight: 1, Share: share, Backlog: 2})
		}
		return ts
	}
	for _, tc := range []struct {
		name, tenant string
		has          bool
		tenants      []throttle.TenantStatus
		want         string // "" for no sentence
	}{
		{"alone", "gold", true, []throttle.TenantStatus{{Name: "gold", Weight: 3, Share: 1, Backlog: 5, Admitted: 2}},
			` Its tenant "gold" (weight 3) gets all of key "llm"'s rate, the only tenant with work booked, and has 5.0 cost units booked and not yet due (2 admitted since it last had none).`},
		{"idle", "gold", true, []throttle.TenantStatus{{Name: "gold", Weight: 3}},
			` Its tenant "gold" (weight 3) has no work booked on key "llm" now.`},
		{"unknown", "new", true, nil,
			` Its tenant "new" (weight 1) has no work booked on key "llm" now.`},
		{"among others", "t1", true, active(4, 0.25),
			` Its tenant "t1" (weight 1) gets 25.0% of key "llm"'s rate while 4 tenants have work booked, and has 2.0 cost units booked and not yet due (0 admitted since it last had none).`},
		{"past the 100 read", "t100", true, active(100, 1.0/200),
			` Its tenant "t100" is not among the 100 tenants next in line on key "llm", whose shares add up to less than its whole rate.`},
		{"default of a shared key", "", false, append(active(1, 0.5), throttle.TenantStatus{Name: "", Weight: 1, Share: 0.5, Backlog: 1}),
			` It counts as the default tenant (no throttle-tenant header; weight 1), which gets 50.0% of key "llm"'s rate while 2 tenants have work booked, and has 1.0 cost units booked and not yet due (0 admitted since it last had none).`},
		{"default, key not shared", "", false, nil, ""},
		{"default idle on a shared key", "", false, active(2, 0.5), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &explanation{key: "llm", tenant: tc.tenant, hasTenant: tc.has,
				st: throttle.Status{Limits: []throttle.Limit{throttle.PerSecond(1)}, Tenants: tc.tenants}}
			v := e.withTenant(whyView{Reason: reasonReserved, Sentence: "S."})
			assert.Equal(t, "S."+tc.want, v.Sentence)
			assert.Equal(t, tc.want != "", v.Tenant != nil)
			// Not for a task that never waits for its share.
			v = e.withTenant(whyView{Reason: reasonRejected, Sentence: "S."})
			assert.Equal(t, "S.", v.Sentence)
		})
	}
}

// A tenant header the middleware would refuse is said so.
func TestWhySaysATenantHeaderIsInvalid(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	require.NoError(t, throttle.NewLimiter(rdb).SetLimits(context.Background(), "llm", throttle.PerSecond(1)))
	client := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { client.Close() })
	_, err := client.Enqueue(asynq.NewTaskWithHeaders("llm:chat", nil, map[string]string{throttle.HeaderKey: "llm", "throttle-tenant": "a{b}"}),
		asynq.TaskID("t-badtenant"), asynq.ProcessIn(time.Minute))
	require.NoError(t, err)
	r := cli(t, "redis://"+srv.Addr, "why", "t-badtenant", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var v whyView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, reasonInvalidKey, v.Reason)
	assert.Contains(t, v.Sentence, `cannot be throttled: header throttle-tenant: throttle: invalid key: "a{b}"`)
}
