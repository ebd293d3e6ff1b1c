// Package lua holds the Redis Lua scripts that make every throttling decision,
// embedded from .lua files, and the typed Go wrappers that run them.
//
// Every script starts with lib.lua (shared helpers) and reads Redis TIME once,
// so the whole fleet shares one clock. All keys of one limiter key share a hash
// tag and are passed in KEYS, so the scripts run unchanged on Redis Cluster.
// go-redis runs scripts with EVALSHA and falls back to EVAL on NOSCRIPT, so a
// restart, failover or SCRIPT FLUSH reloads the script instead of failing.
package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed setlimits.lua
	setLimitsSrc string
	//go:embed suspend.lua
	suspendSrc string
	//go:embed inspect.lua
	inspectSrc string
)

// The scripts, each prefixed with the shared helpers.
var (
	decideScript    = redis.NewScript(libSrc + decideSrc)
	setLimitsScript = redis.NewScript(libSrc + setLimitsSrc)
	suspendScript   = redis.NewScript(libSrc + suspendSrc)
	inspectScript   = redis.NewScript(libSrc + inspectSrc)
)

// Status codes in the first element of a Decide reply.
const (
	StatusAllowed   = 1
	StatusDenied    = 0
	StatusBadConfig = -1
	StatusNoLimits  = -2
)

// Keys are the Redis keys of one limiter key. All four must hash to one slot.
type Keys struct {
	Config       string // hash: tiers, rate:i, per_ms:i, burst:i
	State        string // hash: ts (us), tk:i (tokens), vnext (us, next free reservation slot)
	Suspend      string // string: suspended until (us)
	Reservations string // sorted set: task ID scored by its slot (us)
}

func (k Keys) all() []string { return []string{k.Config, k.State, k.Suspend, k.Reservations} }

// Tier is one validated limit as the scripts store it: Rate tokens every
// PerMS milliseconds, holding at most Burst.
type Tier struct {
	Rate, PerMS, Burst int64
}

func appendTiers(args []any, tiers []Tier) []any {
	args = append(args, len(tiers))
	for _, t := range tiers {
		args = append(args, t.Rate, t.PerMS, t.Burst)
	}
	return args
}

// DecideArgs are the inputs of one decision.
type DecideArgs struct {
	// TaskID names the caller for a reservation; "" never reserves.
	TaskID string
	// Granule is how precisely a denied caller can come back (asynq: 1 s).
	// Reservation slots are spaced so that one granule of returning callers
	// fits in every tier's burst. Zero means callers return on time.
	Granule time.Duration
	// Horizon is how far ahead a slot may be reserved; zero never reserves.
	Horizon time.Duration
	// Lapse is how long a reservation is kept after its slot.
	Lapse time.Duration
	// IdleExpiry is refreshed on the config at every call.
	IdleExpiry time.Duration
	// Defaults apply when the key has no config in Redis.
	Defaults []Tier
	// Lease is how many tokens an admitted caller without a reservation may
	// take at once for its process (the extra ones come back as
	// DecideReply.Lease), granted only while every tier keeps at least
	// Lease tokens; 0 or 1 means one token per decision.
	Lease int
}

// DecideReply is the outcome of one decision.
type DecideReply struct {
	Status     int           // StatusAllowed, StatusDenied, StatusBadConfig or StatusNoLimits
	RetryAfter time.Duration // when denied: wait at least this long
	Remaining  int64         // when allowed: tokens left in the tightest tier
	RefusedBy  string        // "tier:N", "suspended", "queue" or "reserved"
	Slot       time.Time     // when denied with a reservation: the reserved slot (Redis clock)
	Lease      int64         // when allowed: extra tokens taken for the caller's process
	Field      string        // when StatusBadConfig: the offending config field
	Reason     string        // when StatusBadConfig: what is wrong with it
}

// Decide runs decide.lua for one caller.
//
//	KEYS[1] config  KEYS[2] state  KEYS[3] suspend  KEYS[4] reservations
//	ARGV[1] number of decisions n (callers decided in this run, in order)
//	ARGV[2] granule, microseconds
//	ARGV[3] reservation horizon, microseconds (0 = never reserve)
//	ARGV[4] lapse, microseconds
//	ARGV[5] config inactivity expiry, milliseconds
//	ARGV[6] lease: tokens an admitted caller may take for its process (0 = 1)
//	ARGV[7] number of default tiers d, then rate, per_ms, burst per tier
//	then n task IDs ("" = no reservation), one per decision
//
// Reply: the n decisions joined by ';', each one string (reading it costs no
// allocation): "status|retry_after_us|remaining|refused_by|slot_us" (status
// 1 allowed, 0 denied), with "|extra" appended when a lease granted extra
// tokens, "-1|field|reason" for a bad config, "-2" without limits.
func Decide(ctx context.Context, c redis.Scripter, k Keys, a DecideArgs) (DecideReply, error) {
	args := AppendDecideArgs(nil, k, a)
	args[NArg] = 1
	args = append(args, a.TaskID)
	s, err := decideScript.Run(ctx, c, k.all(), args[firstARGV:]...).Text()
	if err != nil {
		return DecideReply{}, err
	}
	return ParseDecide(s)
}

// DecideSHA is the SHA1 of the decide script, for EVALSHA in pipelines.
var DecideSHA = decideScript.Hash()

// LoadDecide loads the decide script into c's script cache (every master of
// a cluster), after NOSCRIPT.
func LoadDecide(ctx context.Context, c redis.Scripter) error {
	return decideScript.Load(ctx, c).Err()
}

// Positions in the command AppendDecideArgs builds.
const (
	firstARGV = 7 // "evalsha", sha, 4, four keys
	// NArg is where the number of decisions goes (ARGV[1]); the caller sets it.
	NArg = firstARGV
)

// AppendDecideArgs appends the EVALSHA command of a run of decide.lua to dst
// without its task IDs: "evalsha", sha, 4, the keys, then ARGV up to the
// defaults. The caller sets dst[NArg] to the number of decisions and appends
// one task ID per decision. a.TaskID is ignored.
func AppendDecideArgs(dst []any, k Keys, a DecideArgs) []any {
	dst = append(dst, "evalsha", DecideSHA, 4, k.Config, k.State, k.Suspend, k.Reservations,
		1, a.Granule.Microseconds(), a.Horizon.Microseconds(),
		a.Lapse.Microseconds(), a.IdleExpiry.Milliseconds(), a.Lease)
	return appendTiers(dst, a.Defaults)
}

// NextReply splits the first decision off a reply of several: it returns
// that decision's reply and the rest ("" after the last).
func NextReply(s string) (first, rest string) {
	if i := strings.IndexByte(s, ';'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// ParseDecide reads a decide reply without allocating.
func ParseDecide(s string) (DecideReply, error) {
	reply := s
	var f [6]string
	n := 0
	for n < 5 {
		i := strings.IndexByte(s, '|')
		if i < 0 {
			break
		}
		f[n], s = s[:i], s[i+1:]
		n++
	}
	f[n] = s
	n++
	switch {
	case n == 1 && f[0] == "-2":
		return DecideReply{Status: StatusNoLimits}, nil
	case n == 3 && f[0] == "-1":
		return DecideReply{Status: StatusBadConfig, Field: f[1], Reason: f[2]}, nil
	case (n != 5 && !(n == 6 && f[0] == "1")) || (f[0] != "0" && f[0] != "1"):
		return DecideReply{}, errBadReply("decide", reply)
	}
	retry, ok1 := parseNum(f[1])
	remaining, ok2 := parseNum(f[2])
	slot, ok3 := parseNum(f[4])
	if !ok1 || !ok2 || !ok3 || retry < 0 || remaining < 0 {
		return DecideReply{}, errBadReply("decide", reply)
	}
	r := DecideReply{
		Status:     int(f[0][0] - '0'),
		RetryAfter: time.Duration(retry) * time.Microsecond,
		Remaining:  remaining,
		RefusedBy:  f[3],
	}
	if slot > 0 {
		r.Slot = time.UnixMicro(slot)
	}
	if n == 6 {
		extra, ok := parseNum(f[5])
		if !ok || extra < 0 {
			return DecideReply{}, errBadReply("decide", reply)
		}
		r.Lease = extra
	}
	return r, nil
}

// SetLimits runs setlimits.lua: tokens are brought up to date under the old
// limits (the config in Redis, else defaults) and clamped to the new bursts,
// the reservation queue is dropped, then the config is replaced.
//
//	KEYS[1] config  KEYS[2] state  KEYS[3] reservations
//	ARGV[1] config inactivity expiry, milliseconds
//	ARGV[2] number of tiers n, then ARGV[3..2+3n] rate, per_ms, burst per tier
//	then the number of default tiers, then rate, per_ms, burst per default tier
//
// Reply: {1}, or {-1, field, reason} when a tier is out of range.
func SetLimits(ctx context.Context, c redis.Scripter, k Keys, idle time.Duration, tiers, defaults []Tier) (field, reason string, err error) {
	args := appendTiers([]any{idle.Milliseconds()}, tiers)
	args = appendTiers(args, defaults)
	v, err := setLimitsScript.Run(ctx, c, []string{k.Config, k.State, k.Reservations}, args...).Slice()
	if err != nil {
		return "", "", err
	}
	if len(v) == 3 {
		field, _ = v[1].(string)
		reason, _ = v[2].(string)
		return field, reason, nil
	}
	if len(v) != 1 {
		return "", "", errBadReply("setlimits", v)
	}
	return "", "", nil
}

// Suspend runs suspend.lua: the key is suspended until now+d (d capped at
// max) or until its current end, whichever is later.
//
//	KEYS[1] suspend
//	ARGV[1] duration, microseconds   ARGV[2] maximum, microseconds
//
// Reply: the remaining suspension in microseconds, as a string.
func Suspend(ctx context.Context, c redis.Scripter, k Keys, d, max time.Duration) (time.Duration, error) {
	v, err := suspendScript.Run(ctx, c, []string{k.Suspend}, d.Microseconds(), max.Microseconds()).Result()
	if err != nil {
		return 0, err
	}
	us, ok := num(v)
	if !ok {
		return 0, errBadReply("suspend", v)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// InspectReply is a read-only view of one key.
type InspectReply struct {
	Status       int           // StatusAllowed (limits known), StatusBadConfig or StatusNoLimits
	Suspended    time.Duration // remaining suspension, 0 if none
	Reservations int64         // outstanding reservations
	QueuedFor    time.Duration // time until the last reserved slot
	FromRedis    bool          // the tiers are the config in Redis, not the defaults
	Tiers        []Tier        // the tiers in force, validated by the script
	Tokens       []float64     // tokens per tier now
	Field        string
	Reason       string
}

// Inspect runs inspect.lua; it writes nothing.
//
//	KEYS as Decide; ARGV[1] number of default tiers, then rate, per_ms, burst per tier
//
// Reply: {1, suspended_us, reservations, queued_us, from_redis (0/1), n, then
// rate, per_ms, burst, tokens per tier}; {-2, suspended_us, reservations}
// without limits; {-1, field, reason} for a bad config.
func Inspect(ctx context.Context, c redis.Scripter, k Keys, defaults []Tier) (InspectReply, error) {
	v, err := inspectScript.Run(ctx, c, k.all(), appendTiers(nil, defaults)...).Slice()
	if err != nil {
		return InspectReply{}, err
	}
	bad := errBadReply("inspect", v)
	if len(v) < 3 {
		return InspectReply{}, bad
	}
	status, _ := v[0].(int64)
	if status == StatusBadConfig {
		field, _ := v[1].(string)
		reason, _ := v[2].(string)
		return InspectReply{Status: StatusBadConfig, Field: field, Reason: reason}, nil
	}
	susp, ok1 := num(v[1])
	resv, ok2 := v[2].(int64)
	if !ok1 || !ok2 {
		return InspectReply{}, bad
	}
	r := InspectReply{Status: int(status), Suspended: time.Duration(susp) * time.Microsecond, Reservations: resv}
	if status == StatusNoLimits {
		return r, nil
	}
	if len(v) < 6 {
		return InspectReply{}, bad
	}
	q, ok1 := num(v[3])
	fromRedis, ok2 := v[4].(int64)
	n, ok3 := v[5].(int64)
	if !ok1 || !ok2 || !ok3 || len(v) != 6+4*int(n) {
		return InspectReply{}, bad
	}
	r.QueuedFor = time.Duration(q) * time.Microsecond
	r.FromRedis = fromRedis == 1
	for i := range int(n) {
		e := v[6+4*i : 10+4*i]
		rate, ok1 := num(e[0])
		per, ok2 := num(e[1])
		burst, ok3 := num(e[2])
		s, _ := e[3].(string)
		tokens, err := strconv.ParseFloat(s, 64)
		if !ok1 || !ok2 || !ok3 || err != nil {
			return InspectReply{}, bad
		}
		r.Tiers = append(r.Tiers, Tier{Rate: rate, PerMS: per, Burst: burst})
		r.Tokens = append(r.Tokens, tokens)
	}
	return r, nil
}

// num reads an integer that the script sent as a %.17g string.
// Anything not finite or outside int64 is refused rather than wrapped around.
func num(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	return parseNum(s)
}

func parseNum(s string) (int64, bool) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// ErrBadReply reports a script reply of an unexpected shape (a script and
// wrapper out of step, or something other than Redis answering).
var ErrBadReply = errors.New("lua: unexpected script reply")

func errBadReply(script string, v any) error {
	return fmt.Errorf("%w from %s: %#v", ErrBadReply, script, v)
}
