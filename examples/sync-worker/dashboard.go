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

// dashboardJobs is the -jobs the dashboard's line suggests for a run long
// enough to look at it.
const dashboardJobs = 240

// serveDashboard serves the web view (read-only) and Prometheus metrics of
// lim on addr for the run, as a worker process would beside its middleware:
// the state of every key in Redis, and the decisions of lim's middleware. It
// returns the function that stops it.
func serveDashboard(addr string, lim *throttle.Limiter, out io.Writer) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(metrics.New(lim)); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", dashboard.New(lim, dashboard.WithTitle("sync-worker")))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-dashboard %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(out, "dashboard: http://%s/ (metrics on /metrics), up while the run lasts;\n"+
		"  -jobs %d keeps it up about %d minutes\n", ln.Addr(), dashboardJobs, int(expectedDuration(DefaultProviders(), dashboardJobs).Round(time.Minute)/time.Minute))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
