package dashboard

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The numbers docs/operating.md states about the web view are the code's:
// how many keys it shows and how often it asks (issue 35, item 2).
func TestOperatingDocStatesTheWebViewDefaults(t *testing.T) {
	b, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(b)), " ")
	if defaultPollInterval != time.Second {
		t.Fatalf("the docs say every second; the poll is %v", defaultPollInterval)
	}
	for _, says := range []string{
		"it asks a JSON endpoint every second",
		fmt.Sprintf("show at most %d and", defaultMaxKeys),
	} {
		if !strings.Contains(text, says) {
			t.Errorf("docs/operating.md does not say %q", says)
		}
	}
}
