package throttle

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// WithDialect teaches Observe the dialect of a provider it does not know
// (docs/providers.md lists those it does): for every response of a key
// named name (the key itself, or its start up to a ':', '-', '/' or '.':
// "acme:eu" and "acme-eu" are "acme"'s; case ignored), Observe calls read.
// read returns the quota the response states, as a Limit of N calls per
// Per (with Burst, a bucket's capacity, when it says; the zero Limit when
// it states none), and how long the response asks to wait (0 when it does
// not say).
//
// Observe learns the quota as a published one: it lowers the key's tier
// of the same period, or, when the key has none, its tier of the nearest
// period, the quota converted (N × the tier's period / Per, rounded down),
// never above the limits set. A wait makes Observe return a
// *RateLimitedError for it whatever the status (the middleware suspends
// the key for it); without one, the response's Retry-After and the IETF
// RateLimit fields are read as for any provider. The reader replaces
// Observe's own reading of a provider it knows by that name.
//
// read runs in the handler, on every response: it must be quick, safe for
// concurrent use, and leave resp.Body for the handler (Observe has put
// back what it read of it). With several WithDialect of one name, the
// last wins. An empty name, one holding ':', '-', '/' or '.', or a nil
// read is an invalid option.
func WithDialect(name string, read func(resp *http.Response) (quota Limit, wait time.Duration)) Option {
	return func(o *options) {
		bad := func(why string) error {
			return fmt.Errorf("throttle: option WithDialect(%q): %s", name, why)
		}
		switch {
		case o.dialectErr != nil:
			return
		case name == "" || strings.ContainsAny(name, ":-/."):
			o.dialectErr = bad("the name must be non-empty, without ':', '-', '/' or '.' (the start of a key's name)")
			return
		case ValidateKey(name) != nil:
			o.dialectErr = bad(fmt.Sprintf("the name must be a valid key name: %v", ValidateKey(name)))
			return
		case read == nil:
			o.dialectErr = bad("the reader must not be nil")
			return
		}
		if o.dialects == nil {
			o.dialects = map[string]func(*http.Response) (Limit, time.Duration){}
		}
		o.dialects[strings.ToLower(name)] = read
	}
}
