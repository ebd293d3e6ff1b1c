// Package throttle makes a fleet of asynq workers obey one shared rate limit
// per third-party provider, through Redis, with no coordinator and no lock.
//
// The main job takes five names: NewLimiter and SetLimits with a limit
// (PerSecond, PerMinute, PerHour, Window, InFlight), NewTask with Key, the
// middleware (ByProvider, or Limiter.Middleware), and Observe or RateLimited
// in a handler:
//
//	lim := throttle.NewLimiter(rdb)
//	err := lim.SetLimits(ctx, "slack", throttle.PerSecond(2), throttle.PerMinute(50))
//
//	task, err := throttle.NewTask("slack:sync", payload, throttle.Key("slack"))
//	_, err = client.Enqueue(task)
//
//	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
//	mux.Use(lim.Middleware())
//	mux.HandleFunc("slack:sync", func(ctx context.Context, t *asynq.Task) error {
//		resp, err := callSlack(ctx, t)
//		if err != nil {
//			return err
//		}
//		defer resp.Body.Close()
//		return throttle.Observe(ctx, resp) // a 429 suspends "slack" fleet-wide
//	})
//
// Before each handler, the middleware makes one decision in Redis: one Lua
// script run that reads the key's suspension and limits, refills its token
// buckets from the Redis clock, and takes the task's cost from every limit
// or from none. A task that may not run yet is deferred to run later (its
// worker goroutine is free at once); worker.NewServer makes deferrals keep
// the task's ID and retry count. A refused task reserves its run time, so a
// backlog drains at the limit with about one deferral per task. A handler
// that returns RateLimited, or Observe of a 429, suspends the key for the
// whole fleet.
//
// Beyond the main job:
//   - Cost, Uses and Used: a task that counts more than one call, or
//     other units (an LLM call's tokens), settled after (Limit.In).
//   - Limiter.Enqueue: a task throttled when it is enqueued, not only when
//     a worker picks it up (fewer Redis commands per task of a backlog).
//   - Adaptive: limits that halve on every new 429 and recover.
//   - Limiter.Take: a decision for a program outside the
//     middleware (a web handler, a script); on a key with an InFlight limit,
//     Release the Decision's Slot when the call is done.
//   - Limiter.Suspend, Resume, Inspect, Keys and Delete: what operators do
//     (the asynq-throttle command, package dashboard); Limiter.OnEvent: what
//     package metrics counts.
//
// docs/ in the repository is the manual: the guarantees and where each is
// tested, stating a provider's quota, operating a fleet, how a decision
// works.
package throttle
