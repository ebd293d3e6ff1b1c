package throttle

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
)

// HeaderKey is the task header that carries a task's limiter key (Key sets
// it through NewTask), for producers that build tasks without this package:
// asynq.NewTaskWithHeaders("slack:sync", p, map[string]string{HeaderKey:
// "slack"}). A producer in another language sets the same header,
// "throttle-key", on the task message. The other headers the middleware
// reads and writes are listed in docs/how-it-works.md.
const HeaderKey = "throttle-key"

// keyOption is the asynq.Option returned by Key: the task's key names,
// the most specific first.
type keyOption []string

// costOption is the asynq.Option returned by Cost.
type costOption int

// tenantOption is the asynq.Option returned by Tenant.
type tenantOption string

// optionTypeKey and optionTypeCost are outside asynq's own option types,
// which asynq's client switches on: it ignores them, which is why Key and
// Cost must go through NewTask.
const (
	optionTypeKey    asynq.OptionType = 1 << 20
	optionTypeCost   asynq.OptionType = 1<<20 + 1
	optionTypeTenant asynq.OptionType = 1<<20 + 2
)

// String, Type and Value make Key an asynq.Option. Value is the first
// name (the task's key, as before Key took several).
func (k keyOption) String() string {
	q := make([]string, len(k))
	for i, n := range k {
		q[i] = strconv.Quote(n)
	}
	return "throttle.Key(" + strings.Join(q, ", ") + ")"
}
func (k keyOption) Type() asynq.OptionType { return optionTypeKey }
func (k keyOption) Value() interface{} {
	if len(k) == 0 {
		return ""
	}
	return k[0]
}

// String, Type and Value make Cost an asynq.Option.
func (c costOption) String() string         { return fmt.Sprintf("throttle.Cost(%d)", int(c)) }
func (c costOption) Type() asynq.OptionType { return optionTypeCost }
func (c costOption) Value() interface{}     { return int(c) }

// String, Type and Value make Tenant an asynq.Option.
func (t tenantOption) String() string         { return fmt.Sprintf("throttle.Tenant(%q)", string(t)) }
func (t tenantOption) Type() asynq.OptionType { return optionTypeTenant }
func (t tenantOption) Value() interface{}     { return string(t) }

// Tenant names the tenant a task runs for (a customer, a workspace), e.g.
// NewTask("crm:sync", p, Key("crm"), Tenant("acme")). While several
// tenants have tasks waiting on a key, each gets the key's rate in
// proportion to its weight (Limiter.SetWeights; 1 when not set); a tenant
// alone gets all of it, and an idle tenant's share goes to the others at
// once. A refused task is deferred to its tenant's turn, not behind every
// task booked before it. Tasks without a Tenant share the default tenant.
// Costs count: a tenant's share is in cost units (with tiers in several
// units, of each task's dominant unit). The name follows the
// rules of keys (ValidateKey). Like Key, it must go through NewTask.
func Tenant(id string) asynq.Option { return tenantOption(id) }

// Cost makes a task take n tokens of every tier of its key instead of one
// (a GraphQL query's points, a bulk call counted as n), e.g.
// NewTask("github:graphql", p, Key("github"), Cost(5)). Its reservation is
// spaced for n, and a lease hands it n tokens at once. Settle the actual
// cost in the handler with Used(ctx, "requests", n) when it is known. It is
// Uses("requests", n); tiers of other units (Limit.In) take what Uses says. Like Key, it must go
// through NewTask. A cost above a configured tier's burst (or a window's
// quota) can never run: the middleware fails the task with ErrCostTooHigh
// and asynq.SkipRetry (outcome Rejected), so asynq archives it at once (run
// it again from the archive once the limits or the cost change). A cost above a tier lowered
// only by what Observe or Adaptive learned waits until the tier is back up.
func Cost(n int) asynq.Option { return costOption(n) }

// Key names the limiter key a task is throttled under, e.g. Key("slack").
//
// A task may name up to 4 keys, the most specific first, for a provider's
// stacked limits: Key("slack:T0123:chat.postMessage", "slack:T0123",
// "slack") runs the task only when every key admits it, in one atomic
// decision that takes its cost from every tier of every key or from none
// (tiers, windows, InFlight slots, Uses). A suspension of any key defers
// it until the latest one ends; refused, it reserves one run time that
// every key admits, held in each. RateLimited suspends the first key, the
// most specific, unless the handler names another (RateLimitedError.Key);
// Observe learns into the key whose tier matches the response's quota (the
// first when none does); a leased token is never used for a task of
// several keys. On Redis Cluster the keys of a task must be of one family
// ("{slack}:T0123", "{slack}:app": one hash slot, see ValidateKey); NewTask
// accepts others, and every decision of such a task fails with an error
// that says so (the middleware's failure policy then applies). Tenants' fair
// order is not kept on the keys of such a task yet: each key's tiers
// decide it. See docs/limits.md.
//
// Pass it to NewTask, which stores it in the task's headers (the first
// name in HeaderKey, the others in "throttle-key-2" to "throttle-key-4").
// asynq drops options it does not know: a Key passed straight to
// asynq.Client.Enqueue or asynq.NewTask vanishes without an error and the
// task is throttled by its type prefix instead (see WithKeyFunc).
func Key(names ...string) asynq.Option { return keyOption(names) }

// NewTask returns an asynq task whose headers carry the Key, Cost, Uses and
// Tenant among opts; all other options are kept on the task as
// asynq.NewTask would. It refuses what no worker could throttle, naming the
// option: a Key or Tenant that ValidateKey refuses (ErrInvalidKey), a Cost
// below 1 or above 1000000000 (the largest burst a Limit can have), a bad
// unit or count in Uses, and a second Key, Cost, Tenant or Uses of one
// unit.
func NewTask(typename string, payload []byte, opts ...asynq.Option) (*asynq.Task, error) {
	headers, rest, err := taskHeaders(opts)
	if err != nil {
		return nil, fmt.Errorf("throttle: NewTask(%q): %w", typename, err)
	}
	return asynq.NewTaskWithHeaders(typename, payload, headers, rest...), nil
}

// taskHeaders reads the Key, Cost, Uses and Tenant among opts into the
// headers the middleware reads (NewTask, Take), refusing what no worker
// could throttle; rest are the other options.
func taskHeaders(opts []asynq.Option) (headers map[string]string, rest []asynq.Option, err error) {
	headers = map[string]string{}
	for _, o := range opts {
		switch o := o.(type) {
		case keyOption:
			if _, dup := headers[HeaderKey]; dup {
				return nil, nil, fmt.Errorf("%v: a second Key (the first was %q)", o, headers[HeaderKey])
			}
			if len(o) == 1 {
				if err := ValidateKey(o[0]); err != nil {
					return nil, nil, fmt.Errorf("Key: %w", err)
				}
			}
			if err := keyspace.SetKeys(headers, o); err != nil {
				return nil, nil, fmt.Errorf("throttle.Key: %w", err)
			}
		case costOption:
			if _, dup := headers[keyspace.Cost]; dup {
				return nil, nil, fmt.Errorf("%v: a second Cost", o)
			}
			if o < 1 || o > maxBurst {
				return nil, nil, fmt.Errorf("%v: the cost must be from 1 to %d", o, maxBurst)
			}
			headers[keyspace.Cost] = strconv.Itoa(int(o))
		case usesOption:
			u, err := addUses(headers[keyspace.Uses], o)
			if err != nil {
				return nil, nil, err
			}
			headers[keyspace.Uses] = u
		case tenantOption:
			if _, dup := headers[keyspace.Tenant]; dup {
				return nil, nil, fmt.Errorf("%v: a second Tenant (the first was %q)", o, headers[keyspace.Tenant])
			}
			if err := ValidateKey(string(o)); err != nil {
				return nil, nil, fmt.Errorf("Tenant: %w", err)
			}
			headers[keyspace.Tenant] = string(o)
		default:
			rest = append(rest, o)
		}
	}
	return headers, rest, nil
}

// costOf returns the cost in t's headers: its requests (1 when absent) and
// the other units it uses; a cost that is not a whole number from 1 up, or
// a malformed uses header, is an error, the enqueuer's bug.
func costOf(t *asynq.Task) (taskCost, error) {
	units, err := usesOf(t)
	if err != nil {
		return taskCost{}, err
	}
	s, ok := t.Headers()[keyspace.Cost]
	if !ok {
		return taskCost{n: 1, units: units}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxBurst {
		return taskCost{}, fmt.Errorf("throttle: task type %q: header %s = %q: want a whole number from 1 to %d (Cost)", t.Type(), keyspace.Cost, s, maxBurst)
	}
	return taskCost{n: n, units: units}, nil
}

// tenantOf returns the tenant in t's headers ("" when absent: the default
// tenant); an invalid name is an error, the enqueuer's bug.
func tenantOf(t *asynq.Task) (string, error) {
	s, ok := t.Headers()[keyspace.Tenant]
	if !ok {
		return "", nil
	}
	if err := ValidateKey(s); err != nil {
		return "", fmt.Errorf("throttle: task type %q: header %s: %w (Tenant)", t.Type(), keyspace.Tenant, err)
	}
	return s, nil
}

// keyOf picks the key of a task: its header, else the key function, else the
// type prefix before ':'. An invalid key from the header or the key
// function is an error (the enqueuer's or the user's bug), returned with
// the key. A type prefix that is not a valid key means "unthrottled", as a
// type without a prefix does (the default applies to every task type, and
// not every type was meant to name a key), with a warning once per type.
func (o *options) keyOf(t *asynq.Task) (string, error) {
	k, invalidPrefix, err := keyspace.KeyOfTask(t, o.keyFunc)
	if invalidPrefix && o.warned.first("type prefix", t.Type()) {
		o.logger.Warn("throttle: task type's prefix is not a valid key; its tasks run unthrottled (give them a Key through NewTask, or use WithKeyFunc)",
			"task_type", t.Type())
	}
	return k, err
}
