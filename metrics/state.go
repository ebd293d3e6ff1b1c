package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// collectState reads every key's state from Redis (at most maxKeys keys, in
// the order Keys lists them: those with limits of their own first) and
// sends it as gauges.
func (c *Collector) collectState(ctx context.Context, ch chan<- prometheus.Metric) {
	start := time.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	defer func() { gauge(c.descs.stateDuration, time.Since(start).Seconds()) }()
	keys, err := c.lim.Keys(ctx)
	if err != nil {
		gauge(c.descs.stateUp, 0)
		return
	}
	gauge(c.descs.stateKeys, float64(len(keys)))
	if len(keys) > c.o.maxKeys {
		keys = keys[:c.o.maxKeys]
	}
	states, err := c.lim.InspectKeys(ctx, keys)
	if err != nil {
		gauge(c.descs.stateUp, 0)
		return
	}
	failed := 0
	configured := make(map[string]bool, len(states))
	for _, ks := range states {
		key, st := ks.Key, ks.Status
		if ks.Err != nil {
			failed++
			continue
		}
		if st.Generation > 0 {
			configured[key] = true
		}
		for i, l := range st.Limits {
			if l.Kind == throttle.KindInFlight {
				gauge(c.descs.inFlight, float64(st.InFlight), key)
				gauge(c.descs.inFlightLimit, float64(l.N), key)
				continue
			}
			if l.Kind == throttle.KindAdaptive {
				continue // not a tier: it cuts the others (limit_rate_in_force)
			}
			tier, kind, unit := tierLabel(i), limitspec.KindName(l.Kind), limitspec.Unit(l)
			gauge(c.descs.limitRate, float64(l.N), key, tier, kind, unit)
			inForce := l
			if i < len(st.InForce) {
				inForce = st.InForce[i]
			}
			gauge(c.descs.limitInForce, float64(inForce.N), key, tier, kind, unit)
			gauge(c.descs.limitPeriod, l.Per.Seconds(), key, tier, kind, unit)
			gauge(c.descs.limitBurst, float64(limitspec.Burst(l)), key, tier, kind, unit)
			if i < len(st.Tokens) {
				gauge(c.descs.tokens, st.Tokens[i], key, tier, kind, unit)
			}
		}
		if st.Limits != nil {
			gauge(c.descs.generation, float64(st.Generation), key)
		}
		gauge(c.descs.suspended, st.SuspendedFor.Seconds(), key)
		gauge(c.descs.reservations, float64(st.Reservations), key)
		gauge(c.descs.queued, st.QueuedFor.Seconds(), key)
		for _, t := range st.Tenants {
			if t.Share <= 0 {
				continue // nothing booked: no series (the weighted idle ones are not bounded)
			}
			tenant := t.Name
			if tenant == "" {
				tenant = defaultTenant
			}
			gauge(c.descs.tenantShare, t.Share, key, tenant)
			gauge(c.descs.tenantBacklog, t.Backlog, key, tenant)
			gauge(c.descs.tenantAdmitted, float64(t.Admitted), key, tenant)
		}
	}
	gauge(c.descs.stateErrors, float64(failed))
	gauge(c.descs.stateUp, 1)
	c.setConfigured(configured)
}
