package throttle

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// Observe learns from a provider's response what its quota is, fleet-wide,
// and returns a *RateLimitedError for a 429 (or a 503 with Retry-After),
// waiting the response's Retry-After, else the reset it states; nil for any
// other response. Call it in a handler run by the middleware, on every
// response from the provider; the task's key and limiter come from ctx:
//
//	resp, err := client.Do(req.WithContext(ctx))
//	if err != nil {
//		return err
//	}
//	defer resp.Body.Close()
//	if err := throttle.Observe(ctx, resp); err != nil {
//		return err // a 429: the key is suspended fleet-wide
//	}
//
// It reads the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers), RateLimit-Limit/-Remaining/-Reset,
// X-RateLimit-Limit/-Remaining/-Reset/-Used (a reset in seconds or, as
// GitHub sends, a Unix time), X-Rate-Limit-*, Shopify's call limit and
// Retry-After; and LLM providers' limits per unit (docs/llm.md): OpenAI's
// and Groq's x-ratelimit-{limit,remaining,reset}-{requests,tokens},
// Anthropic's anthropic-ratelimit-*, Azure's x-ratelimit-remaining-* and
// retry-after-ms, matched to the key's tiers of the same unit (Limit.In)
// and period, a key named "groq:..." reading Groq's requests per day. What
// it learns goes to Redis beside the configured limits, which stay the
// ceiling:
//   - a published quota (with its window) below the key's tier of the same
//     period lowers that tier for every process, until the provider has not
//     said it for 10 minutes; one at or above the configured
//     tier puts the tier back to it. A quota is never raised above what the
//     operator set.
//   - a remaining count below the key's tokens brings the tokens down to it
//     (other clients share the provider's quota), never up: the tier of the
//     remaining's window when the response tells it, else every rate tier.
//   - remaining 0 with a reset 10 seconds away or more suspends the key
//     until the reset; a nearer reset is left to the tiers.
//   - an LLM provider's bucket that holds less than the tier's burst (a
//     per-minute quota enforced per second: remaining + rate x the time
//     until full) lowers the tier's burst to it.
//   - a spend cap (OpenAI's insufficient_quota, Anthropic's spend limits,
//     read from the start of the error body, which is put back) is no rate
//     limit: nothing is learned, and the returned *RateLimitedError makes
//     the middleware suspend the key for WithMaxSuspension (no Adaptive cut) with an error
//     log line saying to raise the cap and resume the key.
//
// Every learned change is logged once, by the process that made it, and
// shown by Inspect (Limits against InForce); a quota for a period the key
// has no tier for is warned about once per key per process. A process
// sends what a response says only when it could change something: a
// published quota below the one in force for its tier's period at once,
// one that would raise it back at most once a second (a bucket's burst
// likewise, beyond the provider's rounding of it), every quota again
// every 2.5 minutes (to keep a learned one in force for its 10), a
// remaining count below what the task's decision left. So a handler can
// call Observe on every response at the cost of a Redis call on few of
// them. Outside a handler run by the middleware, Observe only returns the
// error. A failure to record what was learned is logged, not returned: the
// provider's answer is what the handler acts on.
func Observe(ctx context.Context, resp *http.Response) error {
	if resp == nil {
		return nil
	}
	now := time.Now()
	q := quota.Parse(resp.StatusCode, resp.Header, now)
	tc, ok := ctx.Value(chargeKey{}).(*taskCharge)
	prov := quota.ProviderUnknown
	if ok {
		prov = providerOf(tc.key)
	}
	li := quota.ParseLLMResponse(prov, resp.StatusCode, resp.Header, peekErrorBody(resp), now)
	if ok && !li.SpendCap {
		tc.l.observe(ctx, tc, q, li, now)
	}
	return fromResponse(q, li, resp.StatusCode)
}

// providerOf is the LLM provider a key's name says, when it starts with
// one's name (openai, anthropic, azure, groq, mistral) before ':', '-',
// '/' or '.': "groq:llama-3" is Groq's, whose x-ratelimit-*-requests count
// per day where OpenAI's count per minute. Any other key reads those
// headers as OpenAI's.
func providerOf(key string) quota.Provider {
	name := key
	if i := strings.IndexAny(key, ":-/."); i >= 0 {
		name = key[:i]
	}
	p, err := quota.ParseProvider(name)
	if err != nil {
		return quota.ProviderUnknown
	}
	return p
}

// peekErrorBody reads the start of an error response's body (the statuses
// where providers say a spend cap: 400, 402, 429) and puts it back, so the
// handler still reads all of it; nil for any other response, or a body
// already read.
func peekErrorBody(resp *http.Response) []byte {
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusPaymentRequired, http.StatusTooManyRequests:
	default:
		return nil
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPeek))
	resp.Body = peekedBody{Reader: io.MultiReader(bytes.NewReader(b), resp.Body), Closer: resp.Body}
	if err != nil {
		return nil
	}
	return b
}

// maxPeek is the most of an error body Observe reads.
const maxPeek = 64 << 10

// peekedBody is a response body whose start Observe read and put back.
type peekedBody struct {
	io.Reader
	io.Closer
}

// observeMemo is what a process last sent Redis about a key's published
// quotas, and what Redis then told of the key's tiers.
type observeMemo struct {
	sentAt time.Time // when published quotas were last sent (or are being)
	leftAt time.Time // when an LLM provider's counts left were last sent
	told   bool      // tiers is what Redis told
	tiers  []lua.ObservedTier
}

// observeGap is the shortest time between two sends of a key's published
// quotas that can only raise a quota in force (back towards the configured
// one), which may wait; one that lowers a quota in force is sent at once.
const observeGap = time.Second

// policiesDue reports whether published quotas pol are to be sent now. Only
// a quota for the period of one of the key's tiers can change anything:
// below the one in force it is sent at once (the provider allows fewer
// calls than the fleet makes), above it (and the tier below its configured
// quota) at most once per observeGap; a bucket's burst told likewise,
// beyond the rounding observe.lua ignores. Quotas for other periods change
// nothing until the limits do; like a learned quota that must be said
// again to stay in force, they are sent every refresh (a quarter of the
// time a learned quota stays in force). A provider whose quotas or windows
// change on every response thus costs a bounded number of calls.
func (m *observeMemo) policiesDue(pol []lua.Policy, now time.Time, refresh time.Duration) bool {
	if len(pol) == 0 {
		return false
	}
	since := now.Sub(m.sentAt)
	switch {
	case m.sentAt.IsZero() || since >= refresh:
		return true
	case !m.told:
		return since >= min(observeGap, refresh) // the first reply is not in yet
	}
	gap := since >= min(observeGap, refresh)
	for _, p := range pol {
		for _, t := range m.tiers {
			switch {
			case t.PerMS != p.PerMS || t.Unit != p.Unit:
			case p.Quota < t.InForce:
				return true
			case p.Quota > t.InForce && t.InForce < t.Configured && gap:
				return true
			case p.Burst > 0 && t.Burst > 0 && p.Quota >= t.InForce:
				// A bucket's burst told: within burstTol it is the same
				// bucket, rounded (observe.lua keeps the burst in force).
				lower, upper := burstTol(t.Burst), burstTol(t.Burst)
				if upper == 1 {
					upper = 0 // (a small burst rises to any higher one told)
				}
				if p.Burst < t.Burst-lower || (p.Burst > t.Burst+upper && gap) {
					return true
				}
			}
		}
	}
	return false
}

// burstTol is observe.lua's burst_tol: how far a burst told may be from a
// bucket of b and still be it, rounded (1, or 1 % of b).
func burstTol(b int64) int64 { return max(1, b/100) }

// llmArgs adds what an LLM provider's headers say (li) to the published
// quotas pol: each unit's limit per window, with the burst its bucket holds
// when the reset tells it; and the counts left of each unit, sent at most
// once per observeGap per key and process (every response says them).
func llmArgs(pol []lua.Policy, li quota.LLMInfo, tc *taskCharge, now time.Time) ([]lua.Policy, []lua.UnitLeft) {
	var left []lua.UnitLeft
	for _, u := range li.Units {
		unit := u.Unit
		if unit == unitRequests {
			unit = ""
		}
		if u.Limit > 0 && u.Window > 0 {
			pol = append(pol, lua.Policy{Quota: int64(u.Limit), PerMS: u.Window.Milliseconds(), Unit: unit, Burst: int64(u.Burst)})
		}
		if u.Remaining >= 0 {
			left = append(left, lua.UnitLeft{Unit: unit, WindowMS: u.Window.Milliseconds(), Remaining: int64(u.Remaining)})
		}
	}
	if left == nil {
		return pol, nil
	}
	ks := tc.ks
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if now.Sub(ks.obs.leftAt) < observeGap {
		return pol, nil
	}
	ks.obs.leftAt = now
	return pol, left
}

// observe sends what q (and an LLM provider's units, li) says when it can
// change anything, and logs what changed.
func (l *Limiter) observe(ctx context.Context, tc *taskCharge, q quota.Info, li quota.LLMInfo, now time.Time) {
	var a lua.ObserveArgs
	for _, p := range q.Policies {
		if p.Window <= 0 || p.Quota <= 0 {
			continue
		}
		a.Policies = append(a.Policies, lua.Policy{Quota: int64(p.Quota), PerMS: p.Window.Milliseconds()})
	}
	a.Policies, a.Left = llmArgs(a.Policies, li, tc, now)
	a.Remaining, a.WindowMS = -1, q.Window.Milliseconds()
	ks := tc.ks
	ks.mu.Lock()
	sendPolicies := ks.obs.policiesDue(a.Policies, now, l.o.learnFor/4)
	if sendPolicies {
		// Claimed now, so that the process's other handlers do not send
		// the same while this call is in the air (nor, should it fail,
		// again at once, unless they would lower a quota in force).
		ks.obs.sentAt = now
	}
	ks.mu.Unlock()
	if !sendPolicies {
		a.Policies = nil
	}
	if q.Remaining >= 0 {
		// Lower than the tokens the task's decision left (unknown: always),
		// or out of quota until a reset.
		out := q.Remaining == 0 && q.Reset > 0 && !q.RateLimited
		if tc.left < 0 || q.Remaining < tc.left || out {
			a.Remaining, a.Reset, a.Stop = int64(q.Remaining), q.Reset, out
		}
	}
	if a.Policies == nil && a.Remaining < 0 && a.Left == nil {
		return
	}
	keys, err := redisKeys(l.o.prefix, tc.key)
	if err != nil {
		return
	}
	a.LearnFor, a.Defaults, a.MaxSuspension, a.IdleExpiry = l.o.learnFor, l.defaults(tc.key), l.o.maxSuspension, l.o.idleExpiry
	o, err := bounded(l, ctx, func(ctx context.Context) (lua.Observed, error) {
		return lua.ObserveKey(ctx, l.runner, keys, a)
	})
	if err != nil {
		l.o.logger.Warn("throttle: cannot record what the provider's response says about its quota; the configured limits stay in force",
			"key", tc.key, "source", q.Source, "err", err)
		return
	}
	l.touch(ks, tc.key, false)
	ks.mu.Lock()
	ks.obs.told, ks.obs.tiers = true, o.Tiers
	ks.mu.Unlock()
	if q.Source == "" && len(li.Units) > 0 {
		q.Source = li.Units[0].Source + " headers"
	}
	l.logChanges(tc.key, ks, q, o.Changes, now)
}

// logChanges logs what observe.lua changed, once: only the process whose
// call made a change is told of it.
func (l *Limiter) logChanges(key string, ks *keyState, q quota.Info, changes []string, now time.Time) {
	log := l.o.logger
	if q.PolicySource == "" {
		q.PolicySource = q.Source
	}
	for _, c := range changes {
		f := strings.Fields(c)
		n := make([]int64, len(f))
		for i := 1; i < len(f); i++ {
			n[i], _ = strconv.ParseInt(f[i], 10, 64)
		}
		switch {
		case f[0] == "learned" && len(f) == 5:
			ks.lease.drop()
			log.Info("throttle: the provider publishes a lower quota; the key's tier is lowered fleet-wide",
				"key", key, "tier", n[1], "quota", n[2], "configured", n[3], "per", time.Duration(n[4])*time.Millisecond,
				"source", q.PolicySource, "learned_for", l.o.learnFor)
		case f[0] == "burst" && len(f) == 5:
			ks.lease.drop()
			log.Info("throttle: the provider's bucket holds less than the key's burst (its per-minute quota is enforced over a shorter span); the key's tier burst is lowered fleet-wide",
				"key", key, "tier", n[1], "burst", n[2], "configured", n[3], "per", time.Duration(n[4])*time.Millisecond, "learned_for", l.o.learnFor)
		case f[0] == "ceiling" && len(f) == 4:
			ks.lease.drop()
			log.Info("throttle: the provider's quota is back at or above the configured one; the tier is back to it",
				"key", key, "tier", n[1], "configured", n[2], "per", time.Duration(n[3])*time.Millisecond)
		case f[0] == "tokens" && len(f) == 4:
			ks.lease.drop()
			log.Debug("throttle: the provider says fewer calls remain than the key's tokens; tokens lowered fleet-wide",
				"key", key, "tier", n[1], "tokens", n[2], "remaining", n[3], "source", q.Source)
		case f[0] == "suspended" && len(f) == 2:
			d := time.Duration(n[1]) * time.Microsecond
			ks.lease.drop()
			ks.cacheSuspension(now, d, false)
			log.Warn("throttle: the provider says its quota is used up until its reset; key suspended fleet-wide",
				"key", key, "for", d, "source", q.Source)
		case f[0] == "unmatched" && len(f) == 4:
			// Once per key, whatever the period: a provider whose window
			// changes on every response must not flood the log.
			if l.o.warned.first("unmatched", key) {
				log.Warn("throttle: the provider publishes a quota for a period (or unit) the key has no tier for; add one to SetLimits to follow it (logged once per key)",
					"key", key, "quota", n[2], "per", time.Duration(n[1])*time.Millisecond, "unit", f[3], "source", q.PolicySource)
			}
		}
	}
}
