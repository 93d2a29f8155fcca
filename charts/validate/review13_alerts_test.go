package validate

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReview13AlertRules runs testdata/review13_alerts_test.yaml with `promtool test rules`
// against the rules rendered from the default values.
func TestReview13AlertRules(t *testing.T) {
	src, err := os.ReadFile("testdata/review13_alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	promtool(t)
	dir := t.TempDir()
	writeRuleFile(t, dir, alertRules(t))
	if err := os.WriteFile(filepath.Join(dir, "review13_alerts_test.yaml"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, dir, "test", "rules", "review13_alerts_test.yaml"))
}
