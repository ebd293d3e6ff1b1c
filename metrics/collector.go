// Package metrics exports asynq-throttle as Prometheus metrics: the
// middleware's decisions as they happen in this process, and, on every
// scrape, the state of the keys in Redis (tokens, limits, suspensions,
// reservations) as the whole fleet shares it.
//
// New follows the decisions of the Limiter the middleware runs on; the
// caller registers the Collector on a registry of its choice:
//
//	lim := throttle.NewLimiter(rdb)
//	prometheus.MustRegister(metrics.New(lim))
//	mux.Use(lim.Middleware())
//
// Every metric is named asynq_throttle_* (docs/operating.md lists them).
// Label cardinality is bounded: the key label takes at most WithMaxKeys
// distinct values (default 100); events of further keys are counted under
// key="{other}" (tasks without a key under key="{none}"; no key can be
// named either), and asynq_throttle_keys_folded_total counts them. Keys
// with limits of their own in Redis (SetLimits) come first: once a scrape
// has found one, its events get a label of their own even when the cap is
// full, and a key without its own limits (a name a producer made up, a
// short-lived key on default limits) gives its label up to it, its counts
// going to key="{other}". The other labels take fixed
// sets of values (tier 1 to 8, kind bucket, window or fixed, the outcomes,
// reasons, policies and error classes), but for unit and tenant. The unit
// label (what a tier counts: "requests", or the unit Limit.In names, such
// as "tokens") is on the per-tier gauges only, beside tier: a key's tiers
// are at most 8, so it adds no series, and names what each tier's numbers
// are in.
//
// Tenants (throttle.Tenant) are a per-key view read from Redis on each
// scrape: asynq_throttle_tenant_share, _tenant_backlog and
// _tenant_admitted, labeled key and tenant, for the tenants with work
// booked that Inspect reads: at most 100 per key (the next in line), for
// at most WithMaxKeys keys. The default tenant (tasks without a Tenant) is
// tenant="{default}", a name no tenant can have. A tenant with nothing
// booked has no series (its share and backlog are 0): tenants that only
// have a weight set are not exported, so the tenant label stays bounded.
// The decision counters have no tenant label: tenants are customers, as
// many as the application has, and a label per tenant would grow without
// bound in every process; the share each gets is the scheduler's, and the
// scrape reads it.
package metrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Special values of the key label: names no key can have (a key has no
// '{' or '}' but in a family tag followed by more, "{slack}:app").
const (
	otherKey = "{other}" // events past the WithMaxKeys cap
	noKey    = "{none}"  // tasks that have no key (run unthrottled)
)

// defaultTenant is the tenant label of the default tenant (tasks without
// throttle.Tenant; its name is ""). No tenant can be named so (a name has
// no '{' or '}' but in a family tag followed by more), so it never
// collides with one.
const defaultTenant = "{default}"

const namespace = "asynq_throttle"

// Collector is a prometheus.Collector of a Limiter's middleware decisions in
// this process and of the state of its keys in Redis (read on every
// Collect). Its zero value is not usable; build it with New. It is safe for
// concurrent use.
type Collector struct {
	lim *throttle.Limiter
	o   options

	mu         sync.RWMutex
	keys       map[string]*keyStats // by key label, at most o.maxKeys (plus otherKey, noKey)
	folded     uint64               // events counted under otherKey; guarded by mu
	configured map[string]bool      // keys the last scrape found with limits of their own; guarded by mu

	latency prometheus.Histogram
	descs   descs
}

// New returns a Collector of lim: it counts the decisions of lim's
// middleware from now on (Limiter.OnEvent), and reads the state of lim's
// keys in Redis on every scrape (Limiter.Keys, then Limiter.Inspect per
// key).
func New(lim *throttle.Limiter, opts ...Option) *Collector {
	o := options{maxKeys: defaultMaxKeys, scrapeTimeout: defaultScrapeTimeout, buckets: defaultLatencyBuckets}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxKeys < 1 {
		o.maxKeys = 1
	}
	c := &Collector{
		lim:  lim,
		o:    o,
		keys: map[string]*keyStats{},
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "decision_duration_seconds",
			Help:      "Time a middleware decision spent in Redis (decisions without a Redis call are not observed).",
			Buckets:   o.buckets,
		}),
		descs: newDescs(),
	}
	if lim != nil { // (tests feed events by hand)
		lim.OnEvent(c.observe)
	}
	return c
}

// The defaults; each With* doc states the one it changes.
const (
	defaultMaxKeys       = 100
	defaultScrapeTimeout = 3 * time.Second
)

// defaultLatencyBuckets are the buckets of
// asynq_throttle_decision_duration_seconds: 100 µs to 1 s, the default
// decision timeout.
var defaultLatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// Option configures a Collector.
type Option func(*options)

type options struct {
	maxKeys       int
	scrapeTimeout time.Duration
	buckets       []float64
}

// WithMaxKeys caps the distinct values of the key label (default 100; at
// least 1). Events of keys past the cap are counted under key="{other}"
// and in asynq_throttle_keys_folded_total, and the state of only the first
// n keys is read on a scrape, in the order Limiter.Keys lists them (the
// keys with limits of their own in Redis first). A key a scrape found with
// limits of its own takes the label of a key without when the cap is
// full.
func WithMaxKeys(n int) Option { return func(o *options) { o.maxKeys = n } }

// WithScrapeTimeout bounds how long one scrape reads the keys' state from
// Redis (default 3s). Past it the scrape reports
// asynq_throttle_state_up 0 and no state, instead of hanging the scrape.
func WithScrapeTimeout(d time.Duration) Option { return func(o *options) { o.scrapeTimeout = d } }

// WithLatencyBuckets sets the buckets of the decision latency histogram
// asynq_throttle_decision_duration_seconds (default 100µs to 1s: .0001,
// .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1).
func WithLatencyBuckets(b []float64) Option { return func(o *options) { o.buckets = b } }

// Describe sends the descriptors of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs.all() {
		ch <- d
	}
	c.latency.Describe(ch)
}

// Collect sends the counters of the observed events and the state of the
// keys in Redis, read with a deadline of WithScrapeTimeout: the limiter's
// keys from their index (Limiter.Keys), then the state of at most
// WithMaxKeys of them (Limiter.InspectKeys: one script call for up to 100
// keys), a cost in proportion to the limiter's keys, not to the Redis
// database. A key whose state cannot be read is counted in
// asynq_throttle_state_key_errors, and the others are exported. Every
// process that registers a Collector reads them; the state is the fleet's,
// the same from each (aggregate it with max).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectEvents(ch)
	c.latency.Collect(ch)
	if c.lim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.o.scrapeTimeout)
		defer cancel()
		c.collectState(ctx, ch)
	}
}

var _ prometheus.Collector = (*Collector)(nil)

// descs are the descriptors of the metrics built at Collect time.
type descs struct {
	decisions, deferrals, copies, rateLimited, leased, failurePolicy, redisErrors, folded     *prometheus.Desc
	unsettled                                                                                 *prometheus.Desc
	limitRate, limitInForce, limitPeriod, limitBurst, tokens, suspended, reservations, queued *prometheus.Desc
	inFlight, inFlightLimit, generation                                                       *prometheus.Desc
	tenantShare, tenantBacklog, tenantAdmitted                                                *prometheus.Desc
	stateUp, stateKeys, stateErrors, stateDuration                                            *prometheus.Desc
}

func newDescs() descs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	}
	return descs{
		decisions:     d("decisions_total", "Middleware decisions by key and outcome (ran, deferred, suspended, unthrottled, failed, rejected).", "key", "outcome"),
		deferrals:     d("deferrals_total", "Tasks deferred by key, reason (tier, in_flight, suspended, queued, reserved, provider, failure_policy) and whether they hold a reservation.", "key", "reason", "reserved"),
		copies:        d("deferral_copies_total", "Deferrals that re-enqueued a copy of the task (plain asynq.Server, or a task's last attempt).", "key"),
		rateLimited:   d("rate_limited_total", "Handlers that reported a rate limit (429 or RateLimited); each suspends the key fleet-wide.", "key"),
		leased:        d("leased_total", "Tasks that ran on a token leased by their process, without a Redis call.", "key"),
		failurePolicy: d("failure_policy_total", "Decisions Redis could not make, by the failure policy that decided instead (fail_open ran the task, fail_closed deferred it).", "key", "policy"),
		redisErrors:   d("redis_errors_total", "Failed decisions by error class (timeout, connection, reply, bad_config, other).", "key", "class"),
		folded:        d("keys_folded_total", "Events counted under key=\"{other}\" because WithMaxKeys distinct keys were already exported."),
		unsettled:     d("settlements_failed_total", "Settlements (throttle.Used) Redis could not record: the task's result stands, and the key counts its estimate instead of what it used.", "key"),

		limitRate:     d("limit_rate", "What a tier of the key's limits allows per period, in its unit (from Redis, on scrape); kind is bucket, window or fixed, unit requests or the tier's own (tokens, ...).", "key", "tier", "kind", "unit"),
		limitInForce:  d("limit_rate_in_force", "What a tier allows per period now, in its unit: below limit_rate while a quota learned from the provider (Observe) or adaptive mode's cut is in force.", "key", "tier", "kind", "unit"),
		limitPeriod:   d("limit_period_seconds", "The period of a tier of the key's limits (a window's length).", "key", "tier", "kind", "unit"),
		limitBurst:    d("limit_burst", "The most a tier holds at once, in its unit: a bucket's burst, a window's calls (or units) per window.", "key", "tier", "kind", "unit"),
		tokens:        d("tokens", "Room in a tier now, in its unit: a bucket's tokens, a window's calls (or units) it would still admit.", "key", "tier", "kind", "unit"),
		suspended:     d("suspended_seconds", "Seconds left of the key's fleet-wide suspension (0 when not suspended).", "key"),
		reservations:  d("reservations", "Deferred tasks of the key holding a reservation: a reserved run time.", "key"),
		queued:        d("queued_seconds", "Seconds until the key's last reserved run time: how long its backlog takes to drain.", "key"),
		inFlight:      d("in_flight", "Slots of the key's in-flight limit held now, across the fleet (keys with an in-flight limit only).", "key"),
		inFlightLimit: d("in_flight_limit", "The key's in-flight limit: the most of its tasks running at once across the fleet.", "key"),
		generation:    d("limits_generation", "Generation of the key's limits, bumped by every change (SetLimits); changes() shows when they changed.", "key"),

		tenantShare:    d("tenant_share", "Part of the key's rate a tenant with work booked gets now, 0 to 1: its weight over those of the tenants with work booked (at most 100 per key; tenant=\"{default}\" for tasks without one).", "key", "tenant"),
		tenantBacklog:  d("tenant_backlog", "Work a tenant has booked on the key and not yet due, in cost units.", "key", "tenant"),
		tenantAdmitted: d("tenant_admitted", "Work admitted for a tenant since it last had work booked, in cost units (back to 0 once its backlog has emptied).", "key", "tenant"),

		stateUp:       d("state_up", "1 when the last scrape read the keys' state from Redis, 0 when it failed."),
		stateKeys:     d("state_keys", "Keys found in Redis on this scrape (the state of at most WithMaxKeys of them is exported)."),
		stateErrors:   d("state_key_errors", "Keys found in Redis whose state could not be read on this scrape (e.g. invalid limits)."),
		stateDuration: d("state_scrape_duration_seconds", "Time this scrape spent reading the keys' state from Redis."),
	}
}

func (d descs) all() []*prometheus.Desc {
	return []*prometheus.Desc{
		d.decisions, d.deferrals, d.copies, d.rateLimited, d.leased, d.failurePolicy, d.redisErrors, d.folded, d.unsettled,
		d.limitRate, d.limitInForce, d.limitPeriod, d.limitBurst, d.tokens, d.suspended, d.reservations, d.queued,
		d.inFlight, d.inFlightLimit, d.generation,
		d.tenantShare, d.tenantBacklog, d.tenantAdmitted,
		d.stateUp, d.stateKeys, d.stateErrors, d.stateDuration,
	}
}

func tierLabel(i int) string { return fmt.Sprint(i + 1) }
