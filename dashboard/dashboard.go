// Package dashboard is asynq-throttle's web view: one page that shows every
// key live (its limits, a gauge per limit in the limit's unit: a bucket's
// tokens, a window's calls left, the slots in flight; the limits'
// generation, suspension with a countdown, the reservation backlog as a
// forecast, the tenants sharing it with their weights, shares of its rate,
// backlogs and work admitted, decisions per second, 429s, and what the key
// made tasks wait for: which of its limits, or its suspension) with actions
// to suspend, resume and change limits (in the CLI's form, units and all:
// 500/m 30000/m:tokens) behind a read-only switch that is on by default.
// Everything it serves is embedded: no CDN, no network fetch. It answers
// only requests addressed to localhost, an IP address or a host given to
// WithAllowedHosts, so that a site rebinding its own name to this address
// can neither read nor act.
//
// It is an http.Handler that mounts under any prefix, beside asynqmon:
//
//	http.Handle("/throttle/", http.StripPrefix("/throttle", dashboard.New(lim)))
//	http.Handle("/monitoring/", asynqmon.New(asynqmon.Options{RootPath: "/monitoring", ...}))
package dashboard

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/hostcheck"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

//go:embed assets
var assets embed.FS

// The defaults; each With* doc states the one it changes.
const (
	defaultMaxKeys      = 200
	defaultPollInterval = time.Second
)

// Option configures the dashboard.
type Option func(*options)

type options struct {
	readOnly bool
	maxKeys  int
	poll     time.Duration
	title    string
	hosts    hostcheck.Hosts // allowed besides localhost and IP addresses
}

// WithReadOnly turns the actions (suspend, resume, change limits) off or on
// (default true: read-only). The server enforces it: in read-only mode
// every action request is refused with 403 Forbidden, whatever the page
// shows.
func WithReadOnly(readOnly bool) Option { return func(o *options) { o.readOnly = readOnly } }

// WithMaxKeys caps the keys shown (default 200), in the order
// Limiter.Keys lists them: the keys with limits of their own first, each
// group by name.
func WithMaxKeys(n int) Option { return func(o *options) { o.maxKeys = n } }

// WithPollInterval sets how often the page refreshes (default 1s; at least
// 100ms).
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.poll = d } }

// WithTitle sets the page title (default "asynq-throttle").
func WithTitle(s string) Option { return func(o *options) { o.title = s } }

// WithAllowedHosts adds host names the dashboard answers to, besides
// localhost and IP addresses (default: those only). A request whose Host
// header names any other host, for the page and the API alike, is refused
// with 403 Forbidden: a site that rebinds its own name to the dashboard's
// address (DNS rebinding) would otherwise be same-origin with it. Names
// match without case, a port or a final dot; "*.example.com" patterns are
// not supported. Behind a reverse proxy that passes on the Host the
// browser used, list that name.
func WithAllowedHosts(hosts ...string) Option {
	return func(o *options) { o.hosts.Add(hosts...) }
}

// dashboard serves the page, its assets and its JSON API.
type dashboard struct {
	lim    *throttle.Limiter
	o      options
	mux    *http.ServeMux
	counts counts // lim's middleware decisions in this process
}

// New returns the dashboard of lim's keys as an http.Handler: for every key
// in Redis its limits, tokens, slots in flight, suspension and
// reservations, and, when lim's middleware runs in this process, the
// decisions it made per second by outcome and the 429s it saw (Prometheus,
// see package metrics, sums them over the fleet). Its page uses relative
// URLs, so it works under any prefix stripped by http.StripPrefix. It is
// safe for concurrent use.
func New(lim *throttle.Limiter, opts ...Option) http.Handler {
	o := options{readOnly: true, maxKeys: defaultMaxKeys, poll: defaultPollInterval, title: "asynq-throttle"}
	for _, opt := range opts {
		opt(&o)
	}
	o.maxKeys = max(o.maxKeys, 1)
	o.poll = max(o.poll, 100*time.Millisecond)
	d := &dashboard{lim: lim, o: o, mux: http.NewServeMux()}
	lim.OnEvent(d.counts.add)
	static, _ := fs.Sub(assets, "assets")
	d.mux.HandleFunc("GET /{$}", d.index)
	d.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	d.mux.HandleFunc("GET /api/keys", d.keys)
	d.mux.HandleFunc("POST /api/suspend", d.action(d.suspend))
	d.mux.HandleFunc("POST /api/resume", d.action(d.resume))
	d.mux.HandleFunc("POST /api/limits", d.action(d.setLimits))
	return d
}

func (d *dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'self'")
	// For browsers that ignore frame-ancestors, and so that no URL of the
	// view (a key's name in it) leaks to another site.
	w.Header().Set("X-Frame-Options", "SAMEORIGIN")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if !d.o.hosts.Allowed(r.Host) {
		// 403 as the other refusals: the request is well formed (400) and
		// another connection would not help (421 makes browsers retry).
		writeError(w, http.StatusForbidden, fmt.Errorf("host %q not allowed: the dashboard answers localhost, IP addresses and the hosts given to dashboard.WithAllowedHosts (asynq-throttle serve --allowed-hosts)", r.Host))
		return
	}
	if r.URL.Path == "" {
		// Mounted at /throttle/ and asked for /throttle: relative URLs
		// need the trailing slash.
		// A relative Location resolves against the URL the browser asked
		// for, whatever the prefix (http.Redirect would make it absolute).
		p, _, _ := strings.Cut(r.RequestURI, "?")
		w.Header().Set("Location", path.Base(p)+"/")
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	d.mux.ServeHTTP(w, r)
}
