package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// ProviderSpec describes one simulated third-party API: the quota it enforces
// on its own clock, and the limits the pipeline gives the throttle for it.
type ProviderSpec struct {
	// Name is the provider's name and its throttle key.
	Name string `json:"name"`
	// TaskType is the asynq task type of its sync jobs.
	TaskType string `json:"task_type"`
	// Quota is what the provider enforces: token-bucket tiers, all or none.
	Quota []throttle.Limit `json:"quota"`
	// Limits is what the pipeline sets with Limiter.SetLimits before the run.
	// Nil for a provider whose limit is learned from its response headers.
	Limits []throttle.Limit `json:"limits,omitempty"`
	// Guess is the conservative default every worker starts with
	// (throttle.WithKeyLimits) when Limits is nil.
	Guess []throttle.Limit `json:"guess,omitempty"`
	// HeaderLimit makes the provider announce its per-second limit in an
	// X-RateLimit-Limit header on every response, and nowhere else.
	HeaderLimit bool `json:"header_limit,omitempty"`
	// Reject is how a 429 says when to come back.
	Reject RejectStyle `json:"reject"`
	// Latency is the range of time a successful call takes.
	Latency [2]time.Duration `json:"latency"`
}

// RejectStyle is how a provider's 429 says when to come back: the headers
// real APIs use, each understood by throttle.FromResponse.
type RejectStyle int

const (
	// RetryAfterSeconds sends "Retry-After: 2" (Slack).
	RetryAfterSeconds RejectStyle = iota
	// ResetUnixTime sends "X-RateLimit-Reset: <unix seconds>" (GitHub).
	ResetUnixTime
)

// slackSpec is a Slack-like provider: two tiers, Retry-After on 429.
func slackSpec() ProviderSpec {
	return ProviderSpec{
		Name:     "slack",
		TaskType: "slack:sync_channel",
		Quota:    []throttle.Limit{throttle.PerSecond(5).WithBurst(5), throttle.PerMinute(120).WithBurst(30)},
		Limits:   []throttle.Limit{throttle.PerSecond(5).WithBurst(4), throttle.PerMinute(120).WithBurst(29)},
		Reject:   RetryAfterSeconds,
		Latency:  [2]time.Duration{20 * time.Millisecond, 60 * time.Millisecond},
	}
}

// githubSpec is a GitHub-like provider: one large quota, X-RateLimit-Reset
// (a Unix time) on 429.
func githubSpec() ProviderSpec {
	return ProviderSpec{
		Name:     "github",
		TaskType: "github:sync_repo",
		Quota:    []throttle.Limit{throttle.PerSecond(20)},
		Limits:   []throttle.Limit{throttle.PerSecond(20).WithBurst(18)},
		Reject:   ResetUnixTime,
		Latency:  [2]time.Duration{30 * time.Millisecond, 90 * time.Millisecond},
	}
}

// crmSpec is a provider that documents no limit: it shows it only in the
// X-RateLimit-Limit header of its responses.
func crmSpec() ProviderSpec {
	return ProviderSpec{
		Name:        "crm",
		TaskType:    "crm:sync_contacts",
		Quota:       []throttle.Limit{throttle.PerSecond(10)},
		Guess:       []throttle.Limit{throttle.PerSecond(2)},
		HeaderLimit: true,
		Reject:      RetryAfterSeconds,
		Latency:     [2]time.Duration{10 * time.Millisecond, 40 * time.Millisecond},
	}
}

// DefaultProviders returns the providers of a default run.
//
// Their quotas are scaled: real APIs count per minute or per hour; the demo
// compresses time so that a default run ends in well under 30 seconds.
//
// Our limits sit a token or two under each provider's burst. The limiter and
// the provider run the same token bucket, but a call reaches the provider a
// few milliseconds after the limiter admitted it, and not always the same
// few: two calls admitted 200 ms apart can arrive 190 ms apart, and a bucket
// run exactly empty on both sides then answers the second one with a 429.
// One token of slack absorbs rate × jitter (5/s × 200 ms). The header-only
// provider's limit is adopted as published, with no slack.
func DefaultProviders() []ProviderSpec {
	return []ProviderSpec{slackSpec(), githubSpec(), crmSpec()}
}

// Provider is a running simulated API on 127.0.0.1. It enforces its quota with
// token buckets on its own clock (time.Now, not Redis), answers excess with
// 429, and counts everything it answers so the run can be audited from the
// provider's side. It is safe for concurrent use.
type Provider struct {
	Spec ProviderSpec
	URL  string

	srv *http.Server

	mu       sync.Mutex
	tokens   []float64
	last     time.Time
	served   map[string]int // job ID -> 200s sent
	servedAt []time.Time
	tooMany  int
	rng      *rand.Rand
}

// ProviderStats is what a provider has answered so far.
type ProviderStats struct {
	Served     int // 200s
	Duplicates int // jobs served more than once
	TooMany    int // 429s
	First      time.Time
	Last       time.Time
}

// StartProvider serves spec on a free port of 127.0.0.1 until Close.
func StartProvider(spec ProviderSpec) (*Provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", spec.Name, err)
	}
	p := &Provider{
		Spec:   spec,
		URL:    "http://" + ln.Addr().String(),
		tokens: make([]float64, len(spec.Quota)),
		served: make(map[string]int),
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(spec.Name)))),
	}
	for i, q := range spec.Quota {
		p.tokens[i] = float64(burstOf(q))
	}
	p.last = time.Now()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sync/{job}", p.serveSync)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(fmt.Sprintf("provider %s: %v", spec.Name, err))
		}
	}()
	return p, nil
}

// Close stops the provider's HTTP server.
func (p *Provider) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return p.srv.Shutdown(ctx)
}

// Stats returns the provider's counters.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ProviderStats{TooMany: p.tooMany}
	for _, n := range p.served {
		s.Served += n
		if n > 1 {
			s.Duplicates++
		}
	}
	if len(p.servedAt) > 0 {
		s.First, s.Last = p.servedAt[0], p.servedAt[len(p.servedAt)-1]
	}
	return s
}

// ServedSince counts the 200s sent after t.
func (p *Provider) ServedSince(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for i := len(p.servedAt) - 1; i >= 0 && p.servedAt[i].After(t); i-- {
		n++
	}
	return n
}

// take spends one token of every tier, or none. When refused it returns how
// long until every tier has a token again.
func (p *Provider) take(now time.Time) (ok bool, wait time.Duration, remaining int) {
	elapsed := now.Sub(p.last).Seconds()
	if elapsed < 0 {
		elapsed = 0
	}
	p.last = now
	remaining = math.MaxInt
	var waitS float64
	for i, q := range p.Spec.Quota {
		t := math.Min(p.tokens[i]+elapsed*ratePerSecond(q), float64(burstOf(q)))
		p.tokens[i] = t
		if t < 1 {
			waitS = math.Max(waitS, (1-t)/ratePerSecond(q))
		}
	}
	if waitS > 0 {
		return false, time.Duration(waitS * float64(time.Second)), 0
	}
	for i := range p.tokens {
		p.tokens[i]--
		remaining = min(remaining, int(p.tokens[i]))
	}
	return true, 0, remaining
}

func (p *Provider) serveSync(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	now := time.Now()
	p.mu.Lock()
	ok, wait, remaining := p.take(now)
	if !ok {
		p.tooMany++
	}
	latency := p.Spec.Latency[0]
	if spread := p.Spec.Latency[1] - p.Spec.Latency[0]; spread > 0 {
		latency += time.Duration(p.rng.Int64N(int64(spread)))
	}
	p.mu.Unlock()

	h := w.Header()
	if p.Spec.HeaderLimit {
		h.Set("X-RateLimit-Limit", strconv.Itoa(p.Spec.Quota[0].Rate))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(max(remaining, 0)))
	}
	if !ok {
		// Round up: a client that comes back on the dot must find a token.
		secs := int64(math.Ceil(wait.Seconds()))
		switch p.Spec.Reject {
		case ResetUnixTime:
			h.Set("X-RateLimit-Remaining", "0")
			h.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(wait).Add(time.Second-1).Unix(), 10))
		default:
			h.Set("Retry-After", strconv.FormatInt(secs, 10))
		}
		http.Error(w, `{"ok":false,"error":"rate_limited"}`, http.StatusTooManyRequests)
		return
	}

	select {
	case <-time.After(latency):
	case <-r.Context().Done():
		return
	}
	p.mu.Lock()
	p.served[job]++
	p.servedAt = append(p.servedAt, time.Now())
	p.mu.Unlock()
	h.Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "job": job, "items": 1 + len(job)%7})
}

// burstOf is a limit's effective burst (0 means Rate, as in throttle.Limit).
func burstOf(l throttle.Limit) int {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

func ratePerSecond(l throttle.Limit) float64 { return float64(l.Rate) / l.Per.Seconds() }

// formatLimits renders limits compactly: "5/s burst 4 + 120/min burst 29".
func formatLimits(limits []throttle.Limit) string {
	return joinLimits(limits, "none", " burst ", " + ")
}

// formatLimitsShort is formatLimits for narrow columns: "5/s b4+120/min b29".
func formatLimitsShort(limits []throttle.Limit) string {
	return joinLimits(limits, "-", " b", "+")
}

func joinLimits(limits []throttle.Limit, none, burst, sep string) string {
	if len(limits) == 0 {
		return none
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		s := strconv.Itoa(l.Rate) + "/" + unitOf(l.Per)
		if b := burstOf(l); b != l.Rate {
			s += burst + strconv.Itoa(b)
		}
		parts[i] = s
	}
	return strings.Join(parts, sep)
}

func unitOf(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	}
	return d.String()
}

// servedCount is how many 200s the provider sent for job.
func (p *Provider) servedCount(job string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served[job]
}
