package throttle

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
	"github.com/asynq-throttle/asynq-throttle/internal/quota"
)

// Observe learns from a provider's response what its quota is, fleet-wide,
// and returns a *RateLimitedError when the response is a rate limit (a 429,
// a 503 with Retry-After, or what the provider's dialect says is one:
// GitHub's 403, Shopify's THROTTLED 200), waiting the response's
// Retry-After (or the wait its dialect states), else the reset it states;
// nil for any other response. Call it in a handler run by the middleware,
// on every response from the provider; the task's key and limiter come
// from ctx:
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
// X-RateLimit-Limit/-Remaining/-Reset/-Used (a reset in seconds or a Unix
// time, fractions kept), X-Rate-Limit-* and Retry-After (Azure's
// retry-after-ms first) for every provider; and each provider's own
// dialect (docs/providers.md): GitHub, Shopify (REST and GraphQL),
// HubSpot, Salesforce, Jira, Discord, X, Zendesk, Gemini, Stripe, Slack,
// and the LLM providers' limits per unit (docs/llm.md: OpenAI, Anthropic,
// Azure, Groq), matched to the key's tiers of the same unit (Limit.In) and
// period. The dialect is the provider's the key is named for ("github",
// "github:org1", "groq-llama": the key up to its first ':', '-', '/' or
// '.'; "twitter" is X's), else the one whose own headers the response
// carries (X-Shopify-Shop-Api-Call-Limit, Sforce-Limit-Info,
// X-HubSpot-RateLimit-*, ...); never another provider's: a spend-cap body
// is read only from OpenAI, Azure or Anthropic, a 403 only from GitHub and
// Salesforce. A provider it does not know is taught with WithDialect. What
// it learns goes to Redis beside the configured limits, which stay the
// ceiling:
//   - a published quota (with its window) below the key's tier of the same
//     period lowers that tier for every process, until the provider has not
//     said it for 10 minutes; one at or above the configured
//     tier puts the tier back to it. A quota is never raised above what the
//     operator set. A quota for a period the key has no tier of binds the
//     tier of its unit with the nearest period, converted to that period
//     (2,400 a minute: 40 a second; rounded down) and, when the tier's
//     period is the longer, holding no more than the quota at once. A
//     quota whose window only the provider's documentation states
//     (GitHub's 5,000 an hour, X's 900 per 15 minutes, Zendesk's 700 a
//     minute, Shopify's bucket of 40 leaking 2 a second) is learned by a
//     key named for its provider, converted the same way.
//   - a remaining count below the key's tokens brings the tokens down to it
//     (other clients share the provider's quota), never up: the tier of the
//     remaining's window when the response tells it, else every rate tier.
//   - remaining 0 with a reset 10 seconds away or more suspends the key
//     until the reset; a nearer reset is left to the tiers.
//   - an LLM provider's bucket that holds less than the tier's burst (a
//     per-minute quota enforced per second: remaining + rate x the time
//     until full) lowers the tier's burst to it.
//   - a wait narrower than the key (Discord's X-RateLimit-Scope: shared,
//     Jira's jira-per-issue-on-write, Stripe's lock_timeout) is the task's
//     alone: nothing is learned, and the returned error has TaskOnly set,
//     so the middleware defers that task and suspends nothing.
//   - an allocation used up (HubSpot's or Salesforce's daily calls,
//     Gemini's requests per day) waits for the allocation: the key is
//     suspended until its reset (a day when unsaid), at most
//     WithMaxSuspension at a time, with no Adaptive cut.
//   - a spend cap (OpenAI's insufficient_quota, Anthropic's spend limits,
//     read from the start of the error body, which is put back) is no rate
//     limit: nothing is learned, and the returned *RateLimitedError makes
//     the middleware suspend the key for WithMaxSuspension (no Adaptive cut) with an error
//     log line saying to raise the cap and resume the key.
//
// Waits are never rounded down (Discord's fractional resets are kept). A
// body is read only for the statuses that need it (400, 402, 403, 429,
// and Shopify's JSON 200s), its first 64 KiB, and put back for the
// handler. Every learned change is logged once, by the process that made
// it, and shown by Inspect (Limits against InForce); a quota in a unit the
// key has no tier of is ignored with a warning, once per key, unit and
// process. A process sends what a response says only when it could change
// something: a published quota below the one in force for its tier's
// period at once,
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
	tc, ok := ctx.Value(chargeKey{}).(*taskCharge)
	prov := quota.ProviderUnknown
	var read func(*http.Response) (Limit, time.Duration)
	if ok {
		name := keyName(tc.key)
		prov = quota.Named(name)
		if read = tc.l.o.dialects[strings.ToLower(name)]; read != nil {
			prov = quota.ProviderGeneric // the user's reading replaces ours
		}
	}
	prov = quota.Detect(prov, resp.Header)
	var body []byte
	if quota.ReadsBody(prov, resp.StatusCode, resp.Header) {
		body = peekBody(resp)
	}
	q, li := quota.Read(prov, resp.StatusCode, resp.Header, body, now)
	if read != nil {
		readDialect(&q, resp, read)
	}
	if ok && !li.SpendCap && !q.TaskOnly {
		tc.l.observe(ctx, tc.observedFor(ctx, q, li), q, li, now)
	}
	return fromResponse(q, li, resp.StatusCode)
}

// keyName is the provider's name a key starts with: the key up to its
// first ':', '-', '/' or '.' ("groq:llama-3" is "groq"'s, whose
// x-ratelimit-*-requests count per day where OpenAI's count per minute;
// "github-org1" is "github"'s, whose X-RateLimit-Limit counts per hour).
// quota.Named tells the provider of that name; any other is read in the
// generic families and by the provider its responses' own headers name
// (quota.Detect).
func keyName(key string) string {
	if i := strings.IndexAny(key, ":-/."); i >= 0 {
		return key[:i]
	}
	return key
}

// readDialect adds what a user's reader (WithDialect) says of resp to q:
// a quota (the zero Limit: none; N from 1 to 1e9 per a Per from 1 ms to
// 30 days) as a published one whose window its docs fix, and a wait (0:
// none) as the response's wait, rate limited whatever its status.
func readDialect(q *quota.Info, resp *http.Response, read func(*http.Response) (Limit, time.Duration)) {
	lim, wait := read(resp)
	if lim.N >= 1 && lim.N <= 1e9 && lim.Per >= time.Millisecond && lim.Per <= maxPer {
		p := quota.Policy{Quota: lim.N, Window: lim.Per, Documented: true}
		if lim.Burst > 0 && lim.Burst <= 1e9 {
			p.Burst = lim.Burst
		}
		q.Policies, q.PolicySource = append([]quota.Policy{p}, q.Policies...), "the provider's dialect (WithDialect)"
	}
	if wait > 0 {
		q.RateLimited, q.RetryAfter, q.HasRetryAfter = true, min(wait, maxPer), true
	}
}

// peekBody reads the start of a response's body and puts it back, so the
// handler still reads all of it; nil for a body already read.
func peekBody(resp *http.Response) []byte {
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

// maxPeek is the most of a body Observe reads.
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
	gen    int64 // the limits' generation tiers were told under
}

// stale forgets what Redis told when the limits changed since: a task
// decided under generation gen (known: admitted at a known instant) finds
// other limits in force than the memo's, which could make a quota it
// ignored matter (a key raised from 10/s to 20/s while the provider states
// 15/s kept 20/s for up to the refresh: 2.5 minutes).
func (m *observeMemo) stale(gen int64, known bool) {
	if known && m.told && gen != m.gen {
		*m = observeMemo{leftAt: m.leftAt}
	}
}

// forgetObserved forgets what Observe sent and was told of the key: its
// limits changed (SetLimits, Delete).
func (ks *keyState) forgetObserved() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.obs = observeMemo{}
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
		p = convertPolicy(p, m.tiers)
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

// convertPolicy is observe.lua's matches for a quota of a period none of
// tiers has: stated for the tier of its unit whose period is nearest (a
// tie to the longer), converted to that period (rounded down), holding
// the quota at most when that period is the longer. A quota of a tier's
// own period, of a unit no tier counts, or less than one per the nearest
// tier's period (which observe.lua leaves unmapped), is p as it is.
func convertPolicy(p lua.Policy, tiers []lua.ObservedTier) lua.Policy {
	best, dist := -1, 0.0
	for i, t := range tiers {
		if t.Unit != p.Unit {
			continue
		}
		if t.PerMS == p.PerMS {
			return p
		}
		d := max(float64(t.PerMS)/float64(p.PerMS), float64(p.PerMS)/float64(t.PerMS))
		if best < 0 || d < dist || (d == dist && t.PerMS > tiers[best].PerMS) {
			best, dist = i, d
		}
	}
	if best < 0 {
		return p
	}
	t := tiers[best]
	if p.Quota*t.PerMS/p.PerMS < 1 {
		return p
	}
	c := lua.Policy{Quota: p.Quota * t.PerMS / p.PerMS, PerMS: t.PerMS, Unit: p.Unit, Burst: p.Burst}
	if t.PerMS > p.PerMS && (c.Burst == 0 || p.Quota < c.Burst) {
		c.Burst = p.Quota
	}
	return c
}

// burstTol is observe.lua's burst_tol: how far a burst told may be from a
// bucket of b and still be it, rounded (1, or 1 % of b).
func burstTol(b int64) int64 { return max(1, b/100) }

// llmArgs adds what an LLM provider's headers say (li) to the published
// quotas pol: each unit's limit per window, with the burst its bucket holds
// when the reset tells it; and the counts left of each unit, with those a
// dialect tells in other windows than its remaining's (q.Left, HubSpot's:
// only for a window one of the key's tiers has, as far as tiers tells),
// sent at most once per observeGap per key and process (every response
// says them).
func llmArgs(pol []lua.Policy, li quota.LLMInfo, left []quota.Left, tiers []lua.ObservedTier, tc *taskCharge, now time.Time) ([]lua.Policy, []lua.UnitLeft) {
	var out []lua.UnitLeft
	for _, u := range li.Units {
		unit := u.Unit
		if unit == unitRequests {
			unit = ""
		}
		if u.Limit > 0 && u.Window > 0 {
			pol = append(pol, lua.Policy{Quota: int64(u.Limit), PerMS: u.Window.Milliseconds(), Unit: unit, Burst: int64(u.Burst)})
		}
		if u.Remaining >= 0 {
			out = append(out, lua.UnitLeft{Unit: unit, WindowMS: u.Window.Milliseconds(), Remaining: int64(u.Remaining)})
		}
	}
	for _, l := range left {
		// (A count whose window no tier has would lower every tier of
		// its unit: HubSpot's 9 left this second is not its 99 left of
		// ten.)
		if tierOf(tiers, l.Window.Milliseconds(), "") >= 0 {
			out = append(out, lua.UnitLeft{WindowMS: l.Window.Milliseconds(), Remaining: int64(l.Remaining)})
		}
	}
	if out == nil {
		return pol, nil
	}
	ks := tc.ks
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if now.Sub(ks.obs.leftAt) < observeGap {
		return pol, nil
	}
	ks.obs.leftAt = now
	return pol, out
}

// tierOf is the index of the tier of period perMS and unit ("" requests),
// -1 when none.
func tierOf(tiers []lua.ObservedTier, perMS int64, unit string) int {
	for i, t := range tiers {
		if t.PerMS == perMS && t.Unit == unit {
			return i
		}
	}
	return -1
}

// fitPolicies converts the quotas whose window only the provider's
// documentation states (fit: GitHub's 5000 an hour, X's 900 per 15
// minutes, Zendesk's 700 a minute) to the key's tiers (as Redis told
// them): one for a period a tier has is sent as it is; one for a period
// none has goes to the tier of its unit whose period is nearest and that
// no quota of the response speaks of, converted, quota × the tier's
// period / the quota's, rounded down, and only when that is below the
// tier's configured quota (a conversion only ever lowers; the lowest wins
// when several go to one tier); one of a unit the key has no tier of, or
// less than one per the nearest tier's period (rounded up to one, the tier
// would admit more than the quota), is sent as it is, for Redis to warn
// about. exact are the other published quotas of the response.
func fitPolicies(fit, exact []lua.Policy, tiers []lua.ObservedTier) []lua.Policy {
	var out []lua.Policy
	taken := map[int]bool{}
	for _, p := range exact {
		if i := tierOf(tiers, p.PerMS, p.Unit); i >= 0 {
			taken[i] = true
		}
	}
	for _, p := range fit {
		if i := tierOf(tiers, p.PerMS, p.Unit); i >= 0 {
			out = append(out, p)
			taken[i] = true
		}
	}
	best := map[int]int64{}
	for _, p := range fit {
		if tierOf(tiers, p.PerMS, p.Unit) >= 0 || p.PerMS <= 0 {
			continue
		}
		i := nearestTier(tiers, p, taken)
		if i < 0 {
			if !hasUnit(tiers, p.Unit) {
				out = append(out, p)
			}
			continue
		}
		t := tiers[i]
		q := p.Quota * t.PerMS / p.PerMS // (<= 1e9 x 30 days in ms: no overflow)
		if q < 1 {
			out = append(out, p)
			continue
		}
		if q >= t.Configured {
			continue
		}
		if b, ok := best[i]; !ok || q < b {
			best[i] = q
		}
	}
	for i := range tiers {
		if q, ok := best[i]; ok {
			out = append(out, lua.Policy{Quota: q, PerMS: tiers[i].PerMS, Unit: tiers[i].Unit})
		}
	}
	return out
}

// nearestTier is the index of the tier of p's unit, not taken, whose
// period is nearest p's (by ratio); -1 when none.
func nearestTier(tiers []lua.ObservedTier, p lua.Policy, taken map[int]bool) int {
	best, dist := -1, math.Inf(1)
	for i, t := range tiers {
		if t.Unit != p.Unit || taken[i] || t.PerMS <= 0 {
			continue
		}
		if d := math.Abs(math.Log(float64(t.PerMS) / float64(p.PerMS))); d < dist {
			best, dist = i, d
		}
	}
	return best
}

// hasUnit reports a tier of unit.
func hasUnit(tiers []lua.ObservedTier, unit string) bool {
	for _, t := range tiers {
		if t.Unit == unit {
			return true
		}
	}
	return false
}

// observe sends what q (and an LLM provider's units, li) says when it can
// change anything, and logs what changed.
func (l *Limiter) observe(ctx context.Context, tc *taskCharge, q quota.Info, li quota.LLMInfo, now time.Time) {
	var a lua.ObserveArgs
	var fit []lua.Policy // quotas whose window only the docs state
	for _, p := range q.Policies {
		if p.Window <= 0 || p.Quota <= 0 {
			continue
		}
		lp := lua.Policy{Quota: int64(p.Quota), PerMS: p.Window.Milliseconds(), Burst: int64(p.Burst)}
		if p.Documented {
			fit = append(fit, lp)
		} else {
			a.Policies = append(a.Policies, lp)
		}
	}
	ks := tc.ks
	ks.mu.Lock()
	ks.obs.stale(tc.gen, !tc.at.IsZero())
	told, tiers := ks.obs.told, ks.obs.tiers
	ks.mu.Unlock()
	a.Policies, a.Left = llmArgs(a.Policies, li, q.Left, tiers, tc, now)
	exact := a.Policies
	if told {
		a.Policies = append(a.Policies, fitPolicies(fit, exact, tiers)...)
	} else {
		// Redis has not told this process the key's tiers yet: the quotas
		// go as they are, and are fitted to the tiers its reply tells.
		a.Policies = append(a.Policies, fit...)
	}
	a.Remaining, a.WindowMS = -1, q.Window.Milliseconds()
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
			// (A reset is kept in microseconds: never shorter than said.)
			a.Remaining, a.Reset, a.Stop = int64(q.Remaining), (q.Reset + time.Microsecond - 1).Truncate(time.Microsecond), out
		}
	}
	if a.Policies == nil && a.Remaining < 0 && a.Left == nil {
		return
	}
	keys, err := redisKeys(l.o.prefix, tc.key)
	if err != nil {
		return
	}
	a.LearnFor, a.Defaults, a.MaxSuspension = l.o.learnFor, l.defaults(tc.key), l.o.maxSuspension
	o, err := bounded(l, ctx, func(ctx context.Context) (lua.Observed, error) {
		return lua.ObserveKey(ctx, l.runner, keys, a)
	})
	if err == nil && !told && sendPolicies && len(fit) > 0 {
		// The tiers are told now: the quotas for periods the key has no
		// tier of are fitted to its tiers, once per key and process.
		if conv := fitPolicies(fit, exact, o.Tiers); len(conv) > 0 && !samePolicies(conv, fit) {
			b := lua.ObserveArgs{Policies: conv, Remaining: -1, LearnFor: a.LearnFor, Defaults: a.Defaults,
				MaxSuspension: a.MaxSuspension}
			var o2 lua.Observed
			if o2, err = bounded(l, ctx, func(ctx context.Context) (lua.Observed, error) {
				return lua.ObserveKey(ctx, l.runner, keys, b)
			}); err == nil {
				o.Changes, o.Tiers = append(o.Changes, o2.Changes...), o2.Tiers
			}
		}
	}
	if err != nil {
		l.o.logger.Warn("throttle: cannot record what the provider's response says about its quota; the configured limits stay in force",
			"key", tc.key, "source", q.Source, "err", err)
		return
	}
	l.touch(ks, tc.key, false)
	ks.mu.Lock()
	ks.obs.told, ks.obs.tiers, ks.obs.gen = true, o.Tiers, o.Generation
	ks.mu.Unlock()
	if q.Source == "" && len(li.Units) > 0 {
		q.Source = li.Units[0].Source + " headers"
	}
	l.logChanges(tc.key, ks, q, o.Changes, fitted(fit, o.Tiers), now)
}

// samePolicies reports whether a and b are the same quotas.
func samePolicies(a, b []lua.Policy) bool { return slices.Equal(a, b) }

// fitted are the periods (ms) of the quotas in fit that fitPolicies
// converts to a tier of their unit: Redis's warning that the key has no
// tier for them is no news.
func fitted(fit []lua.Policy, tiers []lua.ObservedTier) map[int64]bool {
	var out map[int64]bool
	for _, p := range fit {
		if p.Unit == "" && hasUnit(tiers, "") {
			if out == nil {
				out = map[int64]bool{}
			}
			out[p.PerMS] = true
		}
	}
	return out
}

// logChanges logs what observe.lua changed, once: only the process whose
// call made a change is told of it.
func (l *Limiter) logChanges(key string, ks *keyState, q quota.Info, changes []string, fitted map[int64]bool, now time.Time) {
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
		case f[0] == "converted" && len(f) == 7:
			ks.lease.drop()
			log.Info("throttle: the provider publishes a lower quota for a period the key has no tier of; the tier of the nearest period is lowered fleet-wide to it, converted",
				"key", key, "tier", n[1], "quota", n[2], "configured", n[3], "per", time.Duration(n[4])*time.Millisecond,
				"stated", n[5], "stated_per", time.Duration(n[6])*time.Millisecond, "source", q.PolicySource, "learned_for", l.o.learnFor)
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
		case f[0] == "unmatched" && len(f) == 4 && f[3] == "requests" && fitted[n[1]]:
			// (a quota the docs fix the window of, converted to a tier)
		case f[0] == "unmapped" && len(f) == 5:
			if l.o.warned.first("unmapped "+f[3], key) {
				log.Warn("throttle: the provider publishes a quota too small to be said in the key's tier of the nearest period (less than one per period); it was ignored: add a tier of the quota's period to SetLimits to follow it (logged once per key and unit)",
					"key", key, "ignored_quota", n[2], "per", time.Duration(n[1])*time.Millisecond, "unit", f[3],
					"nearest_tier_per", time.Duration(n[4])*time.Millisecond, "source", q.PolicySource)
			}
		case f[0] == "unmatched" && len(f) == 4:
			// Once per key, whatever the period: a provider whose window
			// changes on every response must not flood the log.
			if l.o.warned.first("unmatched "+f[3], key) {
				log.Warn("throttle: the provider publishes a quota in a unit the key has no tier of; it was ignored: add a tier of that unit to SetLimits (Limit.In) to follow it (logged once per key and unit)",
					"key", key, "ignored_quota", n[2], "per", time.Duration(n[1])*time.Millisecond, "unit", f[3], "source", q.PolicySource)
			}
		}
	}
}
