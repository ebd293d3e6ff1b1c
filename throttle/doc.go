// Package throttle makes a fleet of asynq workers obey one shared rate limit
// per third-party provider, through Redis, with no coordinator and no lock.
//
// Every decision is one Lua script run inside Redis: read the key's
// suspension and limits, refill its token buckets on demand from the Redis
// clock, and take a token from every tier or from none. Any number of
// processes sharing the Redis (or Redis Cluster) share each key's limits.
//
// The asynq middleware is the main surface:
//
//	mux.Use(throttle.ByProvider(rdb))
//	task := throttle.NewTask("slack:sync", payload, throttle.Key("slack"))
//
// A task that may not run yet is deferred (see worker.NewServer for the exact
// retry path) and its goroutine is free at once. A handler error wrapping
// RateLimited suspends the key fleet-wide. Limiter gives direct access:
// SetLimits, Take, Reserve, Suspend, Resume, Inspect.
package throttle
