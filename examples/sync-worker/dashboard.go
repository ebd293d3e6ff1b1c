package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/metrics"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// serveDashboard serves the web view (read-only) and Prometheus metrics on
// addr for the run, as `asynq-throttle serve` would beside a real fleet. It
// returns the function that stops it and the observer that feeds the
// metrics with the in-process fleet's decisions.
func serveDashboard(addr string, lim *throttle.Limiter, out io.Writer) (stop func(), observe func(throttle.Event), err error) {
	collector := metrics.New(lim)
	reg := prometheus.NewRegistry()
	if err := reg.Register(collector); err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", dashboard.New(lim, dashboard.WithMetrics(collector), dashboard.WithTitle("sync-worker")))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("-dashboard %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(out, "dashboard: http://%s/ (metrics on /metrics)\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, collector.Observe, nil
}
