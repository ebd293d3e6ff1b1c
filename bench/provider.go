package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// quota is a provider's rate limit: Rate calls per second, Burst at once.
type quota struct {
	Rate  float64
	Burst float64
}

// bucket is the provider's own, strict token bucket on the harness clock.
type bucket struct {
	q      quota
	tokens float64
	last   time.Time
}

// tokenEps absorbs float rounding only: a call is admitted when a whole
// token (less 1e-9) is there.
const tokenEps = 1e-9

// take reports whether a call is admitted at now, and otherwise how long
// until a token is there.
func (b *bucket) take(now time.Time) (bool, time.Duration) {
	b.refill(now)
	if b.tokens >= 1-tokenEps {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / b.q.Rate * float64(time.Second))
}

// refill adds the tokens the rate gave since the last call, up to the
// burst.
func (b *bucket) refill(now time.Time) {
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(b.q.Burst, b.tokens+el*b.q.Rate)
		b.last = now
	}
}

// endpointStats counts what one provider endpoint saw.
type endpointStats struct {
	calls, limited atomic.Int64
	mu             sync.Mutex
	limitedAt      []time.Duration // since reset, first few 429s only
}

// maxLimitedAt is how many 429 instants an endpoint keeps for the report.
const maxLimitedAt = 5

func (s *endpointStats) firstLimited() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.limitedAt...)
}

// provider simulates third-party APIs on loopback: GET /call/NAME. An
// endpoint with a quota answers 429 (with Retry-After in whole seconds, as
// real APIs do) to every call its bucket cannot cover; others always 200.
type provider struct {
	loopback

	mu      sync.Mutex
	since   time.Time // last reset
	buckets map[string]*bucket
	stats   map[string]*endpointStats
}

func newProvider() *provider {
	p := &provider{}
	p.reset(nil)
	p.loopback = newLoopback(p.serve)
	return p
}

// loopback is a provider's HTTP server on loopback and the client that
// calls it (enough idle connections for a whole fleet).
type loopback struct {
	srv    *httptest.Server
	client *http.Client
}

func newLoopback(serve http.HandlerFunc) loopback {
	return loopback{
		srv: httptest.NewServer(serve),
		client: &http.Client{
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        1024,
				MaxIdleConnsPerHost: 1024,
				IdleConnTimeout:     time.Minute,
			},
		},
	}
}

func (l loopback) Close() {
	l.client.CloseIdleConnections()
	l.srv.Close()
}

// get calls path on the server and drains the response; anything but 200
// or 429 is an error.
func (l loopback) get(ctx context.Context, path, name string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.srv.URL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return nil, fmt.Errorf("provider %s: %s", name, resp.Status)
	}
	return resp, nil
}

// reset forgets all counts and gives each named endpoint a quota whose
// bucket starts full now.
func (p *provider) reset(quotas map[string]quota) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buckets = make(map[string]*bucket, len(quotas))
	p.stats = make(map[string]*endpointStats)
	now := time.Now()
	p.since = now
	for name, q := range quotas {
		p.buckets[name] = &bucket{q: q, tokens: q.Burst, last: now}
	}
}

func (p *provider) endpoint(name string) *endpointStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats[name]
	if s == nil {
		s = &endpointStats{}
		p.stats[name] = s
	}
	return s
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/call/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	now := time.Now()
	p.mu.Lock()
	s := p.stats[name]
	if s == nil {
		s = &endpointStats{}
		p.stats[name] = s
	}
	allowed, wait := true, time.Duration(0)
	if b := p.buckets[name]; b != nil {
		allowed, wait = b.take(now)
	}
	since := p.since
	p.mu.Unlock()
	s.calls.Add(1)
	if !allowed {
		s.limited.Add(1)
		s.mu.Lock()
		if len(s.limitedAt) < maxLimitedAt {
			s.limitedAt = append(s.limitedAt, now.Sub(since))
		}
		s.mu.Unlock()
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// call makes one request to endpoint name and returns the response (body
// drained and closed).
func (p *provider) call(ctx context.Context, name string) (*http.Response, error) {
	return p.get(ctx, "/call/"+name, name)
}
