// Package keyspace names what the library writes outside its scripts: the
// Redis keys of a limiter key, the task headers, and the rules of a key's
// name. The throttle package, the CLI and the dashboard all derive names
// here, and nowhere else.
package keyspace

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// DefaultPrefix starts every Redis key a Limiter writes, unless WithPrefix.
const DefaultPrefix = "throttle"

// MaxKeyLen is the longest key name, in bytes.
const MaxKeyLen = 128

// Task headers the middleware reads and writes.
const (
	// Key carries the limiter key of a task (throttle.Key through NewTask).
	Key = "throttle-key"
	// Cost carries what a task takes from every tier (throttle.Cost); 1
	// when absent.
	Cost = "throttle-cost"
	// Origin carries the ID of the task a deferred copy was made from, so
	// the copy keeps the original's reservation.
	Origin = "throttle-origin"
	// Deferrals counts how many times a task was deferred by copy.
	Deferrals = "throttle-deferrals"
	// CopyOf carries the ID of the task a deferred copy replaces (Origin
	// names the first of a chain).
	CopyOf = "throttle-copy-of"
	// DeferredKey and DeferredReason say which key deferred a copy, and why
	// ("suspended", "tier", ...).
	DeferredKey    = "throttle-deferred-key"
	DeferredReason = "throttle-deferred-reason"
	// Retried counts the retries the tasks before a copy spent: a copy's
	// MaxRetry is what is left of the original's.
	Retried = "throttle-retried"
	// Tenant carries the tenant a task's share is counted for
	// (throttle.Tenant); the default tenant "" when absent.
	Tenant = "throttle-tenant"
	// Uses carries what a task uses of units other than requests
	// (throttle.Uses): "tokens=1200,input-tokens=300", sorted by unit.
	Uses = "throttle-uses"
)

// MaxKeys is how many limiter keys one task may name (throttle.Key).
const MaxKeys = lua.MaxKeys

// KeyHeader is the header of a task's key at position i (1-based): Key
// for the first, "throttle-key-2" to "throttle-key-4" for the others.
func KeyHeader(i int) string {
	if i <= 1 {
		return Key
	}
	if i <= MaxKeys+1 {
		return keyHeaders[i-2]
	}
	return Key + "-" + strconv.Itoa(i)
}

// keyHeaders are the headers of keys 2 on (and one past the last, which
// KeysOfTask refuses): a lookup for every task allocates no name.
var keyHeaders = func() []string {
	h := make([]string, MaxKeys)
	for i := range h {
		h[i] = Key + "-" + strconv.Itoa(i+2)
	}
	return h
}()

// SetKeys stores a task's key names in headers, after checking them: 1 to
// MaxKeys valid names, none twice. An error names the position of the
// name at fault ("name 2: ...").
func SetKeys(headers map[string]string, names []string) error {
	switch {
	case len(names) == 0:
		return fmt.Errorf("no name given: %w", ErrInvalidKey)
	case len(names) > MaxKeys:
		return fmt.Errorf("%d names: at most %d: %w", len(names), MaxKeys, ErrInvalidKey)
	}
	for i, n := range names {
		if err := Validate(n); err != nil {
			return fmt.Errorf("name %d: %w", i+1, err)
		}
		for j := range i {
			if names[j] == n {
				return fmt.Errorf("name %d %s: the same as name %d: %w", i+1, Quote(n), j+1, ErrInvalidKey)
			}
		}
	}
	for i, n := range names {
		headers[KeyHeader(i+1)] = n
	}
	return nil
}

// KeysOfTask returns the further keys of a task (its headers
// "throttle-key-2" on, in order), after its key, which KeyOfTask returns.
// None is nil (a task of one key, the common case, allocates nothing). An
// invalid name, a gap, a duplicate or further keys without a key in Key
// is an error wrapping ErrInvalidKey (the enqueuer's bug).
func KeysOfTask(t *asynq.Task, key string) ([]string, error) {
	h := t.Headers()
	if _, ok := h[KeyHeader(2)]; !ok {
		return nil, nil
	}
	if _, ok := h[Key]; !ok {
		return nil, fmt.Errorf("%w: task type %q: header %s without %s", ErrInvalidKey, t.Type(), KeyHeader(2), Key)
	}
	var more []string
	for i := 2; i <= MaxKeys; i++ {
		n, ok := h[KeyHeader(i)]
		if !ok {
			break
		}
		if err := Validate(n); err != nil {
			return nil, fmt.Errorf("throttle: task type %q: header %s: %w", t.Type(), KeyHeader(i), err)
		}
		if n == key || slices.Contains(more, n) {
			return nil, fmt.Errorf("%w: task type %q: header %s: %s named twice", ErrInvalidKey, t.Type(), KeyHeader(i), Quote(n))
		}
		more = append(more, n)
	}
	if _, ok := h[KeyHeader(MaxKeys+1)]; ok {
		return nil, fmt.Errorf("%w: task type %q: header %s: at most %d keys", ErrInvalidKey, t.Type(), KeyHeader(MaxKeys+1), MaxKeys)
	}
	return more, nil
}

// ErrInvalidKey is returned for a key name that Validate refuses.
var ErrInvalidKey = errors.New("throttle: invalid key")

// Validate reports whether name can be used as a limiter key: non-empty, at
// most MaxKeyLen bytes of valid UTF-8, printable, without '{' or '}' but in
// a family tag at its start, followed by more: "{slack}:T0123" is of the
// family "slack" (see Family). The error wraps ErrInvalidKey.
func Validate(name string) error {
	bad := func(why string) error { return fmt.Errorf("%w: %s: %s", ErrInvalidKey, Quote(name), why) }
	switch {
	case name == "":
		return bad("must not be empty")
	case len(name) > MaxKeyLen:
		return bad(fmt.Sprintf("is %d bytes, at most %d", len(name), MaxKeyLen))
	case !utf8.ValidString(name):
		return bad("is not valid UTF-8")
	}
	rest := name
	if strings.HasPrefix(name, "{") {
		end := strings.IndexByte(name, '}')
		if end < 0 {
			return bad("opens a family tag with '{' but never closes it with '}'")
		}
		if end == 1 || strings.IndexByte(name[1:end], '{') >= 0 {
			return bad("a family tag is one or more characters between '{' and '}', at the start: {slack}:T0123")
		}
		rest = name[end+1:]
		if rest == "" {
			// "{other}" and "{none}" are metrics labels no key can take.
			return bad("a family tag needs the rest of the name after it: {slack}:app")
		}
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("contains the unprintable character %U", r))
		}
	}
	if strings.ContainsAny(rest, "{}") {
		return bad("must not contain '{' or '}' but in a family tag at its start ({slack}:T0123)")
	}
	return nil
}

// Family returns the family tag a valid name starts with ("slack" for
// "{slack}:T0123"), or "" when it has none. On a Redis Cluster every Redis
// key of the keys of one family is in one slot (RedisKeys), so one script
// can decide for several of them; keys without a family each have a slot
// of their own.
func Family(name string) string {
	if !strings.HasPrefix(name, "{") {
		return ""
	}
	end := strings.IndexByte(name, '}')
	if end < 0 {
		return ""
	}
	return name[1:end]
}

// Quote quotes a key name for an error: at most 64 bytes of it, and its
// length when it is longer (a hostile name must not make a megabyte error).
func Quote(name string) string {
	const show = 64
	if len(name) <= show {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q... (%d bytes)", name[:show], len(name))
}

// RedisKeys derives every Redis key of one limiter key; all share the hash
// tag {name}, so a Redis Cluster keeps them in one slot. For a name with a
// family tag the hash tag Redis reads is "{family" ("prefix:{{slack}:T0123}:b":
// the tag ends at the first '}'), the same for every key of the family.
func RedisKeys(prefix, name string) (lua.Keys, error) {
	if err := Validate(name); err != nil {
		return lua.Keys{}, err
	}
	base := prefix + ":{" + name + "}:"
	return lua.Keys{Bucket: base + "b", Reservations: base + "r", Slots: base + "f", Tenants: base + "a", Tags: base + "t", Config: base + "c"}, nil
}

// Index is the Redis key of the index of a Limiter's keys under prefix: a
// sorted set of their names (throttle's Keys reads it). It has no hash tag
// and no '{', so no limiter key's Redis keys can be it.
func Index(prefix string) string { return prefix + ":keys" }

// All lists every Redis key of one limiter key. It names every field of
// lua.Keys (TestAllCoversTheLayout checks).
func All(k lua.Keys) []string {
	return append(Deletable(k), k.Slots)
}

// Deletable lists what Limiter.Delete removes: every Redis key of one
// limiter key but its slots in flight, which running handlers hold.
func Deletable(k lua.Keys) []string {
	return []string{k.Bucket, k.Reservations, k.Tenants, k.Tags, k.Config}
}

// ScanPattern is the SCAN MATCH pattern of every Redis key RedisKeys can
// derive under prefix: "prefix:{*}:*", with glob characters of the prefix
// escaped.
func ScanPattern(prefix string) string {
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

// NameOf returns the limiter key a Redis key belongs to under prefix (the
// inverse of RedisKeys), or false when it is none of them.
func NameOf(prefix, redisKey string) (string, bool) {
	rest, ok := strings.CutPrefix(redisKey, prefix+":{")
	if !ok {
		return "", false
	}
	// The last "}:": a name's family tag has a '}' of its own.
	i := strings.LastIndex(rest, "}:")
	if i < 0 {
		return "", false
	}
	name := rest[:i]
	if Validate(name) != nil {
		return "", false
	}
	return name, true
}

// KeyOfTask picks the key of a task: its Key header, else fn's key (when
// fn is not nil), else the type up to its first ':' ("slack:sync" is
// throttled as "slack"). An invalid key in the header, or from fn, is an
// error wrapping ErrInvalidKey (the enqueuer's bug), returned with that
// key; a type prefix that is not a valid key gives "" and invalidPrefix
// true (the task runs unthrottled).
func KeyOfTask(t *asynq.Task, fn func(*asynq.Task) string) (key string, invalidPrefix bool, err error) {
	if k, ok := t.Headers()[Key]; ok {
		if err := Validate(k); err != nil {
			return k, false, fmt.Errorf("throttle: task type %q: header %s: %w", t.Type(), Key, err)
		}
		return k, false, nil
	}
	if fn != nil {
		k := fn(t)
		if k == "" {
			return "", false, nil
		}
		if err := Validate(k); err != nil {
			return k, false, fmt.Errorf("throttle: task type %q: the key WithKeyFunc gave: %w", t.Type(), err)
		}
		return k, false, nil
	}
	i := strings.IndexByte(t.Type(), ':')
	if i <= 0 {
		return "", false, nil
	}
	if Validate(t.Type()[:i]) != nil {
		return "", true, nil
	}
	return t.Type()[:i], false, nil
}

// MaxUnitLen is the longest unit name (throttle.Limit.In, throttle.Uses).
const MaxUnitLen = 32

// ValidateUnit checks a unit's name: 1 to MaxUnitLen of a-z, 0-9, '_' and
// '-', starting with a letter.
func ValidateUnit(unit string) error {
	if unit == "" || len(unit) > MaxUnitLen {
		return fmt.Errorf("unit %q: want 1 to %d characters", unit, MaxUnitLen)
	}
	for i, r := range unit {
		ok := r >= 'a' && r <= 'z' || i > 0 && (r >= '0' && r <= '9' || r == '_' || r == '-')
		if !ok {
			return fmt.Errorf("unit %q: want a lowercase letter, then a-z, 0-9, '_' or '-'", unit)
		}
	}
	return nil
}

// EditDistance is the optimal string alignment distance of a and b, in
// bytes: insertions, deletions, substitutions and swaps of neighbours
// ("slakc" is one edit from "slack"), for "did you mean" hints.
func EditDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
