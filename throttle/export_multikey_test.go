package throttle

import (
	"context"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// ReserveKeys is Reserve for a caller of several keys (the first is its
// key), decided as the middleware decides a task of several keys; pace as
// WithPacing.
func ReserveKeys(l *Limiter, ctx context.Context, keys []string, id string, horizon, granule time.Duration, pace bool) (Decision, error) {
	return ReserveKeysAs(l, ctx, keys, id, "", horizon, granule, pace)
}

// TookFrom lists the keys an admitted decision of several keys took from.
func TookFrom(d Decision) []string {
	var keys []string
	for _, p := range d.parts {
		keys = append(keys, p.key)
	}
	return keys
}

// ReserveKeysUses is ReserveKeysAs for a call of one request that uses
// uses ("tokens=40", "" none) besides.
func ReserveKeysUses(l *Limiter, ctx context.Context, keys []string, id, tenant, uses string, horizon, granule time.Duration, pace bool) (Decision, error) {
	return l.decideMulti(ctx, keys, variant{horizon: horizon, granule: granule, pace: pace}, id, taskCost{n: 1, units: uses}, tenant)
}

// chargeOf is the charge the handler of a task of keys (its key first; one
// key or several) admitted by d with one request and uses runs with, built
// as the middleware builds it (middleware.run).
func chargeOf(l *Limiter, keys []string, d Decision, uses string) *taskCharge {
	cost := taskCost{n: 1, units: uses}
	tc := &taskCharge{l: l, ks: l.keys.get(keys[0]), key: keys[0], cost: cost, left: d.Remaining, at: d.at, gen: d.gen}
	for _, p := range d.parts {
		if p.key != keys[0] {
			tc.also = append(tc.also, &taskCharge{l: l, ks: l.keys.get(p.key), key: p.key, cost: cost, left: -1, at: p.at, gen: p.gen})
		}
	}
	return tc
}

// UsedKeys is Used(ctx, unit, n) in the handler of that task.
func UsedKeys(l *Limiter, ctx context.Context, keys []string, d Decision, uses, unit string, n int) error {
	return Used(context.WithValue(ctx, chargeKey{}, chargeOf(l, keys, d, uses)), unit, n)
}

// Forwarded is a reservation a refund brought forward (lua.Forwarded).
type Forwarded = lua.Forwarded

// SettleKeys is UsedKeys (unit other than requests, settled once) in a
// handler run from a queue, where a refund may bring booked tasks forward
// (taskCharge.settle with Forward): it returns them, by key, for the
// caller to run as Limiter.forward would.
func SettleKeys(l *Limiter, ctx context.Context, keys []string, d Decision, uses, unit string, n int) (map[string][]Forwarded, error) {
	tc := chargeOf(l, keys, d, uses)
	out := map[string][]Forwarded{}
	for _, c := range append([]*taskCharge{tc}, tc.also...) {
		charged := c.cost.of(unit)
		if n == charged {
			continue
		}
		call := lua.Call{At: c.at, Charged: charged, Generation: c.gen, Tenant: c.tenant, Estimate: charged, Unit: unit, Forward: true}
		fw, err := c.l.settle(ctx, c.key, n-charged, call)
		if err != nil {
			return out, err
		}
		out[c.key] = fw
	}
	return out, nil
}
