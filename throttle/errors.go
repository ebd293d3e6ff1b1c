package throttle

import (
	"errors"
	"fmt"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
)

var (
	// ErrInvalidKey is returned for a key name that ValidateKey refuses.
	ErrInvalidKey = keyspace.ErrInvalidKey
	// ErrInvalidLimit is returned for a limit out of range, given in Go or
	// read from Redis (then as a *ConfigError).
	ErrInvalidLimit = errors.New("throttle: invalid limit")
	// ErrNoLimits is returned by Take for a key that has no limits in Redis
	// when the limiter has no default limits for it. Call SetLimits, or use
	// WithDefaultLimits.
	ErrNoLimits = errors.New("throttle: no limits set for key")
	// ErrCostTooHigh is returned for a cost (TakeN, Cost) that a tier can
	// never admit: above its burst, or a window's quota.
	ErrCostTooHigh = errors.New("throttle: cost above what a tier can ever admit")
)

// ConfigError reports a key whose config in Redis is invalid (written there by
// hand, or by another tool). It matches ErrInvalidLimit with errors.Is.
type ConfigError struct {
	Key    string // limiter key
	Field  string // config hash field, e.g. "rate:1"
	Reason string // what is wrong with it
}

// Error names the key, the field and what is wrong with it.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("throttle: key %q: invalid config in Redis: field %q: %s (fix it with SetLimits)", e.Key, e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidLimit) true.
func (e *ConfigError) Unwrap() error { return ErrInvalidLimit }
