package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/metrics"
)

func (a *app) serveCmd() *cobra.Command {
	var (
		addr     string
		readOnly bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the web view on / and Prometheus metrics on /metrics",
		Long: `Serve the dashboard (every key live, with suspend, resume and limit changes
when --read-only=false) on / and the keys' state in Redis as Prometheus
metrics on /metrics. This process makes no decisions, so its metrics and
page show the state in Redis; decisions and 429s are counted by the
collector in each worker (package metrics).`,
		Example: `  asynq-throttle serve --addr :8080
  asynq-throttle serve --addr 127.0.0.1:8080 --read-only=false`,
		Args: args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(metrics.New(lim))
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			mux.Handle("/", dashboard.New(lim, dashboard.WithReadOnly(readOnly)))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %s: %w", addr, err)
			}
			mode := "read-only"
			if !readOnly {
				mode = "actions on"
			}
			fmt.Fprintf(a.stdout, "serving the dashboard on http://%s/ (%s) and Prometheus metrics on http://%s/metrics\n", ln.Addr(), mode, ln.Addr())
			return serveUntil(cmd.Context(), ln, mux)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", ":8080", "address to listen on")
	cmd.Flags().BoolVar(&readOnly, "read-only", true, "refuse the dashboard's actions (suspend, resume, set limits); --read-only=false allows them")
	return cmd
}

// serveUntil serves h on ln until ctx ends, then shuts down gracefully.
func serveUntil(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
