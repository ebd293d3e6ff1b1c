package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Error classes of asynq_throttle_redis_errors_total, from ErrorClass.
const (
	ClassTimeout    = "timeout"    // a deadline passed (WithTimeout, the context, a socket timeout)
	ClassConnection = "connection" // refused, reset, closed or unreachable
	ClassReply      = "reply"      // Redis answered with an error (OOM, READONLY, NOSCRIPT, CLUSTERDOWN, ...)
	ClassBadConfig  = "bad_config" // the limits stored in Redis are invalid (*throttle.ConfigError)
	// ClassCostTooHigh: the task costs more than a limit ever holds
	// (throttle.ErrCostTooHigh); no decision can admit it.
	ClassCostTooHigh = "cost_too_high"
	ClassOther       = "other"
)

// ErrorClass sorts the error of a failed decision into one of the Class
// constants, so that a dashboard can tell a Redis that is down from one
// that is slow or one that refuses.
func ErrorClass(err error) string {
	var (
		cfg   *throttle.ConfigError
		reply redis.Error
		nerr  net.Error
	)
	switch {
	case errors.As(err, &cfg):
		return ClassBadConfig
	case errors.Is(err, throttle.ErrCostTooHigh):
		return ClassCostTooHigh
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		return ClassTimeout
	case errors.As(err, &reply):
		return ClassReply
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, redis.ErrClosed):
		return ClassConnection
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return ClassConnection
	}
	return ClassOther
}
