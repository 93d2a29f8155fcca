package main

import (
	"strings"
	"testing"
)

// TestReview12HoldWithFailOpenIsNamed: ON_UNKNOWN=hold promises "never
// execute again without an operator"; FAIL_MODE=open (or a route's fail=open)
// forwards every request while Redis is unreachable, retries of held keys
// included, which then execute again. The two are accepted together
// without a word about it: the generic FAIL_MODE=open warning does not say
// that it voids hold, and a route combining unknown=hold with fail=open
// gets no warning at all (only FAIL_MODE is looked at). Config values are
// to be validated against each other: refuse the combination, or at least
// warn naming both (as LOCK_TTL against UPSTREAM_TIMEOUT is).
func TestReview12HoldWithFailOpenIsNamed(t *testing.T) {
	for name, env := range map[string][]string{
		"global": {"ON_UNKNOWN=hold", "FAIL_MODE=open"},
		"route":  {"ROUTES=POST /v1/payments/* unknown=hold fail=open"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := loadConfig(append([]string{"UPSTREAM_URL=http://127.0.0.1:9000"}, env...))
			if err != nil {
				if strings.Contains(err.Error(), "hold") {
					return // refused, naming hold: fine
				}
				t.Fatalf("refused without naming hold: %v", err)
			}
			all := strings.Join(cfg.warnings, "\n")
			if !strings.Contains(all, "hold") {
				t.Errorf("%v: warnings %q; want one saying that fail open voids ON_UNKNOWN=hold/unknown=hold while Redis is unreachable", env, cfg.warnings)
			}
		})
	}
}
