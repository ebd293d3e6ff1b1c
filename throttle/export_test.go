package throttle

import (
	"context"
	"time"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// SetKeptConnRenewal sets how long l's kept connection serves lone
// decisions before it goes back to the pool (ownRenew in production).
func SetKeptConnRenewal(l *Limiter, d time.Duration) { l.flight.renew = d }

// AdjustCall settles the cost of the call d admitted, charged so far, as
// Charge does.
func AdjustCall(l *Limiter, ctx context.Context, key string, delta int, d Decision, charged int) error {
	return l.adjust(ctx, key, delta, lua.Call{At: d.at, Charged: charged, Generation: d.gen})
}
