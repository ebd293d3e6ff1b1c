package throttle

import (
	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// ValidateKey reports whether name can be used as a limiter key: non-empty,
// at most 128 bytes of valid UTF-8, printable, without '{' or '}' but in a
// family tag at its start followed by more ("{slack}:T0123": on a Redis
// Cluster the keys of one family share a slot, see docs/limits.md). The
// error wraps ErrInvalidKey.
// NewTask, SetLimits and every other call check the keys they are given;
// ValidateKey checks a key made from user input (a tenant's name, say)
// before it is used.
func ValidateKey(name string) error { return keyspace.Validate(name) }

// redisKeys derives every Redis key of one limiter key (see keyspace).
func redisKeys(prefix, name string) (lua.Keys, error) { return keyspace.RedisKeys(prefix, name) }
