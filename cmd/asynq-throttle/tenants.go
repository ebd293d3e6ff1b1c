package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// maxWeight is the largest weight of a tenant, as throttle's SetWeights
// takes it.
const maxWeight = 1_000_000

// maxActiveShown is the most tenants with work booked that Inspect reads
// (the next in line); more may have work booked.
const maxActiveShown = 100

// tenantView is one tenant of a key (throttle.TenantStatus), in `get` and
// `why`.
type tenantView struct {
	// Name is the tenant; "" is the default tenant (tasks without
	// throttle.Tenant), shown as "(default)".
	Name string `json:"name"`
	// Weight is its weight (weights, SetWeights; 1 when not set).
	Weight int `json:"weight"`
	// Share is the part of the key's rate it gets now, from 0 to 1: its
	// weight over those of the tenants with work booked (0 when it has
	// none booked).
	Share float64 `json:"share"`
	// Backlog is the work it has booked and not yet due, in cost units.
	Backlog float64 `json:"backlog"`
	// Admitted is the work admitted since it last had work booked, in
	// cost units.
	Admitted int64 `json:"admitted"`
}

func newTenantViews(ts []throttle.TenantStatus) []tenantView {
	if len(ts) == 0 {
		return nil
	}
	out := make([]tenantView, len(ts))
	for i, t := range ts {
		out[i] = tenantView{Name: t.Name, Weight: t.Weight, Share: t.Share, Backlog: t.Backlog, Admitted: t.Admitted}
	}
	return out
}

// tenantName shows a tenant's name: "(default)" for the default tenant.
func tenantName(name string) string {
	if name == "" {
		return "(default)"
	}
	return name
}

// formatShare shows a share of the rate as a percentage ("60.0%"), "-"
// for none.
func formatShare(s float64) string {
	switch p := s * 100; {
	case p <= 0:
		return "-"
	case p < 0.1:
		return "<0.1%"
	default:
		return fmt.Sprintf("%.1f%%", p)
	}
}

// activeTenants counts the tenants with work booked among ts, and reports
// whether more have work booked than Inspect read (it reads the 100 next
// in line: their shares then add up to less than the whole rate).
func activeTenants(ts []tenantView) (n int, more bool) {
	sum := 0.0
	for _, t := range ts {
		if t.Share > 0 {
			n++
			sum += t.Share
		}
	}
	return n, n >= maxActiveShown && sum < 0.9999
}

// tenantsSummary is the value of get's "tenants:" line.
func tenantsSummary(ts []tenantView) string {
	n, more := activeTenants(ts)
	switch {
	case more:
		return fmt.Sprintf("more than %d with work booked (the %d next in line shown)", n, n)
	case n == 0:
		return "none with work booked"
	case n == 1:
		return "1 with work booked"
	}
	return fmt.Sprintf("%d with work booked", n)
}

// writeTenants writes a key's tenants under get's block: one row each, in
// Inspect's order (those with work booked, next in line first, then the
// others with a weight set).
func writeTenants(w io.Writer, ts []tenantView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TENANT\tWEIGHT\tSHARE\tBACKLOG\tADMITTED")
	for _, t := range ts {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%.1f\t%d\n", tenantName(t.Name), t.Weight, formatShare(t.Share), t.Backlog, t.Admitted)
	}
	return tw.Flush()
}

func (a *app) weightsCmd() *cobra.Command {
	var force, reset bool
	cmd := &cobra.Command{
		Use:   "weights KEY NAME=WEIGHT...",
		Short: "Set the weights of a key's tenants (their shares of its rate while several wait)",
		Long: fmt.Sprintf(`Set the weights of a key's tenants (the throttle-tenant header, throttle.Tenant),
replacing those set before. While several tenants have tasks waiting on the
key, each gets the key's rate in proportion to its weight; a tenant alone
gets all of it. A tenant not named weighs 1; --reset puts every tenant back
to 1. WEIGHT is a whole number from 1 to %d. Every worker follows the
weights from its next decision. get shows each tenant's weight, share,
backlog and work admitted. A key with nothing in Redis is refused as a
likely typo, unless --force.`, maxWeight),
		Example: `  asynq-throttle weights llm enterprise=3 pro=2
  asynq-throttle weights llm --reset`,
		Args: args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := throttle.ValidateKey(key); err != nil {
				return usageError{err}
			}
			weights, err := parseWeights(args[1:])
			if err != nil {
				return err
			}
			switch {
			case reset && weights != nil:
				return usagef("weights: --reset takes no NAME=WEIGHT (it puts every tenant back to 1)")
			case !reset && weights == nil:
				return usagef("weights: no NAME=WEIGHT given; give some (e.g. %s gold=3), or --reset to put every tenant back to 1", key)
			}
			lim, err := a.knownLimiter(cmd.Context(), key, force, "sets them")
			if err != nil {
				return err
			}
			if err := lim.SetWeights(cmd.Context(), key, weights); err != nil {
				return err
			}
			return a.show(cmd, key)
		},
	}
	cmd.Flags().BoolVar(&reset, "reset", false, "put every tenant of the key back to weight 1")
	forceFlag(cmd, &force, "set them")
	return cmd
}

// parseWeights reads the NAME=WEIGHT arguments of weights (nil for none);
// a bad one is a usage error naming the argument and its field.
func parseWeights(specs []string) (map[string]int, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := make(map[string]int, len(specs))
	seen := make(map[string]string, len(specs))
	for _, s := range specs {
		name, w, ok := strings.Cut(s, "=")
		if !ok {
			return nil, usagef("weights: %q: want NAME=WEIGHT, such as gold=3", s)
		}
		if name == "" {
			return nil, usagef("weights: %q: tenant name: empty (the default tenant weighs 1 and has no name to set)", s)
		}
		if err := throttle.ValidateKey(name); err != nil {
			return nil, usagef("weights: %q: tenant name: %v", s, err)
		}
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 || n > maxWeight {
			return nil, usagef("weights: %q: weight %q: want a whole number from 1 to %d", s, w, maxWeight)
		}
		if first, dup := seen[name]; dup {
			return nil, usagef("weights: tenant %q given twice (%s, %s)", name, first, s)
		}
		seen[name] = s
		out[name] = n
	}
	return out, nil
}

// tenantOfTask is the tenant in a task's headers, and whether it has one.
func tenantOfTask(headers map[string]string) (string, bool) {
	t, ok := headers[keyspace.Tenant]
	return t, ok
}

// withTenant adds to a why answer the task's tenant: its weight, its share
// of the key's rate, its backlog. A task without a tenant is told of only
// when tenants share the key: it then counts as the default tenant.
func (e *explanation) withTenant(v whyView) whyView {
	if v.Reason == reasonRejected || v.Reason == reasonNotThrottled || v.Reason == reasonNotWaiting {
		return v
	}
	ts := newTenantViews(e.st.Tenants)
	active, more := activeTenants(ts)
	if !e.hasTenant && active == 0 {
		return v
	}
	var found *tenantView
	for i := range ts {
		if ts[i].Name == e.tenant {
			found = &ts[i]
			break
		}
	}
	t := tenantView{Name: e.tenant, Weight: 1}
	if found != nil {
		t = *found
	} else if more {
		t.Weight = 0 // not read: unknown
	}
	if !e.hasTenant && (found == nil || found.Share == 0) {
		return v // no tenant, and the default tenant waits for nothing
	}
	v.Tenant = &t

	who := fmt.Sprintf("Its tenant %q (weight %d)", t.Name, t.Weight)
	if !e.hasTenant {
		who = fmt.Sprintf("It counts as the default tenant (no %s header; weight %d), which", keyspace.Tenant, t.Weight)
	}
	var s string
	switch {
	case found == nil && more:
		s = fmt.Sprintf("Its tenant %q is not among the %d tenants next in line on key %q, whose shares add up to less than its whole rate.", t.Name, active, e.key)
	case t.Share <= 0:
		s = fmt.Sprintf("%s has no work booked on key %q now.", who, e.key)
	case active == 1:
		s = fmt.Sprintf("%s gets all of key %q's rate, the only tenant with work booked, and has %.1f cost units booked and not yet due (%d admitted since it last had none).",
			who, e.key, t.Backlog, t.Admitted)
	default:
		s = fmt.Sprintf("%s gets %s of key %q's rate while %d tenants have work booked, and has %.1f cost units booked and not yet due (%d admitted since it last had none).",
			who, formatShare(t.Share), e.key, active, t.Backlog, t.Admitted)
	}
	v.Sentence += " " + s
	return v
}
