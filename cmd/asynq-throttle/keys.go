package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/internal/rules"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func (a *app) listCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every key in Redis with its limits, tokens, slots in flight, suspension and reservations",
		Long: `List every limiter key that has anything in Redis (limits, bucket state, a
suspension or reservations), from the index of the limiter's keys (the
first listing of a Redis written by an older version walks it once with
SCAN, never KEYS): the keys with limits of their own first, then the
others, each by name. A key that cannot be read (invalid limits, a Redis
key of the wrong type under the prefix) shows its error; the rest are
listed.
TOKENS shows, per rate limit in the order of LIMITS, a bucket's tokens
now/burst and a window's calls it would still admit/calls per window; on a
key with tiers in other units than requests each names its unit
("499.0/500 requests, 18000.0/30000 tokens"). "(for the queue)" after them
says that tasks hold reservations: the tokens are promised to those tasks,
in order, and a task without a reservation waits behind them.
IN FLIGHT is the slots of an in-flight limit held now/the most. DRAINS IN
is the time until the last reserved run time. GEN counts the changes of the
key's limits: every set bumps it.`,
		Args: args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			keys, err := lim.Keys(cmd.Context())
			if err != nil {
				return err
			}
			views, err := readKeys(cmd.Context(), lim, keys)
			if err != nil {
				return err
			}
			if a.json() {
				return writeJSON(a.stdout, views)
			}
			if len(views) == 0 {
				_, err := fmt.Fprintf(a.stdout, "no keys under prefix %q\n", a.prefix)
				return err
			}
			return writeTable(a.stdout, views)
		},
	}
}

func (a *app) getCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show one key: limits, tokens per tier, slots in flight, suspension, reservations",
		Long: `Show one key. A key with nothing in Redis (no limits, no state: list does
not show it) is an error naming the closest key, unless --force.`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := throttle.ValidateKey(args[0]); err != nil {
				return usageError{err}
			}
			if _, err := a.knownLimiter(cmd.Context(), args[0], force, "shows it"); err != nil {
				return err
			}
			return a.show(cmd, args[0])
		},
	}
	forceFlag(cmd, &force, "show it")
	return cmd
}

// show prints one key as get does (the write commands show the result).
func (a *app) show(cmd *cobra.Command, key string) error {
	lim, err := a.limiter(cmd.Context())
	if err != nil {
		return err
	}
	views, err := readKeys(cmd.Context(), lim, []string{key})
	if err != nil {
		return err
	}
	if a.json() {
		return writeJSON(a.stdout, views[0])
	}
	return writeBlock(a.stdout, views[0])
}

func (a *app) setCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "set KEY LIMIT...",
		Short: "Set a key's limits (every worker obeys them from its next decision)",
		Long: `Set a key's limits, replacing any before them. A task runs only when every
limit admits it: a token from every bucket, room in every window, and a
slot of the in-flight limit. Each LIMIT is one of:

  RATE/PERIOD[:burst=N]  a token bucket: RATE per PERIOD, at most N at once (default RATE)
  RATE/PERIOD:window     at most RATE calls in any sliding PERIOD, whatever its phase
                         (a provider's "5000 per hour")
  RATE/PERIOD:fixed      at most RATE calls in each PERIOD of the clock (UTC), for a
                         provider that resets its count on the minute or the hour
  N:inflight             at most N of the key's tasks running at once, fleet-wide
  PERIOD:adaptive        rates halved on each 429 suspension, won back every clean PERIOD

A bucket or window counts requests (a task takes its cost, 1 without one),
or, with a unit last, another unit: 30000/m:tokens, 30000/m:burst=2000:tokens,
100/m:window:tokens. A task takes from a unit's tiers what it says it uses
of it (throttle.Uses). A unit is 1 to 32 of a-z, 0-9, _ and -, starting with
a letter; "requests" is the default. A word within two edits of a
modifier's name (windwo, fixd) is refused as a typo, not taken for a unit.

PERIOD is s, m, h, d or a duration such as 1500ms, 10s, 2m. Up to 8 buckets
and windows, one in-flight and one adaptive limit.`,
		Example: `  asynq-throttle set slack 10/s 50/m
  asynq-throttle set github 5000/h:window 10/s:burst=20
  asynq-throttle set stripe 25/s 4:inflight
  asynq-throttle set crm 100/1500ms
  asynq-throttle set openai:gpt-4o 500/m 30000/m:tokens 16:inflight   # requests and tokens per minute
  asynq-throttle set anthropic 50/m 40000/m:input-tokens 8000/m:output-tokens`,
		Args: args(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := throttle.ValidateKey(key); err != nil {
				return usageError{err}
			}
			limits, err := parseLimits(args[1:])
			if err != nil {
				return err
			}
			lim, err := a.limiter(cmd.Context())
			if err != nil {
				return err
			}
			if err := lim.SetLimits(cmd.Context(), key, limits...); err != nil {
				if isInvalidLimit(err) {
					return usageError{err}
				}
				return err
			}
			return a.show(cmd, key)
		},
	}
}

func (a *app) suspendCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "suspend KEY DURATION",
		Short: "Stop every worker from running a key's tasks for DURATION (e.g. 30s, 5m)",
		Long: fmt.Sprintf(`Suspend a key fleet-wide: every worker defers its tasks until the suspension
ends. A suspension only ever grows: suspending for less than what is left
changes nothing (resume first to shorten). At most %v. A key with nothing
in Redis (no limits, no state) is refused as a likely typo, unless --force
(a key limited only by the workers' default limits).`, 24*time.Hour),
		Example: "  asynq-throttle suspend slack 30s",
		Args:    args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := throttle.ValidateKey(key); err != nil {
				return usageError{err}
			}
			d, err := time.ParseDuration(args[1])
			if err != nil {
				return usagef("duration %q: want a positive Go duration such as 30s, 5m, 1h30m", args[1])
			}
			if d <= 0 {
				return usagef("suspend: duration %s must be > 0", args[1])
			}
			if d > a.maxSuspension {
				return usagef("duration %s: at most %s", args[1], rules.FormatWords(a.maxSuspension))
			}
			lim, err := a.knownLimiter(cmd.Context(), key, force, "suspends it")
			if err != nil {
				return err
			}
			if err := lim.Suspend(cmd.Context(), key, d); err != nil {
				return err
			}
			return a.show(cmd, key)
		},
	}
	// suspend slack -5s: pflag takes -5s for flags.
	cmd.SetFlagErrorFunc(negativeArgError("duration "))
	forceFlag(cmd, &force, "suspend it")
	return cmd
}

func (a *app) resumeCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "resume KEY",
		Short: "End a key's suspension now",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := throttle.ValidateKey(args[0]); err != nil {
				return usageError{err}
			}
			lim, err := a.knownLimiter(cmd.Context(), args[0], force, "resumes it")
			if err != nil {
				return err
			}
			if _, err := lim.Resume(cmd.Context(), args[0]); err != nil {
				return err
			}
			return a.show(cmd, args[0])
		},
	}
	forceFlag(cmd, &force, "resume it")
	return cmd
}

func (a *app) deleteCmd() *cobra.Command {
	var yes, force bool
	cmd := &cobra.Command{
		Use:   "delete KEY",
		Short: "Remove everything of a key from Redis: limits, bucket, suspension, reservations",
		Long: `Remove everything of a key from Redis. Its tasks then run under the workers'
default limits for it, or unthrottled without any. It shows the key and asks
for confirmation (y or yes) on the terminal; --yes skips the question, and
without a terminal on stdin it refuses unless --yes. A key with nothing in
Redis is refused as a likely typo, unless --force.`,
		Example: `  asynq-throttle delete slack
  asynq-throttle delete slack --yes   # in a script`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := throttle.ValidateKey(key); err != nil {
				return usageError{err}
			}
			if !yes && !isTerminal(a.stdin) {
				return usagef("delete: no terminal on stdin to confirm on: pass --yes to delete %s without confirmation", key)
			}
			lim, err := a.knownLimiter(cmd.Context(), key, force, "deletes it")
			if err != nil {
				return err
			}
			if !yes {
				ok, err := a.confirmDelete(cmd.Context(), lim, key)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("delete: not confirmed; %s is unchanged", key)
				}
			}
			if err := lim.Delete(cmd.Context(), key); err != nil {
				return err
			}
			if a.json() {
				return writeJSON(a.stdout, map[string]any{"key": key, "deleted": true})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted %s\n", key)
			return err
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking for confirmation")
	forceFlag(cmd, &force, "delete it")
	return cmd
}

// confirmDelete shows key as get does and asks on stderr whether to delete
// it; it reports whether the answer read from stdin is y or yes. An
// interrupt ends the wait (the signal only cancels ctx).
func (a *app) confirmDelete(ctx context.Context, lim *throttle.Limiter, key string) (bool, error) {
	views, err := readKeys(ctx, lim, []string{key})
	if err != nil {
		return false, err
	}
	if err := writeBlock(a.stderr, views[0]); err != nil {
		return false, err
	}
	fmt.Fprintf(a.stderr, "Delete %s from Redis: its limits, bucket, suspension and reservations? [y/N] ", key)
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(a.stdin).ReadString('\n')
		answer <- line
	}()
	select {
	case line := <-answer:
		if !strings.HasSuffix(line, "\n") {
			fmt.Fprintln(a.stderr) // stdin closed: end the prompt's line
		}
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "y", "yes":
			return true, nil
		}
		return false, nil
	case <-ctx.Done():
		fmt.Fprintln(a.stderr)
		return false, fmt.Errorf("delete: interrupted; %s is unchanged", key)
	}
}
