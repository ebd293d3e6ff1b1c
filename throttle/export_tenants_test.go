package throttle

// Hooks for the tests of tenants (issue 23) in package throttle_test.

import (
	"context"
	"time"
)

// ReserveAs is Reserve for a caller of tenant ("" the default tenant) at
// cost n: the decision a task of that tenant gets from the middleware
// without its flags.
func ReserveAs(l *Limiter, ctx context.Context, key, id, tenant string, n int, horizon, granule time.Duration) (Decision, error) {
	return l.decide(ctx, key, variant{horizon: horizon, granule: granule}, id, taskCost{n: n}, tenant)
}

// DecidesFair reports whether l decides every task of key in the order of
// fair shares (Redis told it tenants share the key).
func DecidesFair(l *Limiter, key string) bool {
	ks := l.keys.peek(key)
	return ks != nil && ks.fair.Load()
}

// BookAs is the decision Enqueue takes for a task of tenant with ID id.
func BookAs(l *Limiter, ctx context.Context, key, id, tenant string, n int) (Decision, error) {
	v := variant{horizon: l.o.horizon, granule: granule, headroom: l.o.headroom, pace: l.o.pacing, book: true}
	return l.decide(ctx, key, v, id, taskCost{n: n}, tenant)
}

// ReleaseBooking gives up the booking of task id of tenant at cost n, as
// Enqueue does when asynq refuses the task it booked.
func ReleaseBooking(l *Limiter, ctx context.Context, key, id, tenant string, n int) {
	l.release(ctx, key, id, tenant, taskCost{n: n})
}
