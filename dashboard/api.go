package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// stateView is the answer of GET api/keys.
type stateView struct {
	Time               time.Time `json:"time"`
	ReadOnly           bool      `json:"read_only"`
	DecisionsAvailable bool      `json:"decisions_available"`
	PollSeconds        float64   `json:"poll_seconds"`
	Keys               []keyView `json:"keys"`
	Omitted            int       `json:"omitted"` // keys past WithMaxKeys
}

// keyView is one key on the page. A field added to throttle.Status goes
// here (or, per limit, in limitspec.Views, shared with the CLI) and in
// newKeyView (and in app.js to show it).
type keyView struct {
	Key       string               `json:"key"`
	Limits    []limitspec.TierView `json:"limits"`
	LimitSpec string               `json:"limit_spec"` // as the limits form takes it
	// Generation counts the changes of the key's limits (SetLimits).
	Generation int64 `json:"generation"`
	// InFlight is the slots of the key's in-flight limit; absent without one.
	InFlight         *limitspec.SlotsView `json:"in_flight,omitempty"`
	SuspendedSeconds float64              `json:"suspended_seconds"`
	Reservations     int                  `json:"reservations"`
	QueuedSeconds    float64              `json:"queued_seconds"`
	// Tenants are the key's tenants (throttle.Tenant) as Inspect reads
	// them: those with work booked, next in line first (at most 100), then
	// the others with a weight set; absent when its tasks have none.
	Tenants     []tenantView      `json:"tenants,omitempty"`
	Error       string            `json:"error,omitempty"`
	Decisions   map[string]uint64 `json:"decisions,omitempty"` // cumulative, by outcome
	RateLimited uint64            `json:"rate_limited"`
	// Waits are the deferrals this key decided (for a task of several
	// keys, the key that made it wait), cumulative, by what made the task
	// wait: "tier N" (the key's Nth limit, as in Limits), "suspended",
	// "queued", "reserved", "in flight", "provider".
	Waits map[string]uint64 `json:"waits,omitempty"`
}

// tenantView is one tenant of a key (throttle.TenantStatus).
type tenantView struct {
	Name     string  `json:"name"`     // "" the default tenant (tasks without throttle.Tenant)
	Weight   int     `json:"weight"`   // its weight (SetWeights; 1 when not set)
	Share    float64 `json:"share"`    // its part of the key's rate now, 0 to 1 (0: nothing booked)
	Backlog  float64 `json:"backlog"`  // work booked and not yet due, in cost units
	Admitted int64   `json:"admitted"` // work admitted since it last had work booked, in cost units
}

func newKeyView(key string, st throttle.Status, err error) keyView {
	v := keyView{
		Key:              key,
		LimitSpec:        limitspec.FormatAll(st.Limits),
		Generation:       st.Generation,
		SuspendedSeconds: st.SuspendedFor.Seconds(),
		Reservations:     st.Reservations,
		QueuedSeconds:    st.QueuedFor.Seconds(),
	}
	if err != nil {
		v.Error = err.Error()
	}
	v.Limits, v.InFlight = limitspec.Views(st)
	for _, t := range st.Tenants {
		v.Tenants = append(v.Tenants, tenantView{Name: t.Name, Weight: t.Weight, Share: t.Share, Backlog: t.Backlog, Admitted: t.Admitted})
	}
	return v
}

func (d *dashboard) index(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := indexTmpl.Execute(w, d.o); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

var indexTmpl = template.Must(template.ParseFS(assets, "assets/index.html"))

// Title and ReadOnly are read by the page template.
func (o options) Title() string  { return o.title }
func (o options) ReadOnly() bool { return o.readOnly }
func (o options) PollMS() int64  { return o.poll.Milliseconds() }

func (d *dashboard) keys(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	keys, err := d.lim.Keys(ctx)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	counts := d.counts.snapshot()
	v := stateView{Time: time.Now(), ReadOnly: d.o.readOnly, DecisionsAvailable: counts != nil, PollSeconds: d.o.poll.Seconds(), Keys: []keyView{}}
	if len(keys) > d.o.maxKeys {
		v.Omitted = len(keys) - d.o.maxKeys
		keys = keys[:d.o.maxKeys]
	}
	states, err := d.lim.InspectKeys(ctx, keys)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	for _, s := range states {
		// A key that cannot be read (invalid limits, a Redis key of the
		// wrong type under the prefix) shows its error; the rest are shown.
		kv := newKeyView(s.Key, s.Status, s.Err)
		if c, ok := counts[s.Key]; ok {
			kv.Decisions, kv.RateLimited = c.decisions, c.rateLimited
			if len(c.waits) > 0 {
				kv.Waits = c.waits
			}
		}
		v.Keys = append(v.Keys, kv)
	}
	writeJSON(w, http.StatusOK, v)
}

// read inspects one key; invalid limits in Redis are shown, not fatal.
func (d *dashboard) read(ctx context.Context, key string) (keyView, error) {
	st, err := d.lim.Inspect(ctx, key)
	var cfg *throttle.ConfigError
	if err != nil && !errors.As(err, &cfg) {
		return keyView{}, err
	}
	return newKeyView(key, st, err), nil
}

// actionHeader must be on every action request. A cross-site form cannot
// set it, and a cross-site fetch that sets it needs a CORS preflight this
// handler never grants: no CSRF.
const actionHeader = "X-Asynq-Throttle"

// action wraps an action handler: read-only refusal, CSRF checks, JSON
// body, the key's fresh state as the answer.
func (d *dashboard) action(do func(ctx context.Context, req actionRequest) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.o.readOnly {
			writeError(w, http.StatusForbidden, errors.New("the dashboard is read-only: actions are off (dashboard.WithReadOnly(false), or asynq-throttle serve --read-only=false)"))
			return
		}
		if r.Header.Get(actionHeader) == "" {
			writeError(w, http.StatusForbidden, fmt.Errorf("missing header %s: actions are taken from the dashboard page only", actionHeader))
			return
		}
		// ServeHTTP checked that Host is an allowed one, so an Origin
		// equal to it is this dashboard's page, not a rebound name.
		if o := r.Header.Get("Origin"); o != "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				writeError(w, http.StatusForbidden, fmt.Errorf("cross-origin request from %q refused", o))
				return
			}
		}
		var req actionRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("body: want JSON {\"key\": ..., \"duration\" or \"limits\": ...}: %v", err))
			return
		}
		if err := throttle.ValidateKey(req.Key); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		err := do(r.Context(), req)
		d.logAction(r, req, err)
		if err != nil {
			status := http.StatusBadGateway
			var bad badRequest
			if errors.As(err, &bad) || errors.Is(err, throttle.ErrInvalidLimit) {
				status = http.StatusBadRequest
			}
			writeError(w, status, err)
			return
		}
		kv, err := d.read(r.Context(), req.Key)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		writeJSON(w, http.StatusOK, kv)
	}
}

// logAction logs an action taken from the page through the Limiter's
// logger: what, on which key, with what, from where, and how it ended.
func (d *dashboard) logAction(r *http.Request, req actionRequest, err error) {
	attrs := []any{"action", path.Base(r.URL.Path), "key", req.Key}
	if req.Duration != "" {
		attrs = append(attrs, "duration", req.Duration)
	}
	if req.Limits != "" {
		attrs = append(attrs, "limits", req.Limits)
	}
	attrs = append(attrs, "remote_addr", r.RemoteAddr, "host", r.Host)
	if f := r.Header.Get("X-Forwarded-For"); f != "" {
		attrs = append(attrs, "forwarded_for", f)
	}
	if u := r.Header.Get("X-Forwarded-User"); u != "" {
		attrs = append(attrs, "forwarded_user", u)
	}
	if err != nil {
		d.lim.Logger().Warn("asynq-throttle dashboard: action refused", append(attrs, "err", err)...)
		return
	}
	d.lim.Logger().Info("asynq-throttle dashboard: action taken", attrs...)
}

// actionRequest is the body of an action.
type actionRequest struct {
	Key      string `json:"key"`
	Duration string `json:"duration,omitempty"` // suspend: a Go duration, e.g. "30s"
	Limits   string `json:"limits,omitempty"`   // limits: tiers as limitspec.ParseAll reads them
}

type badRequest struct{ error }

func (d *dashboard) suspend(ctx context.Context, req actionRequest) error {
	dur, err := time.ParseDuration(req.Duration)
	if err != nil || dur <= 0 {
		return badRequest{fmt.Errorf("duration %q: want a positive duration such as 30s, 5m, 1h", req.Duration)}
	}
	return d.lim.Suspend(ctx, req.Key, dur)
}

func (d *dashboard) resume(ctx context.Context, req actionRequest) error {
	_, err := d.lim.Resume(ctx, req.Key)
	return err
}

func (d *dashboard) setLimits(ctx context.Context, req actionRequest) error {
	ls, err := limitspec.ParseAll(req.Limits)
	if err != nil {
		return badRequest{fmt.Errorf("%w (limits are written as %s)", err, limitspec.Examples)}
	}
	return d.lim.SetLimits(ctx, req.Key, ls...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}
