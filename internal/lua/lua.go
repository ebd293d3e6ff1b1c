// Package lua holds the Redis Lua scripts that make every throttling decision,
// embedded from .lua files, and the typed Go wrappers that run them.
//
// The scripts share lib.lua's helpers. On Redis 7 they are loaded once as a
// function library (FUNCTION LOAD) and called with FCALL, so the helpers
// are not rebuilt on every call; where functions are not available (Redis
// 6.2, miniredis, an ACL without FUNCTION or FCALL) each script runs with
// EVALSHA, the helpers prepended. A missing library (a restart without
// persistence, FUNCTION FLUSH, a new node) is loaded again; a missing
// script (SCRIPT FLUSH) is sent with EVAL; where loading fails (a Cluster
// node unreachable) the call still runs, with EVAL. None of it reaches the
// caller as an error.
//
// Every script reads Redis TIME once, so the whole fleet shares one clock.
// All keys of one limiter key share a hash tag and are passed in KEYS, so
// the scripts run unchanged on Redis Cluster.
package lua

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed window.lua
	windowSrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed fair.lua
	fairSrc string
	//go:embed run.lua
	runSrc string
	//go:embed multi.lua
	multiSrc string
	//go:embed setlimits.lua
	setLimitsSrc string
	//go:embed setweights.lua
	setWeightsSrc string
	//go:embed suspend.lua
	suspendSrc string
	//go:embed resume.lua
	resumeSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed adjust.lua
	adjustSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed observe.lua
	observeSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed unbook.lua
	unbookSrc string
	//go:embed unindex.lua
	unindexSrc string
)

// Script is one of the scripts, callable as a function of the library or
// with EVALSHA/EVAL.
type Script struct {
	name string // function name in the library, unique to this version
	top  string // its own helpers, at the library's top level ("" none)
	// after is a script whose top this one's starts with: the library
	// defines that part once, with after.
	after *Script
	body  string // the function's body
	src   string // helpers + top + body, for EVAL
	sha   string // SHA1 of src, for EVALSHA
}

// version identifies this build of the scripts. Function names carry it, so
// processes of different versions (a rolling upgrade) each call their own.
var version = func() string {
	h := sha1.New()
	for _, s := range []string{libSrc, windowSrc, decideSrc, fairSrc, runSrc, multiSrc, setWeightsSrc, setLimitsSrc, suspendSrc, resumeSrc, inspectSrc, adjustSrc, releaseSrc, extendSrc, observeSrc, unbookSrc, unindexSrc} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}()

// LibraryName is the name of the function library of this version.
var LibraryName = "asynq_throttle_" + version

// helpers are the functions every script shares: lib.lua and window.lua.
var helpers = libSrc + "\n" + windowSrc

// newScript makes a script whose function runs body; top holds functions
// of its own that a function library defines once, when it loads, rather
// than on every call.
func newScript(name, top, body string) *Script {
	src := helpers + "\n" + top + "\n" + body
	sum := sha1.Sum([]byte(src))
	return &Script{name: "asynq_throttle_" + name + "_" + version, top: top, body: body, src: src, sha: hex.EncodeToString(sum[:])}
}

// newScriptAfter makes a script whose own functions (top) follow those of
// script after, which the library defines once.
func newScriptAfter(after *Script, name, top, body string) *Script {
	s := newScript(name, after.top+"\n"+top, body)
	s.after = after
	return s
}

var (
	// decide.lua, fair.lua and run.lua define decide_run and the functions
	// it calls.
	decideScript = newScript("decide", decideSrc+"\n"+fairSrc+"\n"+runSrc, "return decide_run(KEYS, ARGV)")
	// multi.lua defines decide_multi on decide.lua's functions: in the
	// library it follows them; for EVAL its source holds them too. The
	// one-key script is left as it was.
	decideMultiScript = newScriptAfter(decideScript, "decide_multi", multiSrc, "return decide_multi(KEYS, ARGV)")
	setWeightsScript  = newScript("setweights", "", setWeightsSrc)
	setLimitsScript   = newScript("setlimits", "", setLimitsSrc)
	suspendScript     = newScript("suspend", "", suspendSrc)
	resumeScript      = newScript("resume", "", resumeSrc)
	inspectScript     = newScript("inspect", inspectSrc, "return inspect_keys(KEYS, ARGV)")
	adjustScript      = newScript("adjust", "", adjustSrc)
	releaseScript     = newScript("release", "", releaseSrc)
	extendScript      = newScript("extend", "", extendSrc)
	observeScript     = newScript("observe", "", observeSrc)
	unbookScript      = newScript("unbook", "", unbookSrc)
	unindexScript     = newScript("unindex", "", unindexSrc)
	allScripts        = []*Script{decideScript, decideMultiScript, setWeightsScript, setLimitsScript, suspendScript, resumeScript, inspectScript,
		adjustScript, releaseScript, extendScript, observeScript, unbookScript, unindexScript}
)

// library is the source FUNCTION LOAD takes: the helpers and each script's
// own functions once, then every script body as a function.
var library = func() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n%s\n", LibraryName, helpers)
	for _, s := range allScripts {
		top := s.top
		if s.after != nil {
			top = top[len(s.after.top):]
		}
		if top != "" {
			fmt.Fprintf(&b, "%s\n", top)
		}
	}
	for _, s := range allScripts {
		fmt.Fprintf(&b, "redis.register_function('%s', function(KEYS, ARGV)\n%s\nend)\n", s.name, s.body)
	}
	return b.String()
}()

// Mode says how a Runner calls the scripts.
type Mode int32

const (
	// ModeFunction calls the library's functions with FCALL.
	ModeFunction Mode = iota
	// ModeEval calls each script with EVALSHA (EVAL on NOSCRIPT).
	ModeEval
)

// Runner runs the scripts on one client, with FCALL while the server takes
// functions, else with EVALSHA. It is safe for concurrent use.
type Runner struct {
	rdb  redis.UniversalClient
	mode atomic.Int32
}

// NewRunner returns a Runner on rdb. It starts with functions and switches
// to EVALSHA for good at the first sign the server does not take them.
func NewRunner(rdb redis.UniversalClient) *Runner {
	return &Runner{rdb: rdb}
}

// Mode returns how the scripts are called now.
func (r *Runner) Mode() Mode { return Mode(r.mode.Load()) }

// Head returns the first two words of a call of s in mode m: "fcall" and the
// function name, "evalsha" and the SHA1, or "eval" and the source.
func (s *Script) Head(m Mode) (string, string) {
	if m == ModeFunction {
		return "fcall", s.name
	}
	return "evalsha", s.sha
}

// EvalHead returns the first two words of an EVAL of s.
func (s *Script) EvalHead() (string, string) { return "eval", s.src }

// Run runs s with keys and args and returns the reply.
func (r *Runner) Run(ctx context.Context, s *Script, keys []string, args ...any) (any, error) {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	verb, id := s.Head(r.Mode())
	cmdArgs = append(cmdArgs, verb, id, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	return r.run(ctx, s, cmdArgs).Result()
}

// Do runs a call of s built by the caller (its first two words from Head)
// and returns its reply as a string.
func (r *Runner) Do(ctx context.Context, s *Script, args []any) (string, error) {
	return r.run(ctx, s, args).Text()
}

func (r *Runner) run(ctx context.Context, s *Script, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	_ = r.rdb.Process(ctx, cmd)
	for attempt := 0; attempt < 3 && cmd.Err() != nil; attempt++ {
		if !r.Recover(ctx, s, args, cmd.Err()) {
			break
		}
		cmd = redis.NewCmd(ctx, args...)
		_ = r.rdb.Process(ctx, cmd)
	}
	return cmd
}

// Recover looks at the error of a call of s whose command is args and, when
// the call should run again, fixes args (its first two words) and reports
// true: the library is loaded after "Function not found", the Runner
// switches to EVALSHA for good when the server does not take functions
// (Redis 6.2, miniredis) or the user may not call the decide function, and
// a NOSCRIPT is answered with EVAL. When the library cannot be loaded (a
// Cluster node unreachable, a user without FUNCTION LOAD) the call runs with
// EVAL this time only, and an operator's function a user may not call
// (NOPERM, an ACL that keeps workers from changing limits) is tried with
// EVALSHA this time only: neither changes how later calls are sent, so a
// refused call never breaks the decisions the user may make.
func (r *Runner) Recover(ctx context.Context, s *Script, args []any, err error) bool {
	switch {
	case IsFunctionMissing(err):
		if lerr := r.Load(ctx); lerr != nil {
			if IsNoFunctions(lerr) && !isNoPerm(lerr) {
				r.mode.Store(int32(ModeEval))
				args[0], args[1] = s.Head(ModeEval)
			} else {
				args[0], args[1] = s.EvalHead()
			}
		}
		return true
	case IsNoFunctions(err):
		if !isNoPerm(err) || s == decideScript || s == decideMultiScript {
			r.mode.Store(int32(ModeEval))
		}
		args[0], args[1] = s.Head(ModeEval)
		return true
	case IsNoScript(err):
		args[0], args[1] = s.EvalHead()
		return true
	}
	return false
}

// isNoPerm reports a command the ACL refuses.
func isNoPerm(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(strings.ToLower(re.Error()), "noperm")
}

// Load loads the library of this version into the server (every master of
// a Cluster). A library already there counts as loaded.
func (r *Runner) Load(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, library).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Client:
		return load(ctx, c)
	}
	err := r.rdb.FunctionLoad(ctx, library).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// IsFunctionMissing reports an FCALL of a function the server does not have.
func IsFunctionMissing(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "Function not found")
}

// IsNoFunctions reports a server (or an ACL) that does not take FCALL or
// FUNCTION LOAD: Redis before 7, miniredis, a user without the rights.
func IsNoFunctions(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	s := strings.ToLower(re.Error())
	return (strings.HasPrefix(s, "err unknown command") || strings.HasPrefix(s, "noperm") ||
		strings.HasPrefix(s, "err unknown subcommand")) &&
		(strings.Contains(s, "fcall") || strings.Contains(s, "function"))
}

// IsNoScript reports an EVALSHA of a script the server does not have.
func IsNoScript(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOSCRIPT")
}

// Status codes in the first element of a Decide or Inspect reply.
const (
	StatusAllowed     = 1
	StatusDenied      = 0
	StatusBadConfig   = -1
	StatusNoLimits    = -2
	StatusCostTooHigh = -3
	StatusFair        = -4 // tenants share the key: ask again as a tenant (DecideArgs.Fair)
)

// Keys are the Redis keys of one limiter key. All must hash to one slot.
type Keys struct {
	Bucket       string // hash: limits, bucket state, suspension, schedule (see lib.lua)
	Reservations string // sorted set: task ID scored by its reserved instant (us)
	Slots        string // sorted set: slots in flight scored by when each expires (us)
	Tenants      string // sorted set: active tenants scored by finish tag (fair.lua)
	Tags         string // sorted set: the start tag of each fair reservation, by task ID (fair.lua)
	Config       string // hash without expiry: the configuration (limits, weights), until Delete (lib.lua)
}

// Tier kinds.
const (
	KindBucket   = 0   // a token bucket: Rate every PerMS, at most Burst at once
	KindWindow   = 'w' // a window: at most Rate calls in any PerMS (Burst = Rate)
	KindFixed    = 'x' // a fixed window: at most Rate calls in each PerMS aligned to the Unix epoch (Burst = Rate)
	KindInFlight = 'f' // in flight: at most Rate slots held at once (PerMS, Burst unused)
	KindAdaptive = 'a' // adaptive: rate tiers cut on each new suspension, won back every PerMS clean
)

// Tier is one validated limit as the scripts store it (FormatTiers), by
// Kind: a token bucket of Rate tokens every PerMS milliseconds holding at
// most Burst; a window of at most Rate calls in any PerMS milliseconds; an
// in-flight limit of at most Rate slots held at once; or adaptive mode,
// whose clean period is PerMS. Fields a kind does not use are 0.
type Tier struct {
	Kind               byte // KindBucket, KindWindow, KindFixed, KindInFlight or KindAdaptive
	Rate, PerMS, Burst int64
	Unit               string // what a rate tier counts: "" requests, else another unit ("tokens")
}

// FormatTiers writes tiers as the scripts store them: "rate/per_ms/burst"
// for a bucket, "wN/per_ms" for a window, "xN/per_ms" for a fixed window,
// "fN" in flight, "aN" adaptive, separated by spaces ("" for none); a rate
// tier of another unit than requests ends in "~unit".
func FormatTiers(tiers []Tier) string {
	var b strings.Builder
	for i, t := range tiers {
		if i > 0 {
			b.WriteByte(' ')
		}
		switch t.Kind {
		case KindWindow, KindFixed:
			b.WriteByte(t.Kind)
			b.WriteString(strconv.FormatInt(t.Rate, 10))
			b.WriteByte('/')
			b.WriteString(strconv.FormatInt(t.PerMS, 10))
			writeUnit(&b, t.Unit)
			continue
		case KindInFlight:
			b.WriteByte('f')
			b.WriteString(strconv.FormatInt(t.Rate, 10))
			continue
		case KindAdaptive:
			b.WriteByte('a')
			b.WriteString(strconv.FormatInt(t.PerMS, 10))
			continue
		}
		b.WriteString(strconv.FormatInt(t.Rate, 10))
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(t.PerMS, 10))
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(t.Burst, 10))
		writeUnit(&b, t.Unit)
	}
	return b.String()
}

// writeUnit ends a rate tier of another unit than requests.
func writeUnit(b *strings.Builder, unit string) {
	if unit != "" {
		b.WriteByte('~')
		b.WriteString(unit)
	}
}

// num reads an integer that the script sent as a string, or as an integer.
// Anything not finite or outside int64 is refused rather than wrapped around.
func num(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case string:
		return parseNum(v)
	}
	return 0, false
}

func parseNum(s string) (int64, bool) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// ErrBadReply reports a script reply of an unexpected shape (a script and
// wrapper out of step, or something other than Redis answering).
var ErrBadReply = errors.New("lua: unexpected script reply")

func errBadReply(script string, v any) error {
	return fmt.Errorf("%w from %s: %#v", ErrBadReply, script, v)
}

// Library returns the source that FUNCTION LOAD takes (for tools that
// measure or load the scripts themselves).
func Library() string { return library }

// Source returns the script as EVAL takes it: the helpers, its own
// functions and its body.
func (s *Script) Source() string { return s.src }

// Name returns the script's function name in the library.
func (s *Script) Name() string { return s.name }
