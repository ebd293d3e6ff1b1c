package throttle

// Hooks for the tests of quotas in several units (property_units_test.go).

import (
	"context"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// AdjustUnit settles unit ("requests" for the request tiers) of the call d
// admitted, charged so far, by delta, as Used does in a handler: a
// surcharge as of now, a refund as far as the tiers of that unit can give
// it back.
func AdjustUnit(l *Limiter, ctx context.Context, key, unit string, delta int, d Decision, charged int) error {
	call := lua.Call{At: d.at, Charged: charged, Generation: d.gen}
	if unit != unitRequests {
		call.Unit = unit
	}
	return l.adjust(ctx, key, delta, call)
}

// AdmittedAt is the instant (Redis clock) a decision admitted its call at.
func AdmittedAt(d Decision) time.Time { return d.at }

// ReserveUses is ReserveAs for a task of tenant that uses uses of other
// units ("tokens=100"), besides one request.
func ReserveUses(l *Limiter, ctx context.Context, key, id, tenant, uses string, horizon, granule time.Duration) (Decision, error) {
	return l.decide(ctx, key, variant{horizon: horizon, granule: granule}, id, taskCost{n: 1, units: uses}, tenant)
}

// AdjustUnitAs is AdjustUnit for a task of tenant, as Used settles it.
func AdjustUnitAs(l *Limiter, ctx context.Context, key, tenant, unit string, delta int, d Decision, charged int) error {
	call := lua.Call{At: d.at, Charged: charged, Generation: d.gen, Tenant: tenant}
	if unit != unitRequests {
		call.Unit = unit
	}
	return l.adjust(ctx, key, delta, call)
}
