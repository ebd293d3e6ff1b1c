package throttle

import "sync"

// onceSet remembers which warnings a Limiter has logged, so that each is
// logged once per process (keyState, which a process forgets after a
// minute unused, cannot). It is bounded: past maxOnce entries, warnings it
// has not seen are not logged at all rather than remembered without end
// (a process with that many keys or task types to warn about has said
// enough).
type onceSet struct {
	mu   sync.Mutex
	seen map[[2]string]struct{}
}

// maxOnce bounds the warnings one Limiter remembers.
const maxOnce = 10_000

// first reports whether warning kind about subject is asked for the first
// time, and remembers it. A nil set (options not made by newOptions, as
// KeyOfTask's) logs nothing: it always reports false.
func (s *onceSet) first(kind, subject string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{kind, subject}
	if _, ok := s.seen[k]; ok || len(s.seen) >= maxOnce {
		return false
	}
	if s.seen == nil {
		s.seen = map[[2]string]struct{}{}
	}
	s.seen[k] = struct{}{}
	return true
}
