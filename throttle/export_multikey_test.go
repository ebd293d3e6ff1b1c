package throttle

import (
	"context"
	"time"
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
