package throttle

import "time"

// SetKeptConnRenewal sets how long l's kept connection serves lone
// decisions before it goes back to the pool (ownRenew in production).
func SetKeptConnRenewal(l *Limiter, d time.Duration) { l.flight.renew = d }
