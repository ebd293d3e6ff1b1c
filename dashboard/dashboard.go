// Package dashboard is asynq-throttle's web view: one page that shows every
// key live (its limits, a gauge per limit: a bucket's tokens, a window's
// calls left, the slots in flight; the limits' generation, suspension with
// a countdown, the reservation backlog as a forecast, decisions per second
// and 429s) with actions to suspend, resume and change limits behind a
// read-only switch that is on by default. Everything it serves is
// embedded: no CDN, no network fetch.
//
// It is an http.Handler that mounts under any prefix, beside asynqmon:
//
//	http.Handle("/throttle/", http.StripPrefix("/throttle", dashboard.New(lim)))
//	http.Handle("/monitoring/", asynqmon.New(asynqmon.Options{RootPath: "/monitoring", ...}))
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/asynq-throttle/asynq-throttle/metrics"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

//go:embed assets
var assets embed.FS

// Defaults of the options.
const (
	// DefaultMaxKeys is how many keys the page shows (in name order).
	DefaultMaxKeys = 200
	// DefaultPollInterval is how often the page asks for fresh state.
	DefaultPollInterval = time.Second
)

// Option configures the dashboard.
type Option func(*options)

type options struct {
	readOnly bool
	counts   *metrics.Collector
	maxKeys  int
	poll     time.Duration
	title    string
}

// WithReadOnly turns the actions (suspend, resume, change limits) off or on
// (default true: read-only). The server enforces it: in read-only mode
// every action request is refused with 403 Forbidden, whatever the page
// shows.
func WithReadOnly(readOnly bool) Option { return func(o *options) { o.readOnly = readOnly } }

// WithMetrics shows, per key, the decisions per second by outcome and the
// 429s that c has counted (default: none shown). c counts the decisions of
// the process it observes (throttle.WithObserver(c.Observe)), so mount the
// dashboard in a worker process to see them; Prometheus aggregates the
// fleet.
func WithMetrics(c *metrics.Collector) Option { return func(o *options) { o.counts = c } }

// WithMaxKeys caps the keys shown, in name order (default DefaultMaxKeys).
func WithMaxKeys(n int) Option { return func(o *options) { o.maxKeys = n } }

// WithPollInterval sets how often the page refreshes (default
// DefaultPollInterval, 1 s; at least 100 ms).
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.poll = d } }

// WithTitle sets the page title (default "asynq-throttle").
func WithTitle(s string) Option { return func(o *options) { o.title = s } }

// dashboard serves the page, its assets and its JSON API.
type dashboard struct {
	lim *throttle.Limiter
	o   options
	mux *http.ServeMux
}

// New returns the dashboard of lim's keys as an http.Handler. Its page uses
// relative URLs, so it works under any prefix stripped by http.StripPrefix.
// It is safe for concurrent use.
func New(lim *throttle.Limiter, opts ...Option) http.Handler {
	o := options{readOnly: true, maxKeys: DefaultMaxKeys, poll: DefaultPollInterval, title: "asynq-throttle"}
	for _, opt := range opts {
		opt(&o)
	}
	o.maxKeys = max(o.maxKeys, 1)
	o.poll = max(o.poll, 100*time.Millisecond)
	d := &dashboard{lim: lim, o: o, mux: http.NewServeMux()}
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
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'self'")
	d.mux.ServeHTTP(w, r)
}
