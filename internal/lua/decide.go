package lua

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// DecideArgs are the inputs of one decision.
type DecideArgs struct {
	// TaskID names the caller for a reservation; "" never reserves.
	TaskID string
	// Granule is how precisely a denied caller can come back (asynq: 1 s).
	// Reserved instants are spaced so that one granule of returning callers
	// fits in every tier's burst. Zero means callers return on time.
	Granule time.Duration
	// Horizon is how far ahead an instant may be reserved; zero never
	// reserves.
	Horizon time.Duration
	// Lapse is how long a reservation is kept after its instant.
	Lapse time.Duration
	// Defaults apply when the key has no limits in Redis.
	Defaults []Tier
	// Lease is how many tokens an admitted caller without a reservation may
	// take at once for its process (the extra ones come back as
	// DecideReply.Lease), granted only while every tier keeps at least
	// Lease tokens; 0 or 1 means one token per decision.
	Lease int
	// Headroom is the dispatch jitter to keep room for: a call is admitted
	// only when every tier would still admit it that much later.
	Headroom time.Duration
	// Book makes every caller with an ID reserve an instant, even one that
	// could run now (enqueue-time throttling); the caller is told it.
	Book bool
	// Pace admits a holder back within one granule before its reserved
	// instant at the instant itself, and tells it how long to wait for it
	// (DecideReply.Wait): reserved instants are then exact, not whole
	// granules.
	Pace bool
	// Probe marks a caller asking again for a slot of the in-flight limit
	// it waits for in its worker: it keeps its place among the waiters,
	// taking no new one.
	Probe bool
	// Near marks a caller that waits in its worker for an instant ahead
	// and asks again (the middleware, with the time to): with Pace, a
	// holder is admitted at most NearAhead before the instant its call is
	// counted at, on a key with units and without windows; further ahead
	// it is refused "near" with the wait, and asks again then. (Other
	// keys, tenants' keys and decisions over several keys admit ahead as
	// Pace says.)
	Near bool
	// Cost is what the caller takes from every request tier (0 means 1).
	Cost int
	// Units is what it takes of other units, "tokens=1200,input-tokens=300"
	// ("" none): each unit from that unit's tiers (lib.lua, cost_vec).
	Units string
	// SlotExpiry is how long a slot of the in-flight limit is held without
	// renewal (Extend) before it is taken back.
	SlotExpiry time.Duration
	// Fair decides in the order of fair shares among tenants (fair.lua):
	// each caller says its tenant (Tenant, "" the default tenant), and the
	// call passes Keys.Tenants.
	Fair bool
	// Tenant is the caller's tenant, with Fair.
	Tenant string
}

// PaceEarly is how long before its granule a paced holder may come back
// and be admitted at its instant (decide.lua's PACE_EARLY): with the
// granule, the longest a paced admission makes its caller wait
// (DecideReply.Wait).
const PaceEarly = 200 * time.Millisecond

// NearAhead is how far ahead of its instant a paced holder that asks with
// Near is admitted at most (decide.lua's o.near).
const NearAhead = 100 * time.Millisecond

// DecideReply is the outcome of one decision.
type DecideReply struct {
	Status     int           // StatusAllowed, StatusDenied, StatusBadConfig, StatusNoLimits, StatusCostTooHigh or StatusFair
	RetryAfter time.Duration // when denied: wait at least this long
	Wait       time.Duration // when allowed at an instant ahead (Pace): start after this long
	Remaining  int64         // when allowed: tokens (or calls) left in the tightest tier, or free slots without one
	RefusedBy  string        // when denied: "tier:N" (1-based), "suspended", "queue", "reserved", "near", "inflight" or "booked"
	Reserved   time.Time     // when denied with a reservation: the reserved instant (Redis clock)
	At         time.Time     // when allowed: the instant it was admitted at (Redis clock)
	Lease      int64         // when allowed: extra tokens taken for the caller's process
	Generation int64         // the limits' generation (bumped by every SetLimits)
	Slot       string        // when allowed on a key with an in-flight limit: the slot held, for Release
	Field      string        // when StatusBadConfig: the offending config field; StatusCostTooHigh: the tier's position (1-based)
	Reason     string        // when StatusBadConfig: what is wrong with it; StatusCostTooHigh: the tier's largest cost
	TooHigh    Tier          // when StatusCostTooHigh: the tier, as configured
}

// Decide runs decide.lua for one caller.
//
//	KEYS[1] bucket hash  KEYS[2] reservations  KEYS[3] slots in flight
//	KEYS[4] configuration
//	KEYS[5] active tenants, KEYS[6] start tags (with flag 8, fair)
//	ARGV[1] the options, one string (a Limiter sends the same few again
//	        and again, and the script parses each once):
//	        "granule horizon lapse lease headroom flags slot_expiry|defaults"
//	        granule, horizon (0 = never reserve), lapse, headroom and
//	        slot_expiry in microseconds; lease: tokens an admitted caller may
//	        take for its process (0 = 1); flags: 1 book, 2 pace, 4 probe,
//	        8 fair (callers say their tenant), 16 near (a paced holder is
//	        admitted at most NearAhead ahead);
//	        defaults: the default limits as FormatTiers writes them ("" none)
//	then a pair per caller decided in this run, in order: task ID ("" = no
//	reservation), cost (fair: a triple, with the tenant). No pair at all is
//	one caller: "", 1; a cost alone (not fair) is one caller without a
//	task ID: "", cost. A cost is the requests, then what the caller uses of
//	other units: "1,tokens=1200,input-tokens=300".
//
// Reply: the n decisions joined by ';', each one string (reading it costs no
// allocation):
//
//	"1|wait_us|remaining||at_us|extra|gen"   allowed at at_us, wait_us from now
//	                                         (0 but for a paced holder); extra:
//	                                         tokens leased to the caller's process
//	"1|...|gen|slot"                         the same on a key with an in-flight
//	                                         limit: the slot held, for Release
//	"0|retry_us|0|by|at_us|0|gen"            denied by by (RefusedBy); at_us: the
//	                                         caller's reserved instant, 0 none
//	"-1|field|reason"                        bad limits
//	"-2"                                     no limits
//	"-3|i|max|kind|n|per_ms|burst|unit"      a cost above what tier i (1-based) can
//	                                         ever hold; kind b, w or x (a fixed window)
//	"-4"                                     tenants share the key: ask again, fair
//
// A caller refused only for a slot gets by "inflight" and the time one is
// expected to free, in the order callers were refused.
func Decide(ctx context.Context, r *Runner, k Keys, a DecideArgs) (DecideReply, error) {
	args := AppendDecideArgs(nil, r.Mode(), k, a)
	var cost any = max(a.Cost, 1)
	if a.Units != "" {
		cost = strconv.Itoa(max(a.Cost, 1)) + "," + a.Units
	}
	if a.Fair {
		args = append(args, a.TaskID, cost, a.Tenant)
	} else {
		args = AppendCallers(args, a.TaskID, cost)
	}
	s, err := r.Do(ctx, decideScript, args)
	if err != nil {
		return DecideReply{}, err
	}
	return ParseDecide(s)
}

// DecideScript is the decide script, for callers that send its commands
// themselves (pipelines) and recover with Runner.Recover.
var DecideScript = decideScript

// AppendDecideArgs appends a call of decide.lua in mode m to dst without its
// callers: the verb and function (or sha), the number of keys, the keys
// (four; six with a.Fair) and ARGV[1], the options. AppendCallers adds
// the callers (with a.Fair, the caller appends a task ID, a cost and a
// tenant per caller). a.TaskID, a.Cost and a.Tenant are ignored.
func AppendDecideArgs(dst []any, m Mode, k Keys, a DecideArgs) []any {
	verb, id := decideScript.Head(m)
	if a.Fair {
		return append(dst, verb, id, 6, k.Bucket, k.Reservations, k.Slots, k.Config, k.Tenants, k.Tags, FormatOptions(a))
	}
	return append(dst, verb, id, 4, k.Bucket, k.Reservations, k.Slots, k.Config, FormatOptions(a))
}

// AppendCallers appends the callers of a run to a command AppendDecideArgs
// built: each one's task ID and cost, in the order args holds them. A lone
// caller without a task ID and of cost 1 (a Take) is the script's default,
// and is sent as nothing; one of another cost (Take with Cost or Uses) is
// sent as its cost alone: fewer arguments, a cheaper call (the empty task
// ID cost a two-unit Take 1.4k instructions, bench/callgrind_units.sh).
func AppendCallers(dst []any, args ...any) []any {
	if len(args) == 2 && args[0] == "" {
		if args[1] == 1 {
			return dst
		}
		return append(dst, args[1])
	}
	return append(dst, args...)
}

// FormatOptions writes the options of a decision as decide.lua reads them
// (ARGV[1]).
func FormatOptions(a DecideArgs) string {
	flags := 0
	if a.Book {
		flags |= 1
	}
	if a.Pace {
		flags |= 2
	}
	if a.Probe {
		flags |= 4
	}
	if a.Fair {
		flags |= 8
	}
	if a.Near {
		flags |= 16
	}
	b := make([]byte, 0, 64)
	for i, v := range []int64{a.Granule.Microseconds(), a.Horizon.Microseconds(), a.Lapse.Microseconds(),
		int64(a.Lease), a.Headroom.Microseconds(), int64(flags), a.SlotExpiry.Microseconds()} {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, max(v, 0), 10)
	}
	b = append(b, '|')
	return string(b) + FormatTiers(a.Defaults)
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
	var f [8]string
	n := 0
	for n < 7 {
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
	case n == 1 && f[0] == "-4":
		return DecideReply{Status: StatusFair}, nil
	case n == 3 && f[0] == "-1":
		return DecideReply{Status: StatusBadConfig, Field: f[1], Reason: f[2]}, nil
	case n == 8 && f[0] == "-3":
		rate, ok1 := parseNum(f[4])
		per, ok2 := parseNum(f[5])
		burst, ok3 := parseNum(f[6])
		kind := map[string]byte{"b": KindBucket, "w": KindWindow, "x": KindFixed}[f[3]]
		if !ok1 || !ok2 || !ok3 || (kind == KindBucket && f[3] != "b") {
			return DecideReply{}, errBadReply("decide", reply)
		}
		return DecideReply{Status: StatusCostTooHigh, Field: f[1], Reason: f[2],
			TooHigh: Tier{Kind: kind, Rate: rate, PerMS: per, Burst: burst, Unit: f[7]}}, nil
	case n != 7 && !(n == 8 && f[0] == "1"), f[0] != "0" && f[0] != "1":
		return DecideReply{}, errBadReply("decide", reply)
	}
	retry, ok1 := parseNum(f[1])
	remaining, ok2 := parseNum(f[2])
	at, ok3 := parseNum(f[4])
	extra, ok4 := parseNum(f[5])
	gen, ok5 := parseNum(f[6])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || retry < 0 || remaining < 0 || extra < 0 {
		return DecideReply{}, errBadReply("decide", reply)
	}
	r := DecideReply{
		Status:     int(f[0][0] - '0'),
		Remaining:  remaining,
		RefusedBy:  f[3],
		Lease:      extra,
		Generation: gen,
	}
	if n == 8 {
		if f[7] == "" || strings.IndexByte(f[7], '|') >= 0 {
			return DecideReply{}, errBadReply("decide", reply)
		}
		r.Slot = f[7]
	}
	if r.Status == StatusAllowed {
		r.Wait = time.Duration(retry) * time.Microsecond
	} else {
		r.RetryAfter = time.Duration(retry) * time.Microsecond
	}
	switch {
	case at > 0 && r.Status == StatusAllowed:
		r.At = time.UnixMicro(at)
	case at > 0:
		r.Reserved = time.UnixMicro(at)
	}
	return r, nil
}

// MaxKeys is how many limiter keys one task may name (multi.lua's
// MULTI_MAX).
const MaxKeys = 4

// MultiReply is the outcome of one decision across several keys.
type MultiReply struct {
	// DecideReply is the decision as a whole: allowed when every key
	// admitted the caller; otherwise the reply of the key that decided
	// (Key), whose RetryAfter and Reserved every key shares. Remaining is
	// the least of the keys'; Slot is the first key's (each key's slot is
	// in Keys).
	DecideReply
	// Key is the position (0-based) of the key that decided a refusal or
	// an error; when every key admitted the caller, -1, or for a holder
	// admitted at an instant ahead (Wait), the key whose turn it waits for.
	Key int
	// Keys is each key's reply, in the order of the keys (nil when one
	// reply stands for all: an error, a cost too high, a booking of an ID
	// in use). A key that admitted the caller while another refused has
	// Status StatusDenied and RefusedBy ""; a key without limits has
	// StatusNoLimits (it limits nothing).
	Keys []DecideReply
}

// DecideMulti runs multi.lua: one decision for one caller across ks (2 to
// MaxKeys keys; each of its own slot on a Redis Cluster, so a single Redis
// or Sentinel only for now), all or nothing. a.Lease is not used: a
// caller of several keys takes no lease. a.Fair is set from a.Tenant: on
// each key where the caller names a tenant, or where the key's tenants are
// active (the default tenant then), it waits for its tenant's turn and is
// counted in the key's fair state (fair.lua).
//
//	KEYS   six per key, in the order of ks: bucket hash, reservations,
//	       slots in flight, configuration, active tenants, start tags
//	ARGV[1] the options, as Decide's (FormatOptions)
//	ARGV[2] task ID ("" = no reservation)
//	ARGV[3] cost, as Decide's ("1,tokens=1200")
//	ARGV[4] tenant ("" the default tenant)
//
// Reply: "k;reply" where reply stands for every key (an error, "-3|..." a
// cost too high for key k, "0|...|booked|..."), or "k;r1;...;rn": each
// key's decision in Decide's format, k the position (1-based) of the key
// that decided a refusal, 0 when every key admitted the caller (or, when
// every key admitted it at an instant ahead, the key whose turn it waits
// for). Every
// key's refusal carries the same retry and reserved instant; by is ""
// for a key that admitted. A key without limits replies "-2".
func DecideMulti(ctx context.Context, r *Runner, ks []Keys, a DecideArgs) (MultiReply, error) {
	if len(ks) < 1 || len(ks) > MaxKeys {
		return MultiReply{}, errBadReply("decide_multi", len(ks))
	}
	a.Lease, a.Fair = 0, a.Tenant != ""
	verb, id := decideMultiScript.Head(r.Mode())
	args := make([]any, 0, 3+6*len(ks)+4)
	args = append(args, verb, id, 6*len(ks))
	for _, k := range ks {
		args = append(args, k.Bucket, k.Reservations, k.Slots, k.Config, k.Tenants, k.Tags)
	}
	cost := strconv.Itoa(max(a.Cost, 1))
	if a.Units != "" {
		cost += "," + a.Units
	}
	args = append(args, FormatOptions(a), a.TaskID, cost)
	if a.Tenant != "" {
		args = append(args, a.Tenant)
	}
	s, err := r.Do(ctx, decideMultiScript, args)
	if err != nil {
		return MultiReply{}, err
	}
	return ParseMulti(s, len(ks))
}

// ParseMulti reads a decide_multi reply for n keys.
func ParseMulti(s string, n int) (MultiReply, error) {
	head, rest := NextReply(s)
	k, err := strconv.Atoi(head)
	if err != nil || k < 0 || k > n || rest == "" {
		return MultiReply{}, errBadReply("decide_multi", s)
	}
	m := MultiReply{Key: k - 1}
	if strings.Count(rest, ";") == 0 && n > 1 {
		// One reply for every key.
		d, err := ParseDecide(rest)
		if err != nil || k == 0 {
			return MultiReply{}, errBadReply("decide_multi", s)
		}
		m.DecideReply = d
		return m, nil
	}
	m.Keys = make([]DecideReply, 0, n)
	limited := false
	for rest != "" {
		var one string
		one, rest = NextReply(rest)
		d, err := ParseDecide(one)
		if err != nil {
			return MultiReply{}, errBadReply("decide_multi", s)
		}
		m.Keys = append(m.Keys, d)
	}
	if len(m.Keys) != n {
		return MultiReply{}, errBadReply("decide_multi", s)
	}
	m.Remaining = -1
	// (admitted ahead: k names the key whose turn the caller waits for)
	admitted := k == 0 || m.Keys[k-1].Status == StatusAllowed && m.Keys[k-1].Wait > 0
	for i, d := range m.Keys {
		switch d.Status {
		case StatusNoLimits:
			continue
		case StatusAllowed, StatusDenied:
		default:
			return MultiReply{}, errBadReply("decide_multi", s)
		}
		if admitted && d.Status != StatusAllowed || !admitted && i == k-1 && d.Status != StatusDenied {
			return MultiReply{}, errBadReply("decide_multi", s)
		}
		if !limited {
			limited = true
			m.DecideReply = d
			m.Remaining = d.Remaining
		}
		if i == k-1 {
			rem := m.Remaining
			m.DecideReply = d
			m.Remaining = rem
		}
		m.Remaining = min(m.Remaining, d.Remaining)
	}
	if !limited {
		m.DecideReply = DecideReply{Status: StatusNoLimits}
	}
	return m, nil
}
