package throttle

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// Observe learns from a provider's response what its quota is, fleet-wide,
// and returns what FromResponse returns: a *RateLimitedError for a 429 (or a
// 503 with Retry-After), nil otherwise. Call it in a handler run by the
// middleware, on every response from the provider; the task's key and
// limiter come from ctx:
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
// Retry-After. What it learns goes to Redis beside the configured limits,
// which stay the ceiling:
//   - a published quota (with its window) below the key's tier of the same
//     period lowers that tier for every process, until the provider has not
//     said it for WithLearnFor (10 minutes); one at or above the configured
//     tier puts the tier back to it. A quota is never raised above what the
//     operator set.
//   - a remaining count below the key's tokens brings the tokens down to it
//     (other clients share the provider's quota), never up: the tier of the
//     remaining's window when the response tells it, else every rate tier.
//   - remaining 0 with a reset time suspends the key until the reset.
//
// Every learned change is logged once, by the process that made it, and
// shown by Inspect (Limits against InForce). A process sends what a
// response says only when it would change something it knows of, so a
// handler can call Observe on every response at the cost of a Redis call
// on few of them. Outside a handler run by the middleware, Observe only
// does what FromResponse does. A failure to record what was learned is
// logged, not returned: the provider's answer is what the handler acts on.
func Observe(ctx context.Context, resp *http.Response) error {
	if resp == nil {
		return nil
	}
	now := time.Now()
	rl := fromResponse(resp, now)
	tc, ok := ctx.Value(chargeKey{}).(*taskCharge)
	if !ok {
		return rl
	}
	tc.l.observe(ctx, tc, parseQuota(resp.StatusCode, resp.Header, now), now)
	return rl
}

// observeMemo is what a process last sent Redis about a key's quota.
type observeMemo struct {
	policies string    // the published quotas last sent
	sentAt   time.Time // when they were
	warned   map[int64]bool
}

// observe sends what q says when it can change anything, and logs what
// changed.
func (l *Limiter) observe(ctx context.Context, tc *taskCharge, q quotaInfo, now time.Time) {
	var a lua.ObserveArgs
	var sig strings.Builder
	for _, p := range q.Policies {
		if p.Window <= 0 || p.Quota <= 0 {
			continue
		}
		a.Policies = append(a.Policies, lua.Policy{Quota: int64(p.Quota), PerMS: p.Window.Milliseconds()})
		fmt.Fprintf(&sig, "%d/%d ", p.Quota, p.Window.Milliseconds())
	}
	a.Remaining, a.WindowMS = -1, q.Window.Milliseconds()
	ks := tc.ks
	ks.mu.Lock()
	sendPolicies := len(a.Policies) > 0 &&
		(sig.String() != ks.obs.policies || now.Sub(ks.obs.sentAt) >= l.o.learnFor/4)
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
	if a.Policies == nil && a.Remaining < 0 {
		return
	}
	keys, err := redisKeys(l.o.prefix, tc.key)
	if err != nil {
		return
	}
	a.LearnFor, a.Defaults, a.MaxSuspension, a.IdleExpiry = l.o.learnFor, l.defaults(tc.key), l.o.maxSuspension, l.o.idleExpiry
	changes, err := bounded(l, ctx, func(ctx context.Context) ([]string, error) {
		return lua.Observe(ctx, l.runner, keys, a)
	})
	if err != nil {
		l.o.logger.Warn("throttle: cannot record what the provider's response says about its quota; the configured limits stay in force",
			"key", tc.key, "source", q.Source, "err", err)
		return
	}
	if a.Policies != nil {
		ks.mu.Lock()
		ks.obs.policies, ks.obs.sentAt = sig.String(), now
		ks.mu.Unlock()
	}
	l.logChanges(tc.key, ks, q, changes, now)
}

// logChanges logs what observe.lua changed, once: only the process whose
// call made a change is told of it.
func (l *Limiter) logChanges(key string, ks *keyState, q quotaInfo, changes []string, now time.Time) {
	log := l.o.logger
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
		case f[0] == "unmatched" && len(f) == 3:
			ks.mu.Lock()
			first := !ks.obs.warned[n[1]]
			if first {
				if ks.obs.warned == nil {
					ks.obs.warned = map[int64]bool{}
				}
				ks.obs.warned[n[1]] = true
			}
			ks.mu.Unlock()
			if first {
				log.Warn("throttle: the provider publishes a quota for a period the key has no tier for; add one to SetLimits to follow it",
					"key", key, "quota", n[2], "per", time.Duration(n[1])*time.Millisecond, "source", q.PolicySource)
			}
		}
	}
}
