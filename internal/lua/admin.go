package lua

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SetLimitsReply is what SetLimits did.
type SetLimitsReply struct {
	// Field and Reason name a tier out of range (nothing was set).
	Field, Reason string
	// Changed reports that the limits differ from those in force: they were
	// set, and the reservation queue dropped.
	Changed bool
	// Reserved are the tasks that held a reservation in the queue dropped
	// (at most 100,000).
	Reserved []string
}

// SetLimits runs setlimits.lua: each new tier takes over the tokens of the
// old tier with the same period (brought up to date under the old limits:
// the ones in Redis, else the defaults the buckets were computed under,
// else defaults), clamped to its burst; the reservation queue is dropped,
// then the limits are replaced and their generation bumped. Limits equal to
// those in force change nothing.
//
//	KEYS[1] bucket hash  KEYS[2] reservations  KEYS[3] configuration
//	KEYS[4] active tenants  KEYS[5] start tags
//	ARGV[1] the new limits, "rate/per_ms/burst ..."
//	ARGV[2] default limits, same form ("" = none)
//
// Reply: {1, generation, changed (0/1), the tasks that held a reservation...},
// or {-1, field, reason} when a tier is out of range.
func SetLimits(ctx context.Context, r *Runner, k Keys, tiers, defaults []Tier) (SetLimitsReply, error) {
	v, err := r.Run(ctx, setLimitsScript, []string{k.Bucket, k.Reservations, k.Config, k.Tenants, k.Tags},
		FormatTiers(tiers), FormatTiers(defaults))
	if err != nil {
		return SetLimitsReply{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 3 {
		return SetLimitsReply{}, errBadReply("setlimits", v)
	}
	if status, _ := a[0].(int64); status == StatusBadConfig {
		field, _ := a[1].(string)
		reason, _ := a[2].(string)
		return SetLimitsReply{Field: field, Reason: reason}, nil
	}
	changed, ok := a[2].(int64)
	if !ok {
		return SetLimitsReply{}, errBadReply("setlimits", v)
	}
	out := SetLimitsReply{Changed: changed == 1}
	for _, e := range a[3:] {
		id, ok := e.(string)
		if !ok {
			return SetLimitsReply{}, errBadReply("setlimits", v)
		}
		out.Reserved = append(out.Reserved, id)
	}
	return out, nil
}

// Suspend runs suspend.lua: the key is suspended until now+d (d capped at
// max) or until its current end, whichever is later.
//
//	KEYS[1] bucket hash  KEYS[2] configuration  KEYS[3] active tenants
//	ARGV[1] duration, microseconds   ARGV[2] maximum, microseconds
//
// Reply: {the remaining suspension in microseconds as a string, the
// adaptive factor in parts per million it set (-1: none)}. A new
// suspension of a key with adaptive limits cuts its rate tiers.
func Suspend(ctx context.Context, r *Runner, k Keys, d, max time.Duration) (time.Duration, error) {
	s, err := SuspendKey(ctx, r, k, d, max)
	return s.Left, err
}

// Suspended is what SuspendKey did.
type Suspended struct {
	Left time.Duration // the suspension left
	// Adapted reports that the suspension was new on a key with adaptive
	// limits: its rate tiers are now at Factor of the ceiling.
	Adapted bool
	Factor  float64
}

// SuspendKey runs suspend.lua (see Suspend) and reports the adaptive cut.
func SuspendKey(ctx context.Context, r *Runner, k Keys, d, max time.Duration) (Suspended, error) {
	return suspendKey(ctx, r, k, d, max, false)
}

// SuspendForSpendCap is SuspendKey for a provider's spend cap: no
// adaptive cut (the cap says nothing of the rate the provider allows).
func SuspendForSpendCap(ctx context.Context, r *Runner, k Keys, d, max time.Duration) (Suspended, error) {
	return suspendKey(ctx, r, k, d, max, true)
}

func suspendKey(ctx context.Context, r *Runner, k Keys, d, max time.Duration, noAdapt bool) (Suspended, error) {
	v, err := r.Run(ctx, suspendScript, []string{k.Bucket, k.Config, k.Tenants}, d.Microseconds(), max.Microseconds(), boolArg(noAdapt))
	if err != nil {
		return Suspended{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return Suspended{}, errBadReply("suspend", v)
	}
	us, ok1 := num(a[0])
	ppm, ok2 := num(a[1])
	if !ok1 || !ok2 {
		return Suspended{}, errBadReply("suspend", v)
	}
	out := Suspended{Left: time.Duration(us) * time.Microsecond}
	if ppm >= 0 {
		out.Adapted, out.Factor = true, float64(ppm)/1e6
	}
	return out, nil
}

// Resumed is what Resume did.
type Resumed struct {
	// Left is the suspension that was left (0: the key was not suspended,
	// and nothing changed).
	Left time.Duration
	// Reserved are the tasks that held a reservation in the schedule
	// dropped with the suspension (at most 100,000), whichever path booked
	// them: the caller brings them back.
	Reserved []string
}

// Resume runs resume.lua: the suspension ends now, and with it the
// reservation schedule built while it lasted and the state of fair shares
// (whose finish tags count the work those reservations booked); a debt a
// provider's near reset left the buckets in is cleared.
//
//	KEYS[1] bucket hash  KEYS[2] reservations
//	KEYS[3] active tenants  KEYS[4] start tags  KEYS[5] configuration
//	ARGV[1] default limits ("" = none)
//
// Reply: {the suspension that was left in microseconds (0: not
// suspended), the task IDs that held a reservation...}.
func Resume(ctx context.Context, r *Runner, k Keys, defaults []Tier) (Resumed, error) {
	v, err := r.Run(ctx, resumeScript, []string{k.Bucket, k.Reservations, k.Tenants, k.Tags, k.Config}, FormatTiers(defaults))
	if err != nil {
		return Resumed{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 1 {
		return Resumed{}, errBadReply("resume", v)
	}
	us, ok := num(a[0])
	if !ok {
		return Resumed{}, errBadReply("resume", v)
	}
	out := Resumed{Left: time.Duration(us) * time.Microsecond}
	for _, e := range a[1:] {
		id, ok := e.(string)
		if !ok {
			return Resumed{}, errBadReply("resume", v)
		}
		out.Reserved = append(out.Reserved, id)
	}
	return out, nil
}

// Call identifies an admitted call whose cost is settled by Adjust.
type Call struct {
	At         time.Time // when it was admitted (DecideReply.At); zero: unknown
	Charged    int       // what it was charged so far
	Generation int64     // the limits' generation it was admitted under
	Unit       string    // the unit settled: "" requests, else another unit's tiers alone
	// Tenant is the call's tenant ("" the default tenant), settled with the
	// tiers on a key tenants share.
	Tenant string
	// Forward says that the caller runs now the tasks whose reservations a
	// refund brings forward (Settle returns them).
	Forward bool
	// Estimate is what the call was charged of Unit when admitted (0: Charged),
	// the worth of a booked task when a refund brings reservations forward.
	Estimate int
}

// Forwarded is a reservation a refund brought forward: the task that holds
// it, and the instant it held before (the task, if it still waits for that
// instant, is the one that booked it).
type Forwarded struct {
	ID string
	At time.Time
}

// Adjust runs adjust.lua: every tier of the key takes delta more calls'
// worth as of now, or gives -delta back as far as it can without admitting
// more real calls than had call cost that much less (see adjust.lua); on a
// key tenants share, the call's tenant is settled likewise. It is Settle
// without bringing reservations forward.
func Adjust(ctx context.Context, r *Runner, k Keys, delta int, call Call, defaults []Tier) error {
	call.Forward = false
	_, err := Settle(ctx, r, k, delta, call, defaults)
	return err
}

// Settle runs adjust.lua, as Adjust; with call.Forward, a refund of another
// unit than requests while a queue of reservations is outstanding brings
// the latest reservations forward, one for each booked task's worth given
// back (at most 16), and Settle returns them, latest first: the caller is
// to run those tasks now, if they still wait for the instants they held.
//
//	KEYS[1] bucket hash  KEYS[2] configuration  KEYS[3] active tenants
//	KEYS[4] reservations
//	ARGV[1] delta, calls   ARGV[2] default limits ("" = none)
//	ARGV[3] when the call was admitted, microseconds of the Redis clock (0 unknown)
//	ARGV[4] what the call was charged so far   ARGV[5] its limits' generation
//	ARGV[6] the unit settled ("" requests)   ARGV[7] its tenant ("" the default)
//	ARGV[8] "1": bring reservations forward   ARGV[9] the call's estimate of the unit
//
// Reply: the task IDs brought forward, each followed by its old instant in
// microseconds of the Redis clock (an empty array: none).
func Settle(ctx context.Context, r *Runner, k Keys, delta int, call Call, defaults []Tier) ([]Forwarded, error) {
	var atUS int64
	if !call.At.IsZero() {
		atUS = call.At.UnixMicro()
	}
	forward := 0
	if call.Forward {
		forward = 1
	}
	v, err := r.Run(ctx, adjustScript, []string{k.Bucket, k.Config, k.Tenants, k.Reservations},
		delta, FormatTiers(defaults), atUS, call.Charged, call.Generation, call.Unit, call.Tenant, forward, call.Estimate)
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok || len(a)%2 != 0 {
		return nil, errBadReply("adjust", v)
	}
	var out []Forwarded
	for i := 0; i < len(a); i += 2 {
		id, ok1 := a[i].(string)
		at, ok2 := a[i+1].(string)
		us, err := strconv.ParseFloat(at, 64)
		if !ok1 || !ok2 || err != nil {
			return nil, errBadReply("adjust", v)
		}
		out = append(out, Forwarded{ID: id, At: time.UnixMicro(int64(us))})
	}
	return out, nil
}

// SetWeights runs setweights.lua: the weights of the key's tenants become
// weights (a tenant not named weighs 1), kept in the configuration until
// Delete.
//
//	KEYS[1] bucket hash  KEYS[2] active tenants  KEYS[3] configuration
//	ARGV tenant, weight pairs
//
// Reply: how many weights are set. The caller validates the names and the
// weights (whole numbers from 1 to 1e6).
func SetWeights(ctx context.Context, r *Runner, k Keys, weights map[string]int) (int, error) {
	names := make([]string, 0, len(weights))
	for name := range weights {
		names = append(names, name)
	}
	sort.Strings(names)
	args := make([]any, 0, 2*len(names))
	for _, name := range names {
		args = append(args, name, weights[name])
	}
	v, err := r.Run(ctx, setWeightsScript, []string{k.Bucket, k.Tenants, k.Config}, args...)
	if err != nil {
		return 0, err
	}
	n, ok := num(v)
	if !ok {
		return 0, errBadReply("setweights", v)
	}
	return int(n), nil
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

// Unbook runs unbook.lua: the booking of task id (a reservation that
// Limiter.Enqueue made for a task asynq then refused) is given up, and what
// it wrote undone: the reservation or its hold ("~" + id, a task of
// several keys), its start tag and its tenant's work on
// a key tenants share, else the buckets' schedule when it was the last
// booking and the calls it reserved in each window.
//
//	KEYS[1] bucket hash  KEYS[2] reservations  KEYS[3] active tenants  KEYS[4] start tags
//	KEYS[5] configuration
//	ARGV[1] task ID  ARGV[2] tenant ("" the default)  ARGV[3] its cost (as decide takes it)
//	ARGV[4] default limits ("" = none)
//
// Reply: 1 when the booking (or a hold) was there, else 0.
func Unbook(ctx context.Context, r *Runner, k Keys, id, tenant string, cost any, defaults []Tier) (bool, error) {
	v, err := r.Run(ctx, unbookScript, []string{k.Bucket, k.Reservations, k.Tenants, k.Tags, k.Config}, id, tenant, cost, FormatTiers(defaults))
	if err != nil {
		return false, err
	}
	n, ok := v.(int64)
	if !ok {
		return false, errBadReply("unbook", v)
	}
	return n == 1, nil
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
	QueuedFor    time.Duration // time until the last reserved run time
	FromRedis    bool          // the tiers are the limits in Redis, not the defaults
	Generation   int64         // the limits' generation
	InFlight     int64         // slots in flight now (with an in-flight limit)
	InFlightMax  int64         // the in-flight limit, 0 without one
	Tiers        []Tier        // the tiers in force, validated by the script
	Tokens       []float64     // tokens per tier now (a window: calls it would still admit)
	// Configured are the tiers as configured (the ceiling), beside Tiers;
	// LearnedFor is how long each tier's learned quota stays in force
	// unconfirmed (0: none learned).
	Configured []Tier
	LearnedFor []time.Duration
	// AdaptiveEvery is the clean interval of adaptive limits (0: not
	// adaptive); AdaptiveFactor the share of the ceiling in force.
	AdaptiveEvery  time.Duration
	AdaptiveFactor float64
	// Tenants are the key's active tenants (at most 100), then those with a
	// weight set that are not active.
	Tenants []TenantReply
	Field   string
	Reason  string
}

// TenantReply is one tenant of a key (fair.lua).
type TenantReply struct {
	Name     string
	Weight   float64
	Share    float64 // of the key's rate now (0: not active)
	Backlog  float64 // cost units booked and not yet due
	Admitted float64 // cost units admitted while active
}

// Inspect runs inspect.lua; it writes nothing.
//
//	KEYS[1] bucket hash  KEYS[2] reservations  KEYS[3] slots in flight
//	KEYS[4] active tenants  KEYS[5] configuration
//	ARGV[1] default limits ("" = none), ARGV[2] lapse (us):
//	reservations older than it are not counted (0: count all)
//
// Reply: {1, suspended_us, reservations, queued_us, from_redis (0/1), n,
// generation, in_flight, in_flight_max, adaptive_every_us, adaptive_ppm,
// then kind, rate, per_ms, burst, tokens, configured rate, configured
// burst, learned_for_us per tier};
// {-2, suspended_us, reservations} without limits; {-1, field, reason} for
// bad limits.
func Inspect(ctx context.Context, r *Runner, k Keys, defaults []Tier, lapse time.Duration) (InspectReply, error) {
	v, err := r.Run(ctx, inspectScript, []string{k.Bucket, k.Reservations, k.Slots, k.Tenants, k.Config}, FormatTiers(defaults), lapse.Microseconds())
	if err != nil {
		return InspectReply{}, err
	}
	return parseInspect(v)
}

// InspectMany runs inspect.lua once for several keys, read at one instant
// (all of them in one slot of a Cluster, or any on one Redis): KEYS five
// per key as Inspect, ARGV as Inspect. It returns a reply or an error per
// key, in the order of ks: the error of a key Redis could not read (a key
// of the wrong type) is that key's alone. err is an error of the call.
func InspectMany(ctx context.Context, r *Runner, ks []Keys, defaults []Tier, lapse time.Duration) ([]InspectReply, []error, error) {
	if len(ks) == 1 {
		rep, err := Inspect(ctx, r, ks[0], defaults, lapse)
		if err != nil && !errors.Is(err, ErrBadReply) && !isReplyError(err) {
			return nil, nil, err
		}
		return []InspectReply{rep}, []error{err}, nil
	}
	keys := make([]string, 0, 5*len(ks))
	for _, k := range ks {
		keys = append(keys, k.Bucket, k.Reservations, k.Slots, k.Tenants, k.Config)
	}
	v, err := r.Run(ctx, inspectScript, keys, FormatTiers(defaults), lapse.Microseconds())
	if err != nil {
		return nil, nil, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != len(ks) {
		return nil, nil, errBadReply("inspect", v)
	}
	replies, errs := make([]InspectReply, len(ks)), make([]error, len(ks))
	for i, v := range a {
		if e, ok := v.([]any); ok && len(e) == 2 && e[0] == int64(-9) {
			msg, _ := e[1].(string)
			errs[i] = KeyError(msg)
			continue
		}
		replies[i], errs[i] = parseInspect(v)
	}
	return replies, errs, nil
}

// KeyError is what Redis answered when the script read one key (e.g.
// "WRONGTYPE Operation against a key holding the wrong kind of value").
type KeyError string

func (e KeyError) Error() string { return string(e) }

// RedisError makes a KeyError a redis.Error: an error reply, not a
// connection's failure.
func (KeyError) RedisError() {}

var _ redis.Error = KeyError("")

// isReplyError reports an error reply of Redis (WRONGTYPE, ...): one key's
// fault, not the connection's.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// parseInspect reads one key's reply of inspect.lua.
func parseInspect(v any) (InspectReply, error) {
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
	const head, per = 11, 9
	if len(a) < head {
		return InspectReply{}, bad
	}
	q, ok1 := num(a[3])
	fromRedis, ok2 := a[4].(int64)
	n, ok3 := a[5].(int64)
	gen, ok4 := num(a[6])
	inflight, ok5 := a[7].(int64)
	inflightMax, ok6 := a[8].(int64)
	every, ok7 := num(a[9])
	ppm, ok8 := num(a[10])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || !ok8 || n < 0 || len(a) < head+per*int(n)+1 {
		return InspectReply{}, bad
	}
	tenants, ok := readTenants(a[head+per*int(n):])
	if !ok {
		return InspectReply{}, bad
	}
	out.Tenants = tenants
	out.AdaptiveEvery = time.Duration(every) * time.Microsecond
	out.AdaptiveFactor = float64(ppm) / 1e6
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
		cRate, ok4 := num(e[5])
		cBurst, ok5 := num(e[6])
		learnedFor, ok6 := num(e[7])
		unit, _ := e[8].(string)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || err != nil || len(kind) != 1 {
			return InspectReply{}, bad
		}
		t := Tier{Rate: rate, PerMS: perMS, Burst: burst, Unit: unit}
		c := Tier{Rate: cRate, PerMS: perMS, Burst: cBurst, Unit: unit}
		switch kind {
		case "w":
			t.Kind, c.Kind = KindWindow, KindWindow
		case "x":
			t.Kind, c.Kind = KindFixed, KindFixed
		}
		out.Tiers = append(out.Tiers, t)
		out.Configured = append(out.Configured, c)
		out.LearnedFor = append(out.LearnedFor, time.Duration(learnedFor)*time.Microsecond)
		out.Tokens = append(out.Tokens, tokens)
	}
	return out, nil
}

// readTenants reads inspect.lua's tenants: a count, then name, weight,
// share, backlog and admitted each.
func readTenants(a []any) ([]TenantReply, bool) {
	m, ok := a[0].(int64)
	if !ok || m < 0 || len(a) != 1+5*int(m) {
		return nil, false
	}
	var out []TenantReply
	for i := range int(m) {
		e := a[1+5*i : 1+5*(i+1)]
		name, ok := e[0].(string)
		if !ok {
			return nil, false
		}
		var f [4]float64
		for j := range f {
			s, ok := e[1+j].(string)
			v, err := strconv.ParseFloat(s, 64)
			if !ok || err != nil {
				return nil, false
			}
			f[j] = v
		}
		out = append(out, TenantReply{Name: name, Weight: f[0], Share: f[1], Backlog: f[2], Admitted: f[3]})
	}
	return out, true
}

// ObserveArgs is what a provider's response said, for Observe.
type ObserveArgs struct {
	// Policies are published quotas: Quota calls per PerMS.
	Policies []Policy
	// Remaining is the calls left in the provider's window (-1: not said);
	// WindowMS its window (0: not said); Reset the time until it resets (0:
	// not said).
	Remaining int64
	WindowMS  int64
	Reset     time.Duration
	// LearnFor is how long a learned quota stays in force unconfirmed.
	LearnFor time.Duration
	// Defaults are the limits when the key has none in Redis.
	Defaults []Tier
	// MaxSuspension caps a suspension until the reset.
	MaxSuspension time.Duration
	// Stop makes remaining 0 with a reset suspend the key until the reset.
	Stop bool
	// Left are the counts left of other units' buckets (LLM providers'
	// x-ratelimit-remaining-tokens), each lowering that unit's tiers.
	Left []UnitLeft
}

// Policy is one published quota: Quota per PerMS of Unit ("" requests),
// and the burst the provider's bucket holds when it tells it (0: not).
type Policy struct {
	Quota, PerMS int64
	Unit         string
	Burst        int64
}

// UnitLeft is what a provider says is left of a unit in a window.
type UnitLeft struct {
	Unit                string // "" requests
	WindowMS, Remaining int64
}

// Observe runs observe.lua: what a provider's response says lowers the
// limits in force (never above the configured ones), the tokens, or
// suspends the key until the provider's reset.
//
//	KEYS[1] bucket hash  KEYS[2] configuration  KEYS[3] active tenants
//	ARGV policies ("per_ms:quota[:unit:burst] ..."), remaining, window_ms,
//	reset_us, learn_for_us, defaults, max_suspension_us, stop (1:
//	remaining 0 with a reset suspends), other units left
//	("unit:window_ms:remaining ...")
//
// Reply: one line per change: "learned i quota configured per_ms",
// "converted i quota configured per_ms stated stated_per_ms",
// "burst i burst configured per_ms", "ceiling i configured per_ms",
// "tokens i from to", "suspended us", "unmatched per_ms quota unit" (see
// ObserveKey for the tiers it also tells).
func Observe(ctx context.Context, r *Runner, k Keys, a ObserveArgs) ([]string, error) {
	o, err := ObserveKey(ctx, r, k, a)
	return o.Changes, err
}

// Observed is what ObserveKey did and saw.
type Observed struct {
	// Changes are the changes made, as Observe returns them.
	Changes []string
	// Tiers are the key's tiers (none without limits): their periods and
	// quotas, in force after the call and configured.
	Tiers []ObservedTier
	// Generation is the generation of the limits in force after the call
	// (0 without limits in Redis).
	Generation int64
}

// ObservedTier is one tier of a key as ObserveKey saw it.
type ObservedTier struct {
	PerMS, InForce, Configured int64
	Unit                       string // "" requests
	Burst                      int64  // a bucket's burst in force; 0 a window
}

// ObserveKey is Observe, also telling the key's tiers (observe.lua's last
// reply line, "tiers per_ms:in_force:configured ...").
func ObserveKey(ctx context.Context, r *Runner, k Keys, a ObserveArgs) (Observed, error) {
	var pol strings.Builder
	for i, p := range a.Policies {
		if i > 0 {
			pol.WriteByte(' ')
		}
		fmt.Fprintf(&pol, "%d:%d", p.PerMS, p.Quota)
		if p.Unit != "" || p.Burst > 0 {
			fmt.Fprintf(&pol, ":%s:%d", p.Unit, p.Burst)
		}
	}
	var left strings.Builder
	for i, u := range a.Left {
		if i > 0 {
			left.WriteByte(' ')
		}
		unit := u.Unit
		if unit == "" {
			unit = "requests"
		}
		fmt.Fprintf(&left, "%s:%d:%d", unit, u.WindowMS, u.Remaining)
	}
	v, err := r.Run(ctx, observeScript, []string{k.Bucket, k.Config, k.Tenants}, pol.String(), a.Remaining, a.WindowMS,
		a.Reset.Microseconds(), a.LearnFor.Microseconds(), FormatTiers(a.Defaults), a.MaxSuspension.Microseconds(),
		boolArg(a.Stop), left.String())
	if err != nil {
		return Observed{}, err
	}
	list, ok := v.([]any)
	if !ok {
		return Observed{}, errBadReply("observe", v)
	}
	var out Observed
	for _, e := range list {
		s, ok := e.(string)
		if !ok {
			return Observed{}, errBadReply("observe", v)
		}
		if g, isGen := strings.CutPrefix(s, "gen "); isGen {
			n, err := strconv.ParseInt(g, 10, 64)
			if err != nil {
				return Observed{}, errBadReply("observe", v)
			}
			out.Generation = n
			continue
		}
		rest, isTiers := strings.CutPrefix(s, "tiers ")
		if !isTiers {
			out.Changes = append(out.Changes, s)
			continue
		}
		for _, f := range strings.Fields(rest) {
			var t ObservedTier
			parts := strings.Split(f, ":")
			if len(parts) != 5 {
				return Observed{}, errBadReply("observe", v)
			}
			if n, err := fmt.Sscanf(strings.Join(parts[:3], ":"), "%d:%d:%d", &t.PerMS, &t.InForce, &t.Configured); n != 3 || err != nil {
				return Observed{}, errBadReply("observe", v)
			}
			if parts[3] != "requests" {
				t.Unit = parts[3]
			}
			b, err := strconv.ParseInt(parts[4], 10, 64)
			if err != nil || b < 0 {
				return Observed{}, errBadReply("observe", v)
			}
			t.Burst = b
			out.Tiers = append(out.Tiers, t)
		}
	}
	return out, nil
}

func boolArg(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Unindex runs unindex.lua: it drops each of members from the index
// sorted set whose score is below cutoff, and returns how many it dropped.
//
//	KEYS[1] the index; ARGV[1] cutoff, ARGV[2...] members
func Unindex(ctx context.Context, r *Runner, index string, cutoff int64, members []string) (int64, error) {
	args := make([]any, 0, 1+len(members))
	args = append(args, cutoff)
	for _, m := range members {
		args = append(args, m)
	}
	v, err := r.Run(ctx, unindexScript, []string{index}, args...)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, errBadReply("unindex", v)
	}
	return n, nil
}
