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
	// Limits is what the pipeline sets with Limiter.SetLimits before the run:
	// the operator's numbers, the ceiling of what the fleet learns from the
	// provider's responses (throttle.Observe).
	Limits []throttle.Limit `json:"limits"`
	// Publish makes the provider publish its quota on every response in the
	// IETF fields (draft-ietf-httpapi-ratelimit-headers): one policy per
	// tier of Quota in RateLimit-Policy ("default";q=10;w=1), and what is
	// left of each in RateLimit ("default";r=7;t=1: 7 calls left, the tier
	// full again in 1 s).
	Publish bool `json:"publish,omitempty"`
	// Reject is how a 429 says when to come back.
	Reject RejectStyle `json:"reject"`
	// Latency is the range of time a successful call takes.
	Latency [2]time.Duration `json:"latency"`
	// Shed makes the provider shed load once, as real APIs do when they are
	// overloaded (zero: never).
	Shed Shedding `json:"shed,omitzero"`
	// Stream makes the second half of the provider's jobs arrive one by one
	// (zero: every job is enqueued at the start).
	Stream Stream `json:"stream,omitzero"`
	// Tenants splits the provider's jobs between two customers of ours,
	// each job tagged with its customer (throttle.Tenant) (zero: the jobs
	// are nobody's in particular).
	Tenants TenantSplit `json:"tenants,omitzero"`
}

// TenantSplit is how a provider's jobs are split between two customers (the
// key's tenants): a heavy one, whose jobs are all in the backlog at the
// start, and a light one, whose few jobs arrive together a little later,
// behind that backlog. While both have jobs waiting, each gets half the
// provider's rate: the light customer's jobs run beside the backlog, not
// after it.
type TenantSplit struct {
	Heavy string `json:"heavy"`
	Light string `json:"light"`
	// LightJobs is how many of the provider's jobs are the light
	// customer's: at most a quarter of them (none below 4 jobs).
	LightJobs int `json:"light_jobs"`
	// LightAt is when the light customer's jobs are enqueued, counting
	// from the start.
	LightAt time.Duration `json:"light_at"`
}

// lightJobs is how many of jobs jobs are the light customer's.
func (t TenantSplit) lightJobs(jobs int) int {
	if t.Light == "" {
		return 0
	}
	return min(t.LightJobs, jobs/4)
}

// Shedding is a provider's one spell of load shedding: from At after it
// started, it answers every call for For with 429 and a Retry-After header
// (whatever its quota says), then serves its quota again.
type Shedding struct {
	At  time.Duration `json:"at"`
	For time.Duration `json:"for"`
}

// Stream is how the second half of a provider's jobs arrives: from From
// after the start, Rate jobs per second, as events (webhooks) would.
type Stream struct {
	From time.Duration `json:"from"`
	Rate float64       `json:"rate"`
}

// RejectStyle is how a provider's 429 says when to come back: the headers
// real APIs use, each understood by throttle.Observe.
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
		Limits:   []throttle.Limit{throttle.PerSecond(5), throttle.PerMinute(120).WithBurst(30)}, // the published numbers
		Reject:   RetryAfterSeconds,
		Latency:  [2]time.Duration{20 * time.Millisecond, 60 * time.Millisecond},
	}
}

// Slack's load shedding and event stream in a default run: from 3 s on,
// half its jobs arrive at 5/s; at 4 s, it sheds load for 3 s, while events
// keep coming, so that every server of the fleet meets the suspension.
const (
	streamFrom = 3 * time.Second
	streamRate = 5
	shedAt     = 4 * time.Second
	shedFor    = 3 * time.Second
)

// The CRM's customers in a default run: acme has the backlog; bolt's few
// jobs arrive half a second in, behind most of it.
const (
	heavyTenant = "acme"
	lightTenant = "bolt"
	lightJobs   = 4
	lightAt     = 500 * time.Millisecond
)

// githubSpec is a GitHub-like provider: one large quota, X-RateLimit-Reset
// (a Unix time) on 429.
func githubSpec() ProviderSpec {
	return ProviderSpec{
		Name:     "github",
		TaskType: "github:sync_repo",
		Quota:    []throttle.Limit{throttle.PerSecond(20)},
		Limits:   []throttle.Limit{throttle.PerSecond(20)}, // the published number
		Reject:   ResetUnixTime,
		Latency:  [2]time.Duration{30 * time.Millisecond, 90 * time.Millisecond},
	}
}

// crmSpec is a provider whose docs are stale: they say 20/s, the operator
// set that, but the provider enforces 10/s, and says so in the IETF
// RateLimit-Policy and RateLimit fields of every response. The fleet learns
// it from them (throttle.Observe) on the first responses.
func crmSpec() ProviderSpec {
	return ProviderSpec{
		Name:     "crm",
		TaskType: "crm:sync_contacts",
		Quota:    []throttle.Limit{throttle.PerSecond(10)},
		Limits:   []throttle.Limit{throttle.PerSecond(20)}, // what its docs say
		Publish:  true,
		Reject:   RetryAfterSeconds,
		Latency:  [2]time.Duration{10 * time.Millisecond, 40 * time.Millisecond},
	}
}

// DefaultProviders returns the providers of a default run of jobs jobs per
// provider.
//
// Their quotas are scaled: real APIs count per minute or per hour; the demo
// compresses time so that a default run ends in well under 30 seconds.
//
// Our limits are the numbers each provider publishes, not shaved: the
// limiter and the provider run the same token bucket, and a call reaches
// the provider a few milliseconds after the limiter admitted it, not always
// the same few; the middleware keeps room for that jitter itself
// (throttle.WithHeadroom), so the fleet draws no 429 at the exact quota.
// The CRM is configured at the number of its stale docs, above its quota:
// what keeps the fleet under it is what it publishes.
//
// Slack sheds load once, partway through: it answers 429 with Retry-After
// for shedFor, whatever its quota, and the fleet must stop calling it,
// every worker at once. Half its jobs arrive as a stream of events around
// then, so that every server has Slack tasks to hold back.
//
// The CRM's jobs are two customers': acme's backlog, and bolt's few jobs
// that arrive behind it. The CRM's rate is shared fairly between them
// while both wait (throttle.Tenant): bolt is not kept waiting until acme's
// backlog has drained.
func DefaultProviders() []ProviderSpec {
	slack := slackSpec()
	slack.Shed = Shedding{At: shedAt, For: shedFor}
	slack.Stream = Stream{From: streamFrom, Rate: streamRate}
	crm := crmSpec()
	crm.Tenants = TenantSplit{Heavy: heavyTenant, Light: lightTenant, LightJobs: lightJobs, LightAt: lightAt}
	return []ProviderSpec{slack, githubSpec(), crm}
}

// Provider is a running simulated API on 127.0.0.1. It enforces its quota with
// token buckets on its own clock (time.Now, not Redis), answers excess with
// 429, and counts everything it answers so the run can be audited from the
// provider's side. It is safe for concurrent use.
type Provider struct {
	Spec ProviderSpec
	URL  string

	srv *http.Server

	mu        sync.Mutex
	tokens    []float64
	last      time.Time
	served    map[string]int       // job ID -> 200s sent
	firstOK   map[string]time.Time // job ID -> its first 200
	servedAt  []time.Time
	overQuota int         // 429s for calls above the quota
	shed      int         // 429s sent while shedding load
	late      int         // of shed, those after shedGrace
	started   time.Time   // the run's start (zero: not yet)
	shedFirst time.Time   // the first load-shedding 429 (zero: none yet)
	tooManyAt []time.Time // when each 429 was sent
	rng       *rand.Rand
}

// shedGrace is how long after a provider's first load-shedding 429 a call
// may still reach it without breaking the fleet-wide suspension: calls
// already on their way, or run on a token leased before it (50 ms). A call
// later than that was, on a machine that is not overloaded, admitted after
// the suspension was in Redis.
const shedGrace = time.Second

// ProviderStats is what a provider has answered so far.
type ProviderStats struct {
	Served     int // 200s
	Duplicates int // jobs served more than once
	TooMany    int // 429s: OverQuota + Shed
	OverQuota  int // 429s for calls above the quota
	Shed       int // 429s sent while shedding load, whatever the quota
	LateShed   int // of Shed, calls that came over shedGrace after the first
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
		Spec:    spec,
		URL:     "http://" + ln.Addr().String(),
		tokens:  make([]float64, len(spec.Quota)),
		served:  make(map[string]int),
		firstOK: make(map[string]time.Time),
		rng:     rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(spec.Name)))),
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
	s := ProviderStats{TooMany: p.overQuota + p.shed, OverQuota: p.overQuota, Shed: p.shed, LateShed: p.late}
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

// First429After returns when the provider sent its first 429 after t (zero:
// none).
func (p *Provider) First429After(t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, at := range p.tooManyAt {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
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
func (p *Provider) take(now time.Time) (ok bool, wait time.Duration) {
	elapsed := now.Sub(p.last).Seconds()
	if elapsed < 0 {
		elapsed = 0
	}
	p.last = now
	var waitS float64
	for i, q := range p.Spec.Quota {
		t := math.Min(p.tokens[i]+elapsed*ratePerSecond(q), float64(burstOf(q)))
		p.tokens[i] = t
		if t < 1 {
			waitS = math.Max(waitS, (1-t)/ratePerSecond(q))
		}
	}
	if waitS > 0 {
		return false, time.Duration(waitS * float64(time.Second))
	}
	for i := range p.tokens {
		p.tokens[i]--
	}
	return true, 0
}

// StartClock tells the provider when the run started: its load shedding
// counts from then.
func (p *Provider) StartClock(t time.Time) {
	p.mu.Lock()
	p.started = t
	p.mu.Unlock()
}

// shedding reports whether the provider sheds load at now, and until when.
func (p *Provider) shedding(now time.Time) (bool, time.Time) {
	sh := p.Spec.Shed
	if sh.For <= 0 || p.started.IsZero() {
		return false, time.Time{}
	}
	from := p.started.Add(sh.At)
	until := from.Add(sh.For)
	return !now.Before(from) && now.Before(until), until
}

func (p *Provider) serveSync(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	now := time.Now()
	p.mu.Lock()
	shed, until := p.shedding(now)
	var (
		ok   bool
		wait time.Duration
	)
	switch {
	case shed:
		// Overloaded: no call counts against the quota, all are refused.
		wait = until.Sub(now)
		if p.shed == 0 {
			p.shedFirst = now
		} else if now.Sub(p.shedFirst) > shedGrace {
			p.late++
		}
		p.shed++
		p.tooManyAt = append(p.tooManyAt, now)
	default:
		if ok, wait = p.take(now); !ok {
			p.overQuota++
			p.tooManyAt = append(p.tooManyAt, now)
		}
	}
	latency := p.Spec.Latency[0]
	if spread := p.Spec.Latency[1] - p.Spec.Latency[0]; spread > 0 {
		latency += time.Duration(p.rng.Int64N(int64(spread)))
	}
	h := w.Header()
	if p.Spec.Publish {
		p.publish(h)
	}
	p.mu.Unlock()

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
	now = time.Now()
	p.served[job]++
	if _, ok := p.firstOK[job]; !ok {
		p.firstOK[job] = now
	}
	p.servedAt = append(p.servedAt, now)
	p.mu.Unlock()
	h.Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "job": job, "items": 1 + len(job)%7})
}

// publish sets the IETF RateLimit-Policy and RateLimit fields: each tier of
// the quota as a policy, and what is left of it now (whole calls) with the
// seconds until it is full again (rounded up, so that a client that waits
// them finds it full). p.mu is held.
func (p *Provider) publish(h http.Header) {
	policies := make([]string, len(p.Spec.Quota))
	left := make([]string, len(p.Spec.Quota))
	for i, q := range p.Spec.Quota {
		name := "default"
		if len(p.Spec.Quota) > 1 {
			name = fmt.Sprintf("tier%d", i+1)
		}
		tokens := max(p.tokens[i], 0)
		full := math.Ceil((float64(burstOf(q)) - tokens) / ratePerSecond(q))
		policies[i] = fmt.Sprintf("%q;q=%d;w=%d", name, q.N, int64(q.Per/time.Second))
		left[i] = fmt.Sprintf("%q;r=%d;t=%d", name, int(tokens), int64(full))
	}
	h.Set("RateLimit-Policy", strings.Join(policies, ", "))
	h.Set("RateLimit", strings.Join(left, ", "))
}

// burstOf is a limit's effective burst (0 means Rate, as in throttle.Limit).
func burstOf(l throttle.Limit) int {
	if l.Burst == 0 {
		return l.N
	}
	return l.Burst
}

func ratePerSecond(l throttle.Limit) float64 { return float64(l.N) / l.Per.Seconds() }

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
		s := strconv.Itoa(l.N) + "/" + unitOf(l.Per)
		if b := burstOf(l); b != l.N {
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

// servedTimes returns when the provider first served each of jobs (zero:
// not yet).
func (p *Provider) servedTimes(jobs []string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]time.Time, len(jobs))
	for i, j := range jobs {
		out[i] = p.firstOK[j]
	}
	return out
}

// servedCount is how many 200s the provider sent for job.
func (p *Provider) servedCount(job string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served[job]
}
