package throttle

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/asynq-throttle/asynq-throttle/lua"
)

// MaxKeyLen is the longest key name, in bytes.
const MaxKeyLen = 128

// DefaultPrefix starts every Redis key the limiter writes; see WithPrefix.
const DefaultPrefix = "throttle"

// ValidateKey reports whether name can be used as a limiter key: non-empty, at
// most MaxKeyLen bytes of valid UTF-8, printable, without '{' or '}' (which
// would break the Redis Cluster hash tag). The error wraps ErrInvalidKey.
func ValidateKey(name string) error {
	bad := func(why string) error { return fmt.Errorf("%w: %s: %s", ErrInvalidKey, quoteKey(name), why) }
	switch {
	case name == "":
		return bad("must not be empty")
	case len(name) > MaxKeyLen:
		return bad(fmt.Sprintf("is %d bytes, at most %d", len(name), MaxKeyLen))
	case !utf8.ValidString(name):
		return bad("is not valid UTF-8")
	}
	for _, r := range name {
		if r == '{' || r == '}' {
			return bad("must not contain '{' or '}'")
		}
		if !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("contains the unprintable character %U", r))
		}
	}
	return nil
}

// quoteKey quotes a key name for an error: at most 64 bytes of it, and its
// length when it is longer (a hostile name must not make a megabyte error).
func quoteKey(name string) string {
	const show = 64
	if len(name) <= show {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q... (%d bytes)", name[:show], len(name))
}

// redisKeys derives every Redis key of one limiter key. It is the only place
// key names are built; all share the hash tag {name}. The keys of the
// previous storage layout are derived here too, for Migrate and Delete.
func redisKeys(prefix, name string) (lua.Keys, error) {
	if err := ValidateKey(name); err != nil {
		return lua.Keys{}, err
	}
	base := prefix + ":{" + name + "}:"
	return lua.Keys{
		Bucket:          base + "b",
		Reservations:    base + "r",
		Slots:           base + "f",
		OldConfig:       base + "cfg",
		OldState:        base + "state",
		OldSuspend:      base + "suspend",
		OldReservations: base + "resv",
	}, nil
}

// allRedisKeys lists every Redis key of one limiter key. It must name every
// field of lua.Keys (TestAllRedisKeysCoversLayout checks).
func allRedisKeys(k lua.Keys) []string {
	return append(deletableRedisKeys(k), k.Slots)
}

// deletableRedisKeys lists what Delete removes: every Redis key of one
// limiter key but its slots in flight, which running handlers hold.
func deletableRedisKeys(k lua.Keys) []string {
	return []string{k.Bucket, k.Reservations, k.OldConfig, k.OldState, k.OldSuspend, k.OldReservations}
}

// scanPattern is the SCAN MATCH pattern of every Redis key redisKeys can
// derive under prefix: "prefix:{*}:*", with glob characters of the prefix
// escaped.
func scanPattern(prefix string) string {
	var b strings.Builder
	for i := 0; i < len(prefix); i++ { // bytes: a prefix need not be UTF-8
		switch c := prefix[i]; c {
		case '*', '?', '[', ']', '\\', '^':
			b.WriteByte('\\')
		}
		b.WriteByte(prefix[i])
	}
	b.WriteString(":{*}:*")
	return b.String()
}

// nameOfRedisKey returns the limiter key a Redis key belongs to under
// prefix (the inverse of redisKeys), or false when it is none of them.
func nameOfRedisKey(prefix, redisKey string) (string, bool) {
	rest, ok := strings.CutPrefix(redisKey, prefix+":{")
	if !ok {
		return "", false
	}
	name, suffix, ok := strings.Cut(rest, "}")
	if !ok || !strings.HasPrefix(suffix, ":") || ValidateKey(name) != nil {
		return "", false
	}
	return name, true
}
