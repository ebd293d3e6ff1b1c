package metrics

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// listed returns the label values a metric's help text lists in
// parentheses after word: "by error class (timeout, connection, ...)".
func listed(t *testing.T, d *prometheus.Desc, word string) []string {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(word) + ` \(([a-z_, ]+)\)`).FindStringSubmatch(d.String())
	require.NotNil(t, m, "the help of %s lists no %s", d, word)
	out := strings.Split(m[1], ", ")
	sort.Strings(out)
	return out
}

// The help texts list the values their labels take, and the code holds the
// same lists: each is compared with its source.
func TestHelpListsTheLabelValuesTheCodeUses(t *testing.T) {
	d := newDescs()

	var outcomes []string
	for o := throttle.Outcome(0); !strings.HasPrefix(o.String(), "Outcome("); o++ {
		if o != throttle.Unsettled { // (no decision: settlements_failed_total)
			outcomes = append(outcomes, o.String())
		}
	}
	sort.Strings(outcomes)
	assert.Equal(t, outcomes, listed(t, d.decisions, "outcome"), "decisions_total's outcomes")

	reasons := []string{"failure_policy"} // deferred by the failure policy, no Reason
	for r := throttle.Reason(1); !strings.HasPrefix(r.String(), "Reason("); r++ {
		reasons = append(reasons, reasonLabel(r))
	}
	sort.Strings(reasons)
	assert.Equal(t, reasons, listed(t, d.deferrals, "reason"), "deferrals_total's reasons")

	// The error classes: the class* constants of errors.go.
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errors.go", nil, 0)
	require.NoError(t, err)
	var classes []string
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && strings.HasPrefix(vs.Names[0].Name, "class") {
			s, err := strconv.Unquote(vs.Values[0].(*ast.BasicLit).Value)
			require.NoError(t, err)
			classes = append(classes, s)
		}
		return true
	})
	sort.Strings(classes)
	assert.Equal(t, classes, listed(t, d.redisErrors, "error class"), "redis_errors_total's classes")
}

// Only the tenant gauges, read from Inspect (at most 100 tenants per key),
// have a tenant label: the decision counters, kept per process for every
// event, must not grow a series per tenant.
func TestOnlyTheTenantGaugesHaveATenantLabel(t *testing.T) {
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	var withTenant []string
	for _, d := range newDescs().all() {
		m := labels.FindStringSubmatch(d.String())
		require.NotNil(t, m, "labels of %s", d)
		for _, l := range strings.Split(m[1], ",") {
			if strings.TrimSpace(l) == "tenant" {
				withTenant = append(withTenant, name.FindStringSubmatch(d.String())[1])
			}
		}
	}
	sort.Strings(withTenant)
	assert.Equal(t, []string{"asynq_throttle_tenant_admitted", "asynq_throttle_tenant_backlog", "asynq_throttle_tenant_share"}, withTenant)
}

// The unit label goes with the tier label, on the per-tier gauges only:
// a key's tiers are at most 8, each in one unit, so it adds no series; on
// any other metric it would multiply them.
func TestTheUnitLabelGoesWithTheTierLabel(t *testing.T) {
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	var withTier, withUnit []string
	for _, d := range newDescs().all() {
		m := labels.FindStringSubmatch(d.String())
		require.NotNil(t, m, "labels of %s", d)
		for _, l := range strings.Split(m[1], ",") {
			switch strings.TrimSpace(l) {
			case "tier":
				withTier = append(withTier, name.FindStringSubmatch(d.String())[1])
			case "unit":
				withUnit = append(withUnit, name.FindStringSubmatch(d.String())[1])
			}
		}
	}
	sort.Strings(withTier)
	sort.Strings(withUnit)
	assert.Equal(t, []string{"asynq_throttle_limit_burst", "asynq_throttle_limit_period_seconds", "asynq_throttle_limit_rate",
		"asynq_throttle_limit_rate_in_force", "asynq_throttle_tokens"}, withUnit)
	assert.Equal(t, withTier, withUnit)
}

// The numbers docs/operating.md states about the metrics are the code's:
// the key label's cap and the scrape's deadline (issue 35, item 2).
func TestOperatingDocStatesTheMetricsDefaults(t *testing.T) {
	b, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(b)), " ")
	for _, says := range []string{
		fmt.Sprintf("`metrics.WithMaxKeys` values (default %d)", defaultMaxKeys),
		fmt.Sprintf("key labels (default %d)", defaultMaxKeys),
		fmt.Sprintf("(`WithScrapeTimeout`, %d s)", int(defaultScrapeTimeout.Seconds())),
		fmt.Sprintf("and %d keys", defaultMaxKeys),
	} {
		if !strings.Contains(text, says) {
			t.Errorf("docs/operating.md does not say %q", says)
		}
	}
}
