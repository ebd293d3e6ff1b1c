package metrics

import "github.com/asynq-throttle/asynq-throttle/throttle"

// Hooks for the tests of package metrics_test.

// Observe counts ev as if lim's middleware had made it.
func (c *Collector) Observe(ev throttle.Event) { c.observe(ev) }

// Counts returns the counts of every key label seen.
func (c *Collector) Counts() map[string]KeyCounts { return c.counts() }

type KeyCounts = keyCounts

var ErrorClass = errorClass

const (
	OtherKey        = otherKey
	NoKey           = noKey
	ClassTimeout    = classTimeout
	ClassConnection = classConnection
	ClassReply      = classReply
	ClassBadConfig  = classBadConfig
	ClassOther      = classOther
)
