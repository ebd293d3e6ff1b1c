package throttle

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

// keyState is what one Limiter remembers about one key in this process:
// the decide commands it built, its lease,
// and the middleware's caches (no limits, suspension). Keys not used for
// stateIdle are forgotten, so a process that sees many keys (one per
// tenant, say) holds memory only for the keys it uses; and it holds state
// for at most maxKeyStates keys, so that a producer that names keys at
// will (each task its own) cannot make a worker hold memory without bound.
type keyState struct {
	used atomic.Int64 // last use, UnixNano
	take atomic.Pointer[template]

	lease lease

	mu            sync.Mutex
	tmpls         []*template // the other decide commands, by variant
	noLimitsUntil time.Time   // "no limits" answered by Redis, trusted until then
	warned        bool        // "no limits" was logged
	susp          *suspension // a suspension answered by Redis, trusted for a while
	obs           observeMemo // what Observe last sent about the key

	// fair: Redis said tenants share the key; a task without a tenant is
	// decided as the default tenant.
	fair atomic.Bool

	// transient: kept by no one (the Limiter held maxKeyStates keys when
	// the key came): it serves one call, and takes no lease.
	transient bool

	// indexed is when this process last recorded the key in the index of
	// the limiter's keys (UnixNano, 0 never); indexedConf that it recorded
	// it as having limits of its own in Redis (see index.go).
	indexed     atomic.Int64
	indexedConf atomic.Bool
}

// variant is what tells decide commands of one key apart.
type variant struct {
	horizon, granule time.Duration
	lease            int
	headroom         time.Duration
	book, pace       bool
	probe            bool // a slot waiter asking again (keeps its place)
	near             bool // waits in its worker for a paced instant and asks again (lua.DecideArgs.Near)
	fair             bool // callers say their tenant (fair shares)
	mode             lua.Mode
}

// template is a decide command without its task IDs.
type template struct {
	v    variant
	args []any
}

// stateIdle is how long a key's state is kept without use.
const stateIdle = time.Minute

// maxKeyStates bounds the keys whose state one Limiter keeps (about 900 B
// each): past it, a key without state is decided with a state made for
// the call and dropped after it (its command built each time, no lease,
// no caches), until idle keys are forgotten.
const maxKeyStates = 10_000

// keyStates holds the keyState of every key a Limiter used lately.
type keyStates struct {
	m     sync.Map // key -> *keyState
	n     atomic.Int64
	max   int64         // maxKeyStates; smaller in tests
	idle  time.Duration // stateIdle; shorter in tests
	now   func() time.Time
	sweep atomic.Bool // a sweep is scheduled
}

// get returns the state of key, created when missing, and marks it used.
func (s *keyStates) get(key string) *keyState {
	now := s.now().UnixNano()
	if v, ok := s.m.Load(key); ok {
		ks := v.(*keyState)
		// (Marked at most once a second, and at least 8 times an idle
		// period: a key in use is never swept.)
		if ks.used.Load() < now-int64(min(time.Second, s.idle/8)) {
			ks.used.Store(now)
		}
		return ks
	}
	ks := &keyState{}
	ks.used.Store(now)
	if s.n.Load() >= s.max {
		ks.transient = true
		s.schedule()
		return ks
	}
	v, loaded := s.m.LoadOrStore(key, ks)
	if !loaded {
		s.n.Add(1)
		s.schedule()
	}
	return v.(*keyState)
}

// peek returns the state of key if there is one, without marking it used.
func (s *keyStates) peek(key string) *keyState {
	if v, ok := s.m.Load(key); ok {
		return v.(*keyState)
	}
	return nil
}

// schedule makes sure a sweep will run.
func (s *keyStates) schedule() {
	if s.sweep.CompareAndSwap(false, true) {
		time.AfterFunc(s.idle, s.run)
	}
}

// run forgets keys not used for idle, and schedules the next sweep while
// any are left (none: nothing keeps the Limiter alive).
func (s *keyStates) run() {
	cutoff := s.now().Add(-s.idle).UnixNano()
	s.m.Range(func(k, v any) bool {
		ks := v.(*keyState)
		if ks.used.Load() < cutoff && !ks.busy() {
			if s.m.CompareAndDelete(k, ks) {
				s.n.Add(-1)
			}
		}
		return true
	})
	s.sweep.Store(false)
	if s.n.Load() > 0 {
		s.schedule()
	}
}

// busy reports state that must outlive idleness: tasks deferred from a
// cached suspension that may have to be brought back.
func (ks *keyState) busy() bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.susp != nil && len(ks.susp.parked) > 0
}

// size returns how many keys have state (for tests and benchmarks).
func (s *keyStates) size() int { return int(s.n.Load()) }
