package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A strict fake LLM provider (scenario L, issue 24): each endpoint meters
// requests and tokens as two token buckets, continuously refilled at the
// stated per-minute rates, and admits a call only if both hold enough for
// it (1 request, its estimate in tokens), all or nothing; otherwise it
// answers 429. As OpenAI documents, the tokens are counted from the
// request's estimate at admission ("your rate limit is calculated as the
// maximum of max_tokens and the estimated number of tokens based on the
// character count of your request"; "usage needs are estimated from this
// value" - the rate-limits guide and the help centre's "Rate Limit
// Advice"): the client declares its estimate (prompt + max_tokens) and the
// provider charges it. With settle, the provider meters usage instead: the
// estimate is charged at admission and, when the call completes, the charge
// is settled to the call's usage (the difference refunded, or the excess
// charged, which may take the bucket below zero; the response's headers
// are as of before the settle). Every response carries
// OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers,
// a 429 also retry-after and OpenAI's error body; a 200 reports the call's
// usage as {"usage":{"total_tokens":N}}.

// llmLimits are one endpoint's stated limits and how its buckets hold them.
type llmLimits struct {
	RPM, TPM int // requests and tokens per minute, as stated
	// Capacity is how much of the rate each bucket holds at once: a minute
	// (the stated limit as a burst) or a second ("60 RPM enforced as 1/s").
	Capacity time.Duration
	// Settle settles each admitted call's charge to its usage when it
	// completes; without it the estimate stays charged.
	Settle bool
}

func (l llmLimits) requestRate() float64 { return float64(l.RPM) / 60 }
func (l llmLimits) tokenRate() float64   { return float64(l.TPM) / 60 }

// requestCapacity and tokenCapacity are what the full buckets hold.
func (l llmLimits) requestCapacity() float64 { return l.requestRate() * l.Capacity.Seconds() }
func (l llmLimits) tokenCapacity() float64   { return l.tokenRate() * l.Capacity.Seconds() }

// llmBucket is one unit's bucket: rate per second, capacity at once. Its
// level can go below zero when a call is settled above its estimate.
type llmBucket struct {
	rate, capacity, level float64
	last                  time.Time
}

// llmEps absorbs float rounding only.
const llmEps = 1e-9

func (b *llmBucket) refill(now time.Time) {
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.level = math.Min(b.capacity, b.level+el*b.rate)
		b.last = now
	}
}

// charge takes n (a refund when negative: never above the capacity).
func (b *llmBucket) charge(n float64) { b.level = math.Min(b.capacity, b.level-n) }

// wait is how long until the bucket holds need (0 if it does).
func (b *llmBucket) wait(need float64) time.Duration {
	if b.level >= need-llmEps {
		return 0
	}
	return time.Duration((need - b.level) / b.rate * float64(time.Second))
}

// untilFull is OpenAI's reset: the time until the bucket is full again.
func (b *llmBucket) untilFull() time.Duration { return b.wait(b.capacity) }

// llmModel is one endpoint's two buckets, on a clock its caller gives.
type llmModel struct {
	lim              llmLimits
	requests, tokens llmBucket
}

func newLLMModel(lim llmLimits, now time.Time) *llmModel {
	rc, tc := lim.requestCapacity(), lim.tokenCapacity()
	return &llmModel{lim: lim,
		requests: llmBucket{rate: lim.requestRate(), capacity: rc, level: rc, last: now},
		tokens:   llmBucket{rate: lim.tokenRate(), capacity: tc, level: tc, last: now}}
}

func (m *llmModel) refill(now time.Time) {
	m.requests.refill(now)
	m.tokens.refill(now)
}

// admit decides a call declaring estimate tokens at now. It is admitted,
// and both buckets charged, only if they hold 1 request and estimate
// tokens; otherwise neither is charged and short names the units that
// lacked ("requests", "tokens").
func (m *llmModel) admit(now time.Time, estimate int) (ok bool, short []string) {
	m.refill(now)
	if m.requests.wait(1) > 0 {
		short = append(short, "requests")
	}
	if m.tokens.wait(float64(estimate)) > 0 {
		short = append(short, "tokens")
	}
	if len(short) > 0 {
		return false, short
	}
	m.requests.charge(1)
	m.tokens.charge(float64(estimate))
	return true, nil
}

// settle charges the difference between a completed call's usage and the
// estimate it was admitted with, if the endpoint settles; it returns the
// tokens charged (negative: refunded).
func (m *llmModel) settle(now time.Time, estimate, used int) int {
	if !m.lim.Settle {
		return 0
	}
	m.refill(now)
	m.tokens.charge(float64(used - estimate))
	return used - estimate
}

// retryAfter is how long until both buckets hold what a call of estimate
// tokens needs.
func (m *llmModel) retryAfter(now time.Time, estimate int) time.Duration {
	m.refill(now)
	return max(m.requests.wait(1), m.tokens.wait(float64(estimate)))
}

// setHeaders sets OpenAI's rate-limit headers as of now: the stated
// per-minute limits, what each bucket holds (whole units, never below 0)
// and the time until it is full again.
func (m *llmModel) setHeaders(now time.Time, h http.Header) {
	m.refill(now)
	for _, u := range []struct {
		name  string
		limit int
		b     *llmBucket
	}{{"requests", m.lim.RPM, &m.requests}, {"tokens", m.lim.TPM, &m.tokens}} {
		h.Set("x-ratelimit-limit-"+u.name, strconv.Itoa(u.limit))
		h.Set("x-ratelimit-remaining-"+u.name, strconv.Itoa(int(math.Floor(max(u.b.level, 0)+llmEps))))
		h.Set("x-ratelimit-reset-"+u.name, openAIDuration(u.b.untilFull()))
	}
}

// openAIDuration formats d as OpenAI's x-ratelimit-reset-* headers do
// ("6m0s", "1s", "12ms": Go's duration format), rounded up to the
// millisecond, so a client that waits that long finds the bucket full.
func openAIDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return (ms * time.Millisecond).String()
}

// llmEvent is one change to an endpoint's buckets: an admission (1
// request, the estimate) or a completion (the usage, and with settle the
// tokens charged to settle it).
type llmEvent struct {
	at               time.Time
	requests, tokens int // charged; tokens < 0 is a refund
	used             int // a completion's usage
	done             bool
}

// llmEndpoint is one endpoint's model and what it saw.
type llmEndpoint struct {
	model  *llmModel
	start  time.Time
	events []llmEvent
	// calls, admitted and 429s (by the unit that lacked; a call short of
	// both counts in each).
	calls, admitted, limited, shortRequests, shortTokens int
}

// llmProvider serves GET /l/NAME?estimate=E&used=U on loopback, each name
// by its endpoint; an admitted call takes latency (the generation) before
// it completes.
type llmProvider struct {
	loopback
	latency time.Duration
	now     func() time.Time

	mu        sync.Mutex
	endpoints map[string]*llmEndpoint
}

func newLLMProvider(latency time.Duration) *llmProvider {
	p := &llmProvider{latency: latency, now: time.Now, endpoints: map[string]*llmEndpoint{}}
	p.loopback = newLoopback(p.serve)
	return p
}

// add installs endpoint name with limits lim, its buckets full now.
func (p *llmProvider) add(name string, lim llmLimits) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.endpoints[name] = &llmEndpoint{model: newLLMModel(lim, now), start: now}
}

// snapshot is a copy of what endpoint name saw so far (nil if none).
func (p *llmProvider) snapshot(name string) *llmEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep := p.endpoints[name]
	if ep == nil {
		return nil
	}
	c := *ep
	c.model = nil
	c.events = append([]llmEvent(nil), ep.events...)
	return &c
}

// record counts a decided call; an admission is an event.
func (ep *llmEndpoint) record(now time.Time, admitted bool, short []string, estimate int) {
	ep.calls++
	if admitted {
		ep.admitted++
		ep.events = append(ep.events, llmEvent{at: now, requests: 1, tokens: estimate})
		return
	}
	ep.limited++
	for _, u := range short {
		if u == "requests" {
			ep.shortRequests++
		} else {
			ep.shortTokens++
		}
	}
}

func (p *llmProvider) serve(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/l/")
	estimate, used, err := llmQuery(r.URL.Query())
	if !ok || err != nil {
		http.Error(w, fmt.Sprintf("bad call %s: %v", r.URL, err), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	ep := p.endpoints[name]
	if ep == nil {
		p.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	now := p.now()
	admitted, short := ep.model.admit(now, estimate)
	ep.record(now, admitted, short, estimate)
	ep.model.setHeaders(now, w.Header())
	w.Header().Set(llmArrivedHeader, strconv.FormatInt(now.UnixMicro(), 10))
	var refusal llmRefusal
	if !admitted {
		refusal = newLLMRefusal(ep.model, now, short, estimate)
	}
	p.mu.Unlock()
	if !admitted {
		refusal.write(w)
		return
	}
	if p.latency > 0 && sleepCtx(r.Context(), p.latency) != nil {
		return // the client left: the call never completes
	}
	p.mu.Lock()
	now = p.now()
	// The headers are as of the response, the call's estimate still
	// charged: OpenAI shows the reservation a response holds, "then
	// adjusted accordingly once the Response is completed" (its Realtime
	// API's rate_limits.updated event), and a response's headers go out
	// before its body ends.
	ep.model.setHeaders(now, w.Header())
	charged := ep.model.settle(now, estimate, used)
	ep.events = append(ep.events, llmEvent{at: now, tokens: charged, used: used, done: true})
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"object":"chat.completion","usage":{"total_tokens":%d}}`, used)
}

// llmArrivedHeader tells the client when the provider decided its call
// (Unix microseconds), for the bench's own measure of the time from a
// throttle's decision to the provider's (scenario L's ours); no provider
// sends it.
const llmArrivedHeader = "X-Bench-Arrived-Us"

// llmArrived is when the provider decided the call of resp (false if it
// does not say).
func llmArrived(resp *http.Response) (time.Time, bool) {
	us, err := strconv.ParseInt(resp.Header.Get(llmArrivedHeader), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// llmQuery reads a call's estimate and usage (tokens, both >= 0).
func llmQuery(q url.Values) (estimate, used int, err error) {
	if estimate, err = strconv.Atoi(q.Get("estimate")); err != nil || estimate < 0 {
		return 0, 0, fmt.Errorf("estimate %q", q.Get("estimate"))
	}
	if used, err = strconv.Atoi(q.Get("used")); err != nil || used < 0 {
		return 0, 0, fmt.Errorf("used %q", q.Get("used"))
	}
	return estimate, used, nil
}

// llmRefusal is a 429 as OpenAI answers it: retry-after in whole seconds
// (at least 1) and an error body naming the unit that lacked.
type llmRefusal struct {
	retryAfter    time.Duration
	unit, message string
}

func newLLMRefusal(m *llmModel, now time.Time, short []string, estimate int) llmRefusal {
	wait := m.retryAfter(now, estimate)
	unit, limit, per, requested := short[0], m.lim.RPM, "requests per min (RPM)", 1
	if unit == "tokens" {
		limit, per, requested = m.lim.TPM, "tokens per min (TPM)", estimate
	}
	return llmRefusal{retryAfter: wait, unit: unit, message: fmt.Sprintf(
		"Rate limit reached on %s: Limit %d, Requested %d. Please try again in %s.", per, limit, requested, openAIDuration(wait))}
}

func (r llmRefusal) write(w http.ResponseWriter) {
	w.Header().Set("retry-after", strconv.Itoa(max(int(math.Ceil(r.retryAfter.Seconds())), 1)))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	body := map[string]any{"error": map[string]any{"message": r.message, "type": r.unit, "param": nil, "code": "rate_limit_exceeded"}}
	_ = json.NewEncoder(w).Encode(body)
}

// call makes one call to endpoint name declaring estimate tokens, whose
// usage will be used tokens. It returns the response (body read and
// closed) and the usage its body reports (0 for a 429); anything but 200
// or 429 is an error.
func (p *llmProvider) call(ctx context.Context, name string, estimate, used int) (*http.Response, int, error) {
	u := fmt.Sprintf("%s/l/%s?estimate=%d&used=%d", p.srv.URL, url.PathEscape(name), estimate, used)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return resp, 0, nil
	case http.StatusOK:
		var b struct {
			Usage struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, 0, fmt.Errorf("llm provider %s: usage: %w", name, err)
		}
		return resp, b.Usage.TotalTokens, nil
	}
	return nil, 0, fmt.Errorf("llm provider %s: %s", name, resp.Status)
}
