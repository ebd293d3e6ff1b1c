package main

import (
	"errors"
	"time"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// parseLimits reads the LIMIT arguments of set; a bad one is a usage error
// naming the accepted forms.
func parseLimits(specs []string) ([]throttle.Limit, error) {
	ls, err := limitspec.ParseAll(specs...)
	if err != nil {
		return nil, usageError{err}
	}
	return ls, nil
}

func formatLimit(l throttle.Limit) string { return limitspec.Format(l) }

func formatLimits(ls []throttle.Limit) string {
	if len(ls) == 0 {
		return "none"
	}
	return limitspec.FormatAll(ls)
}

func burstOf(l throttle.Limit) int { return limitspec.Burst(l) }

// formatDur shows a duration for people: "-" for none, milliseconds under
// a second, tenths under a minute, whole seconds above.
func formatDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// isInvalidLimit reports a limit SetLimits refused (not a config in Redis).
func isInvalidLimit(err error) bool {
	var cfg *throttle.ConfigError
	return errors.Is(err, throttle.ErrInvalidLimit) && !errors.As(err, &cfg)
}
