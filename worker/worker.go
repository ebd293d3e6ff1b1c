// Package worker builds asynq servers whose throttling deferrals are exact:
// a task deferred by throttle.ByProvider goes back to asynq's retry set in one
// atomic step, keeps its ID, its unique lock and its retry count, is counted
// neither processed nor failed, and never reaches the user's ErrorHandler.
package worker

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
)

// The intervals Config sets when the config leaves them zero (NewServer's
// doc states them; TestConfigDocStatesTheIntervals compares).
const (
	// A deferred task is scored in whole seconds and handed back at the
	// first forwarder tick at or after its second, so it comes back up to
	// one interval late: asynq's default (5s) would hold it up to 5s past
	// its reserved time, and 1s let a backlog on a window limit miss a
	// whole window when the fleet's forwarders ticked late in the second
	// (the middleware's pacing waits for a time ahead of a task, never
	// behind it).
	delayedTaskCheckInterval = 500 * time.Millisecond
	// asynq's default (1s, randomised to 0.5-1.5s) would add up to 1.5s to
	// every deferred task that comes back to an idle fleet.
	taskCheckInterval = 100 * time.Millisecond
)

// NewServer returns an asynq server on rdb configured for throttling. It wraps
// cfg's IsFailure, RetryDelayFunc, ErrorHandler and BaseContext so that they
// recognise deferrals and pass every other error to the user's own functions
// (or asynq's defaults when cfg leaves them nil), and polls for due tasks
// more often than asynq's defaults: DelayedTaskCheckInterval 500ms (a
// deferred task comes back at most that late; two small Redis scripts per
// queue per second per server) and TaskCheckInterval 100ms (an idle server
// picks a task up at most that late), unless cfg sets them. Use it with the
// middleware:
//
//	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
//	mux := asynq.NewServeMux()
//	mux.Use(throttle.ByProvider(rdb))
//	srv.Run(mux)
func NewServer(rdb redis.UniversalClient, cfg asynq.Config) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, Config(cfg))
}

// Config returns cfg wrapped as NewServer wraps it, for callers that build
// the asynq.Server themselves.
func Config(cfg asynq.Config) asynq.Config {
	isFailure := cfg.IsFailure
	if isFailure == nil {
		isFailure = func(err error) bool { return err != nil }
	}
	cfg.IsFailure = func(err error) bool {
		if IsDeferral(err) {
			return false
		}
		return isFailure(err)
	}

	retryDelay := cfg.RetryDelayFunc
	if retryDelay == nil {
		retryDelay = asynq.DefaultRetryDelayFunc
	}
	cfg.RetryDelayFunc = func(n int, err error, t *asynq.Task) time.Duration {
		if d, ok := deferral.As(err); ok {
			return d.Delay
		}
		return retryDelay(n, err, t)
	}

	if h := cfg.ErrorHandler; h != nil {
		cfg.ErrorHandler = asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			if !IsDeferral(err) {
				h.HandleError(ctx, t, err)
			}
		})
	}

	base := cfg.BaseContext
	if base == nil {
		base = context.Background
	}
	cfg.BaseContext = func() context.Context { return deferral.Mark(base()) }

	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = delayedTaskCheckInterval
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = taskCheckInterval
	}
	return cfg
}

// IsDeferral reports whether err is a throttling deferral (a task that will
// run later, not a failure).
func IsDeferral(err error) bool {
	_, ok := deferral.As(err)
	return ok
}
