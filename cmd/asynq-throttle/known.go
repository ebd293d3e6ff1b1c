package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// forceFlag adds --force to a command that acts on one existing key.
func forceFlag(cmd *cobra.Command, force *bool, does string) {
	cmd.Flags().BoolVar(force, "force", false, does+" even if the key has nothing in Redis (no limits, no state)")
}

// knownLimiter returns the Limiter for a command on key, which must be
// known (see requireKnown) unless force: does says what the command would
// have done.
func (a *app) knownLimiter(ctx context.Context, key string, force bool, does string) (*throttle.Limiter, error) {
	lim, err := a.limiter(ctx)
	if err != nil || force {
		return lim, err
	}
	return lim, a.requireKnown(ctx, lim, key, does)
}

// requireKnown fails when key has nothing in Redis (no limits, no state:
// a key list does not show), so that a typo is not silently obeyed. The
// error names the closest key that exists; does is what --force would do
// anyway ("suspends it").
func (a *app) requireKnown(ctx context.Context, lim *throttle.Limiter, key, does string) error {
	st, err := lim.Inspect(ctx, key)
	var cfg *throttle.ConfigError
	switch {
	case errors.As(err, &cfg):
		return nil // invalid limits are something, shown as such
	case err != nil:
		return err
	case len(st.Limits) > 0 || st.SuspendedFor > 0 || st.Reservations > 0:
		return nil
	}
	// Inspect reports nothing of state without limits in Redis (a bucket
	// of the workers' default limits, slots held): the keys list has it.
	keys, err := lim.Keys(ctx)
	if err != nil {
		return err
	}
	if _, found := slices.BinarySearch(keys, key); found {
		return nil
	}
	msg := fmt.Sprintf("key %q not found: no limits or state in Redis under prefix %q", key, a.prefix)
	if near := closest(key, keys); near != "" {
		msg += fmt.Sprintf("; did you mean %q?", near)
	}
	return fmt.Errorf("%s (--force %s anyway)", msg, does)
}

// closest is the key nearest to name by edit distance, if it is near
// enough to be a typo of it (at most 2 edits, fewer than name's length).
func closest(name string, keys []string) string {
	best, bestD := "", 3
	for _, k := range keys {
		if d := keyspace.EditDistance(strings.ToLower(name), strings.ToLower(k)); d < bestD && d < len(name) {
			best, bestD = k, d
		}
	}
	return best
}

// negativeArgError is a flag error function that reports an argument such
// as -5s, which pflag reads as the shorthand flags -5 and -s, as the
// negative value it is ("suspend: duration -5s must be > 0"); what names
// the argument ("duration "). Other flag errors are usage errors as they are.
func negativeArgError(what string) func(*cobra.Command, error) error {
	return func(cmd *cobra.Command, err error) error {
		// pflag's *NotExistError; no flag of this command is a digit.
		var unknown interface{ GetSpecifiedShortnames() string }
		if errors.As(err, &unknown) {
			if s := unknown.GetSpecifiedShortnames(); s != "" && '0' <= s[0] && s[0] <= '9' {
				return usagef("%s: %s-%s must be > 0", cmd.Name(), what, s)
			}
		}
		return usageError{err}
	}
}
