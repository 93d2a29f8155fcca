package validate

// Alert rules checked with promtool against series as the proxy exports them,
// beside TestAlertRulesUnit (prometheusrule_test.go).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAlertRulesEdgeCases runs testdata/alert_edges_test.yaml with `promtool test rules`
// against the rules rendered from the default values, as TestAlertRulesUnit runs
// testdata/alerts_test.yaml: IdemproxyUnknownOutcomes fires for an {outcome="unknown"}
// series the proxy creates at its first refusal (so Prometheus first sees it at 1, not 0),
// and IdemproxyStoreErrors stays quiet when Redis is fine and the upstream itself answers 503.
func TestAlertRulesEdgeCases(t *testing.T) {
	src, err := os.ReadFile("testdata/alert_edges_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	promtool(t)
	dir := t.TempDir()
	writeRuleFile(t, dir, alertRules(t))
	if err := os.WriteFile(filepath.Join(dir, "alert_edges_test.yaml"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, dir, "test", "rules", "alert_edges_test.yaml"))
}

// TestRedisOutagePages: Redis goes down for good at minute 10. Every pod's /readyz
// fails within seconds (idemproxy_ready 1 -> 0, once), Kubernetes takes the pods out of the
// Service, and from then on no request reaches idemproxy: the clients get the ingress's own
// errors, which idemproxy never counts. What idemproxy did count is a short burst of
// store_error outcomes and 503s, in series the proxy creates at that first store error
// (CounterVec label sets appear at their first increment), so Prometheus first sees them at
// their final value and rate() is 0. Then nothing changes for the rest of the outage:
//   - IdemproxyStoreErrors: rate(store_error) is 0, later 0/0;
//   - IdemproxyReadinessFlapping: idemproxy_ready changed once (a flap needs two changes);
//   - the others watch other signals.
//
// So, with only those alerts, a complete Redis outage, the failure the proxy exists to
// survive, paged nobody. The test asks promtool whether every rendered alert stays quiet at
// minutes 20 and 30 (15 and 25 minutes into the outage) and fails when they all do: an alert
// on the outage (such as idemproxy_ready == 0 for some minutes) makes promtool report a
// firing alert, and the test pass.
func TestRedisOutagePages(t *testing.T) {
	pr := alertRules(t)
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	blank := strings.TrimSpace(strings.Repeat("_ ", 10))
	series := [][2]string{
		{`idemproxy_requests_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a", route="/v1/payments/*", outcome="executed", key_source="header"}`, "0+100x9 1000x30"},
		{`idemproxy_requests_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a", route="/v1/payments/*", outcome="store_error", key_source="header"}`, blank + " 40x30"},
		{`idemproxy_responses_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a", route="/v1/payments/*", code="201"}`, "0+100x9 1000x30"},
		{`idemproxy_responses_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a", route="/v1/payments/*", code="503"}`, blank + " 40x30"},
		{`idemproxy_ready{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "1x9 0x30"},
		{`idemproxy_store_unsafe{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "0x40"},
		{`idemproxy_double_executions_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "0x40"},
		{`idemproxy_record_failures_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "0x40"},
		{`idemproxy_unknown_outcomes_total{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a", cause="upstream_timeout"}`, "0x40"},
		{`process_start_time_seconds{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "1700000000x40"},
		{`up{job="idemproxy", namespace="idem-test", pod="idem-idemproxy-a"}`, "1x40"},
	}
	var b strings.Builder
	b.WriteString("rule_files:\n  - rules.yaml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n")
	for _, s := range series {
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", s[0], s[1])
	}
	b.WriteString("    alert_rule_test:\n")
	for _, at := range []string{"20m", "30m"} {
		for _, a := range alerts {
			fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts: []\n", at, a)
		}
	}
	bin := promtool(t)
	dir := t.TempDir()
	writeRuleFile(t, dir, pr)
	if err := os.WriteFile(filepath.Join(dir, "outage_test.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "test", "rules", "outage_test.yaml")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("promtool: %v", err)
	}
	if err == nil {
		t.Errorf("Redis down and every pod not ready for 10 and 20 minutes: none of %v fires (promtool found every one quiet):\n%s", alerts, out.String())
		return
	}
	if !strings.Contains(out.String(), "got:[") {
		t.Fatalf("promtool failed for another reason:\n%s", out.String())
	}
	t.Logf("an alert fires:\n%s", out.String())
}
