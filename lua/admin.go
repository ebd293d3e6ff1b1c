package lua

import (
	"context"
	"strconv"
	"time"
)

// SetLimits runs setlimits.lua: each new tier takes over the tokens of the
// old tier with the same period (brought up to date under the old limits:
// the ones in Redis, else the defaults the buckets were computed under,
// else defaults), clamped to its burst; the reservation queue is dropped,
// then the limits are replaced and their generation bumped.
//
//	KEYS[1] bucket hash  KEYS[2] reservations
//	ARGV[1] limits' inactivity expiry, milliseconds
//	ARGV[2] the new limits, "rate/per_ms/burst ..."
//	ARGV[3] default limits, same form ("" = none)
//
// Reply: {1, generation}, or {-1, field, reason} when a tier is out of range.
func SetLimits(ctx context.Context, r *Runner, k Keys, idle time.Duration, tiers, defaults []Tier) (field, reason string, err error) {
	v, err := r.Run(ctx, setLimitsScript, []string{k.Bucket, k.Reservations},
		idle.Milliseconds(), FormatTiers(tiers), FormatTiers(defaults))
	if err != nil {
		return "", "", err
	}
	a, ok := v.([]any)
	switch {
	case ok && len(a) == 3:
		field, _ = a[0+1].(string)
		reason, _ = a[2].(string)
		return field, reason, nil
	case ok && len(a) == 2:
		return "", "", nil
	}
	return "", "", errBadReply("setlimits", v)
}

// Suspend runs suspend.lua: the key is suspended until now+d (d capped at
// max) or until its current end, whichever is later.
//
//	KEYS[1] bucket hash
//	ARGV[1] duration, microseconds   ARGV[2] maximum, microseconds
//
// Reply: the remaining suspension in microseconds, as a string.
func Suspend(ctx context.Context, r *Runner, k Keys, d, max time.Duration) (time.Duration, error) {
	v, err := r.Run(ctx, suspendScript, []string{k.Bucket}, d.Microseconds(), max.Microseconds())
	if err != nil {
		return 0, err
	}
	us, ok := num(v)
	if !ok {
		return 0, errBadReply("suspend", v)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// Resume runs resume.lua: the suspension ends now, and with it the
// reservation schedule built while it lasted.
//
//	KEYS[1] bucket hash  KEYS[2] reservations  KEYS[3] the previous layout's suspend key
//
// Reply: the suspension that was left, in microseconds (0: not suspended).
func Resume(ctx context.Context, r *Runner, k Keys) (time.Duration, error) {
	v, err := r.Run(ctx, resumeScript, []string{k.Bucket, k.Reservations, k.OldSuspend})
	if err != nil {
		return 0, err
	}
	us, ok := num(v)
	if !ok {
		return 0, errBadReply("resume", v)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// Migrate runs migrate.lua: what the key holds in the previous storage
// layout (limits, bucket state, suspension) and the current hash lacks is
// carried over. Old keys are left for processes of the previous version.
//
//	KEYS[1] bucket hash  KEYS[2..4] the previous layout's config, state, suspend
//	ARGV[1] limits' inactivity expiry, milliseconds
//	ARGV[2] default limits (to read old state of a key without limits in Redis)
//
// Reply: 1 when anything was carried over, else 0.
func Migrate(ctx context.Context, r *Runner, k Keys, idle time.Duration, defaults []Tier) (bool, error) {
	v, err := r.Run(ctx, migrateScript, []string{k.Bucket, k.OldConfig, k.OldState, k.OldSuspend},
		idle.Milliseconds(), FormatTiers(defaults))
	if err != nil {
		return false, err
	}
	n, ok := v.(int64)
	if !ok {
		return false, errBadReply("migrate", v)
	}
	return n == 1, nil
}

// Adjust runs adjust.lua: every tier of the key takes delta more calls'
// worth as of now (a negative delta gives them back).
//
//	KEYS[1] bucket hash
//	ARGV[1] delta, calls   ARGV[2] limits' inactivity expiry, milliseconds
//	ARGV[3] default limits ("" = none)
//
// Reply: 1 when the key had limits, else 0.
func Adjust(ctx context.Context, r *Runner, k Keys, delta int, idle time.Duration, defaults []Tier) error {
	_, err := r.Run(ctx, adjustScript, []string{k.Bucket}, delta, idle.Milliseconds(), FormatTiers(defaults))
	return err
}

// Release runs release.lua: the slots in flight are given back, and how
// long they were held is learned.
//
//	KEYS[1] bucket hash  KEYS[2] slots in flight
//	ARGV the slots (Hold of each decision)
//
// Reply: how many were still held.
func Release(ctx context.Context, r *Runner, k Keys, holds ...string) (int64, error) {
	args := make([]any, len(holds))
	for i, h := range holds {
		args[i] = h
	}
	v, err := r.Run(ctx, releaseScript, []string{k.Bucket, k.Slots}, args...)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, errBadReply("release", v)
	}
	return n, nil
}

// Extend runs extend.lua: the leases of the slots still held end lease from
// now.
//
//	KEYS[1] slots in flight
//	ARGV[1] lease, microseconds; then the slots
//
// Reply: how many were renewed (a slot whose lease had ended is not).
func Extend(ctx context.Context, r *Runner, k Keys, lease time.Duration, holds ...string) (int64, error) {
	args := make([]any, 0, 1+len(holds))
	args = append(args, lease.Microseconds())
	for _, h := range holds {
		args = append(args, h)
	}
	v, err := r.Run(ctx, extendScript, []string{k.Slots}, args...)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, errBadReply("extend", v)
	}
	return n, nil
}

// InspectReply is a read-only view of one key.
type InspectReply struct {
	Status       int           // StatusAllowed (limits known), StatusBadConfig or StatusNoLimits
	Suspended    time.Duration // remaining suspension, 0 if none
	Reservations int64         // outstanding reservations
	QueuedFor    time.Duration // time until the last reserved slot
	FromRedis    bool          // the tiers are the limits in Redis, not the defaults
	Generation   int64         // the limits' generation
	InFlight     int64         // slots in flight now (with an in-flight limit)
	InFlightMax  int64         // the in-flight limit, 0 without one
	Tiers        []Tier        // the tiers in force, validated by the script
	Tokens       []float64     // tokens per tier now (a window: calls it would still admit)
	Field        string
	Reason       string
}

// Inspect runs inspect.lua; it writes nothing.
//
//	KEYS as Decide; ARGV[1] default limits ("" = none)
//
// Reply: {1, suspended_us, reservations, queued_us, from_redis (0/1), n,
// generation, in_flight, in_flight_max, then kind, rate, per_ms, burst,
// tokens per tier};
// {-2, suspended_us, reservations} without limits; {-1, field, reason} for
// bad limits.
func Inspect(ctx context.Context, r *Runner, k Keys, defaults []Tier) (InspectReply, error) {
	v, err := r.Run(ctx, inspectScript, []string{k.Bucket, k.Reservations, k.Slots}, FormatTiers(defaults))
	if err != nil {
		return InspectReply{}, err
	}
	bad := errBadReply("inspect", v)
	a, ok := v.([]any)
	if !ok || len(a) < 3 {
		return InspectReply{}, bad
	}
	status, _ := a[0].(int64)
	if status == StatusBadConfig {
		field, _ := a[1].(string)
		reason, _ := a[2].(string)
		return InspectReply{Status: StatusBadConfig, Field: field, Reason: reason}, nil
	}
	susp, ok1 := num(a[1])
	resv, ok2 := a[2].(int64)
	if !ok1 || !ok2 {
		return InspectReply{}, bad
	}
	out := InspectReply{Status: int(status), Suspended: time.Duration(susp) * time.Microsecond, Reservations: resv}
	if status == StatusNoLimits {
		return out, nil
	}
	const head, per = 9, 5
	if len(a) < head {
		return InspectReply{}, bad
	}
	q, ok1 := num(a[3])
	fromRedis, ok2 := a[4].(int64)
	n, ok3 := a[5].(int64)
	gen, ok4 := num(a[6])
	inflight, ok5 := a[7].(int64)
	inflightMax, ok6 := a[8].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || n < 0 || len(a) != head+per*int(n) {
		return InspectReply{}, bad
	}
	out.InFlight, out.InFlightMax = inflight, inflightMax
	out.QueuedFor = time.Duration(q) * time.Microsecond
	out.FromRedis = fromRedis == 1
	out.Generation = gen
	for i := range int(n) {
		e := a[head+per*i : head+per*(i+1)]
		kind, _ := e[0].(string)
		rate, ok1 := num(e[1])
		perMS, ok2 := num(e[2])
		burst, ok3 := num(e[3])
		s, _ := e[4].(string)
		tokens, err := strconv.ParseFloat(s, 64)
		if !ok1 || !ok2 || !ok3 || err != nil || len(kind) != 1 {
			return InspectReply{}, bad
		}
		t := Tier{Rate: rate, PerMS: perMS, Burst: burst}
		if kind == "w" {
			t.Kind = KindWindow
		}
		out.Tiers = append(out.Tiers, t)
		out.Tokens = append(out.Tokens, tokens)
	}
	return out, nil
}
