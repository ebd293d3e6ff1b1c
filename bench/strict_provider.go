package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Provider models of scenario E: strict quotas of the kinds providers
// publish, each enforced exactly and answering every call above it with 429,
// each sending the headers such a provider sends.

// quotaModel decides the calls of one endpoint.
type quotaModel interface {
	// serve decides a call at now, sets the headers of its response and
	// reports whether the call is admitted (else the response is a 429).
	serve(now time.Time, h http.Header) bool
}

// bucketModel is a token bucket (Stripe-like): Rate per second, Burst at
// once; a 429 carries Retry-After in whole seconds, at least 1.
type bucketModel struct{ b bucket }

func newBucketModel(rate, burst int, now time.Time) *bucketModel {
	return &bucketModel{b: bucket{q: quota{Rate: float64(rate), Burst: float64(burst)}, tokens: float64(burst), last: now}}
}

func (m *bucketModel) serve(now time.Time, h http.Header) bool {
	ok, wait := m.b.take(now)
	if !ok {
		h.Set("Retry-After", strconv.Itoa(max(int(math.Ceil(wait.Seconds())), 1)))
	}
	return ok
}

// windowModel is a fixed window: at most n admitted calls in each window
// [k*w, (k+1)*w) of the provider's clock (Unix time), so windows are aligned
// to whole seconds. It sends GitHub's headers (X-RateLimit-Limit,
// -Remaining, -Used, -Reset as a Unix time, -Resource; a 429 says no more)
// or, with ietf, the IETF draft's RateLimit-Policy and RateLimit (and
// Retry-After on a 429). From halveAt on (zero: never), n is halved.
type windowModel struct {
	n       int
	w       time.Duration
	ietf    bool
	halveAt time.Time

	idx   int64 // current window
	count int   // admitted in it
}

func (m *windowModel) quota(now time.Time) int {
	if !m.halveAt.IsZero() && !now.Before(m.halveAt) {
		return m.n / 2
	}
	return m.n
}

func (m *windowModel) serve(now time.Time, h http.Header) bool {
	if idx := now.UnixNano() / int64(m.w); idx != m.idx {
		m.idx, m.count = idx, 0
	}
	n := m.quota(now)
	ok := m.count < n
	if ok {
		m.count++
	}
	end := time.Unix(0, (m.idx+1)*int64(m.w))
	left := max(n-m.count, 0)
	if m.ietf {
		t := int(math.Ceil(end.Sub(now).Seconds()))
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, n, int(m.w/time.Second)))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, left, t))
		if !ok {
			h.Set("Retry-After", strconv.Itoa(max(t, 1)))
		}
		return ok
	}
	h.Set("X-RateLimit-Limit", strconv.Itoa(n))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(left))
	h.Set("X-RateLimit-Used", strconv.Itoa(m.count))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(end.Unix(), 10))
	h.Set("X-RateLimit-Resource", "core")
	return ok
}

// slidingModel is a sliding log: at most n admitted calls in any window of
// length w (a call at t counts until t+w). A 429 carries Retry-After in
// whole seconds (at least 1), Slack-like, and nothing else.
type slidingModel struct {
	n   int
	w   time.Duration
	log []time.Time // admitted calls still in the window, oldest first
}

func (m *slidingModel) serve(now time.Time, h http.Header) bool {
	i := 0
	for i < len(m.log) && !m.log[i].After(now.Add(-m.w)) {
		i++
	}
	m.log = m.log[i:]
	if len(m.log) < m.n {
		m.log = append(m.log, now)
		return true
	}
	wait := m.log[len(m.log)-m.n].Add(m.w).Sub(now)
	h.Set("Retry-After", strconv.Itoa(max(int(math.Ceil(wait.Seconds())), 1)))
	return false
}

// callRecord is one call as its endpoint saw it.
type callRecord struct {
	at time.Time
	ok bool
}

// strictProvider serves GET /e/NAME on loopback, each name by its model, and
// records every call.
type strictProvider struct {
	loopback

	mu     sync.Mutex
	models map[string]quotaModel
	calls  map[string][]callRecord
}

func newStrictProvider() *strictProvider {
	p := &strictProvider{}
	p.reset(nil)
	p.loopback = newLoopback(p.serve)
	return p
}

// reset installs fresh models and forgets every call.
func (p *strictProvider) reset(models map[string]quotaModel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.models = models
	p.calls = make(map[string][]callRecord, len(models))
}

// snapshot returns the calls endpoint name has seen so far.
func (p *strictProvider) snapshot(name string) []callRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]callRecord(nil), p.calls[name]...)
}

func (p *strictProvider) serve(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/e/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	p.mu.Lock()
	m := p.models[name]
	if m == nil {
		p.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	now := time.Now()
	admitted := m.serve(now, w.Header())
	p.calls[name] = append(p.calls[name], callRecord{at: now, ok: admitted})
	p.mu.Unlock()
	if !admitted {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// call makes one request to endpoint name and returns the response (body
// drained and closed).
func (p *strictProvider) call(ctx context.Context, name string) (*http.Response, error) {
	return p.get(ctx, "/e/"+name, name)
}
