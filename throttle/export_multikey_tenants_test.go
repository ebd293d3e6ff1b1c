package throttle

import (
	"context"
	"time"
)

// ReserveKeysAs is ReserveKeys for a caller of tenant ("" the default
// tenant).
func ReserveKeysAs(l *Limiter, ctx context.Context, keys []string, id, tenant string, horizon, granule time.Duration, pace bool) (Decision, error) {
	return l.decideMulti(ctx, keys, variant{horizon: horizon, granule: granule, pace: pace}, id, taskCost{n: 1}, tenant)
}
