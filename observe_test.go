package throttle_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/logtest"
	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// windowProvider is a strict provider with a fixed window of quota calls
// per second (aligned to its clock) that publishes its quota in the IETF
// fields and answers 429 above it.
type windowProvider struct {
	mu     sync.Mutex
	quota  int
	window int64 // current window (Unix second)
	used   int
	calls  []time.Time
	denied []time.Time
}

func (p *windowProvider) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if s := now.Unix(); s != p.window {
		p.window, p.used = s, 0
	}
	reset := time.Unix(p.window+1, 0).Sub(now)
	t := int(reset.Seconds() + 0.999)
	w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, p.quota))
	if p.used >= p.quota {
		p.denied = append(p.denied, now)
		w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=0;t=%d`, t))
		w.Header().Set("Retry-After", fmt.Sprint(t))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	p.used++
	p.calls = append(p.calls, now)
	w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, p.quota-p.used, t))
}

// A key configured well above the provider's real quota learns it from the
// provider's headers through Observe: the whole fleet follows the published
// quota (no 429 once learned), Inspect shows the configured limit against the
// one in force, and the change is logged once across the fleet.
func TestE2EObserveLearnsThePublishedQuota(t *testing.T) {
	t.Parallel()
	prov := &windowProvider{quota: 10}
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)
	logs := &logtest.Recorder{}
	f := startFleet(t, fleetConfig{
		opts: []throttle.Option{throttle.WithLogger(logs.Logger())},
		handler: func(ctx context.Context, task *asynq.Task) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return throttle.Observe(ctx, resp)
		},
	})
	// The operator's number is 10x the real quota (a stale doc, a shared
	// account): only what the provider says keeps the fleet under it.
	f.setLimits("crm", throttle.Window(100, time.Second))
	start := time.Now()
	lag := redistest.StartLagMeter()
	f.enqueue("crm", "job", 100)
	f.waitDone(100, 60*time.Second)
	worst := lag.End()
	f.audit(100)

	st, err := throttle.NewLimiter(f.rdb).Inspect(context.Background(), "crm")
	require.NoError(t, err)
	assert.Equal(t, []throttle.Limit{throttle.Window(100, time.Second)}, st.Limits, "configured: the ceiling")
	assert.Equal(t, []throttle.Limit{throttle.Window(10, time.Second)}, st.InForce, "in force: the published quota")
	assert.Greater(t, st.LearnedFor[0], 9*time.Minute)
	assert.Len(t, logs.Find("publishes a lower quota"), 1, "the learned quota is logged once across the fleet")

	prov.mu.Lock()
	defer prov.mu.Unlock()
	var late int
	for _, d := range prov.denied {
		if d.Sub(start) > 2*time.Second {
			late++
		}
	}
	perSecond := map[int]int{}
	for _, c := range prov.calls {
		perSecond[int(c.Sub(start)/time.Second)]++
	}
	t.Logf("provider: %d calls, %d 429s (%d after the first 2 s), drained in %v; calls per second %v",
		len(prov.calls), len(prov.denied), late, time.Since(start).Round(100*time.Millisecond), perSecond)
	// The headroom (20 ms) covers calls that reach the provider within it
	// of their decisions; a call this process held back longer (a loaded
	// machine, -race) may land in the provider's next second: one 429 per
	// call the quota allows in the worst lag past the headroom. Unlearned,
	// the fleet would draw some 90.
	allowed := 0
	if over := worst - 20*time.Millisecond; over > 0 {
		allowed = int(math.Ceil(float64(prov.quota) * over.Seconds()))
	}
	assert.LessOrEqual(t, late, allowed, "429s once the quota was learned (%d allowed for the process's worst lag, %v)", allowed, worst)
}
