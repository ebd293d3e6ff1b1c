package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/internal/hostcheck"
	"github.com/asynq-throttle/asynq-throttle/metrics"
)

// defaultServeAddr is serve's --addr: loopback only, since the dashboard
// has no authentication of its own.
const defaultServeAddr = "127.0.0.1:8080"

// reHostName is a name --allowed-hosts takes, with an optional port (which
// the dashboard ignores).
var reHostName = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?(:[0-9]+)?$`)

func (a *app) serveCmd() *cobra.Command {
	var (
		addr         string
		readOnly     bool
		allowedHosts []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the web view on / and Prometheus metrics on /metrics",
		Long: `Serve the dashboard (every key live, with suspend, resume and limit changes
when --read-only=false) on / and the keys' state in Redis as Prometheus
metrics on /metrics. This process makes no decisions, so its metrics and
page show the state in Redis; decisions and 429s are counted by the
collector in each worker (package metrics).

It listens on ` + defaultServeAddr + ` and has no authentication of its own: to
reach it from elsewhere, put it behind a proxy that authenticates, and name
the host the browser uses with --allowed-hosts. The dashboard and /metrics
refuse requests addressed to any host but localhost, an IP address or those
(against DNS rebinding): scrape it by IP address, or name the scrape
target's host with --allowed-hosts. Every action taken from the dashboard
is logged (what, on which key, from where), and serve warns when actions
are on and it listens beyond loopback.`,
		Example: `  asynq-throttle serve
  asynq-throttle serve --read-only=false
  asynq-throttle serve --allowed-hosts throttle.ops.example.com   # behind an authenticating proxy`,
		Args: args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkAddr(addr); err != nil {
				return usageError{fmt.Errorf("--addr %q: %w", addr, err)}
			}
			for _, h := range allowedHosts {
				if !reHostName.MatchString(h) {
					return usagef("--allowed-hosts %q: want a host name as the browser sends it, such as throttle.example.com (no scheme, path or wildcard)", h)
				}
			}
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(metrics.New(lim))
			var hosts hostcheck.Hosts
			hosts.Add(allowedHosts...)
			mux := http.NewServeMux()
			// The metrics name every key and tenant: the same Host check as
			// the dashboard's, against DNS rebinding.
			mux.Handle("/metrics", hostChecked(hosts, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
			mux.Handle("/", dashboard.New(lim, dashboard.WithReadOnly(readOnly), dashboard.WithAllowedHosts(allowedHosts...)))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %s: %w", addr, err)
			}
			mode := "read-only"
			if !readOnly {
				mode = "actions on"
			}
			fmt.Fprintf(a.stdout, "serving the dashboard on http://%s/ (%s) and Prometheus metrics on http://%s/metrics\n", ln.Addr(), mode, ln.Addr())
			if !readOnly && !loopback(ln.Addr()) {
				fmt.Fprintf(a.stderr, "asynq-throttle: warning: actions are on (--read-only=false) and %s is reachable beyond this machine, with no authentication: anyone who can reach it can suspend keys and change limits; listen on 127.0.0.1 behind an authenticating proxy (docs/operating.md)\n", ln.Addr())
			}
			return serveUntil(cmd.Context(), ln, mux)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", defaultServeAddr, "address to listen on (:8080 for every interface)")
	cmd.Flags().BoolVar(&readOnly, "read-only", true, "refuse the dashboard's actions (suspend, resume, set limits); --read-only=false allows them")
	cmd.Flags().StringSliceVar(&allowedHosts, "allowed-hosts", nil, "host names the dashboard answers to besides localhost and IP addresses (comma-separated or repeated), e.g. the name a proxy passes on")
	return cmd
}

// loopback reports whether addr listens on a loopback address only.
func loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// hostChecked answers only requests addressed to localhost, an IP address
// or one of hosts, as the dashboard does; any other gets 403 Forbidden.
func hostChecked(hosts hostcheck.Hosts, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts.Allowed(r.Host) {
			http.Error(w, fmt.Sprintf("host %q not allowed: asynq-throttle serve answers localhost, IP addresses and the hosts given to --allowed-hosts", r.Host), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// checkAddr checks a listening address as net.Listen reads it: [host]:port,
// the port a number (0 for any free one) or a service name.
func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port or :port, such as 127.0.0.1:8080 or :8080 (%v)", err)
	}
	if port == "" {
		return errors.New("no port: want host:port or :port, such as 127.0.0.1:8080")
	}
	if n, err := strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
		return fmt.Errorf("port %d: want 0 to 65535", n)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("host %q: want an IP address or a host name", host)
	}
	return nil
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
