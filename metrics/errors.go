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

// Error classes of asynq_throttle_redis_errors_total, from errorClass.
const (
	classTimeout    = "timeout"    // a deadline passed (WithTimeout, the context, a socket timeout)
	classConnection = "connection" // refused, reset, closed or unreachable
	classReply      = "reply"      // Redis answered with an error (OOM, READONLY, NOSCRIPT, CLUSTERDOWN, ...)
	classBadConfig  = "bad_config" // the limits stored in Redis are invalid (*throttle.ConfigError)
	classOther      = "other"
)

// errorClass sorts the error of a failed decision into one of the class
// constants, so that a dashboard can tell a Redis that is down from one
// that is slow or one that refuses.
func errorClass(err error) string {
	var (
		cfg   *throttle.ConfigError
		reply redis.Error
		nerr  net.Error
	)
	switch {
	case errors.As(err, &cfg):
		return classBadConfig
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		return classTimeout
	case errors.As(err, &reply):
		return classReply
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, redis.ErrClosed):
		return classConnection
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return classConnection
	}
	return classOther
}
