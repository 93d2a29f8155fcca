package validate

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// prometheusRule is the subset of the Prometheus Operator's monitoring.coreos.com/v1
// PrometheusRule that the chart renders, written out by hand like serviceMonitor (field names
// and JSON tags as in prometheus-operator pkg/apis/monitoring/v1/prometheusrule_types.go).
// Its spec has the shape of a Prometheus rule file, so it is also what promtool reads.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ruleFile `json:"spec"`
}

type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// operatorDuration is the pattern of the operator's Duration type (for, interval).
var operatorDuration = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

// matchersRE finds the label matchers of each series selector in an expression.
var matchersRE = regexp.MustCompile(`[a-z_]+\{([^}]*)\}`)

// wantAlerts are the alerts the chart ships, each documented under a heading of its name in docs/runbook.md.
var wantAlerts = []string{
	"IdemproxyHighTakeoverRate", "IdemproxyDoubleExecution", "IdemproxyRecordFailures", "IdemproxyStoreErrors",
	"IdemproxyStoreUnsafe", "IdemproxyUnknownOutcomes", "IdemproxyNotReady", "IdemproxyReadinessFlapping",
	"IdemproxyBufferFull", "IdemproxyReplayCacheOff",
}

const defaultRunbookBase = "https://github.com/idemproxy/idemproxy/blob/main/docs/runbook.md"

// alertRules renders the chart with the PrometheusRule enabled (and extra arguments) and
// returns the one PrometheusRule.
func alertRules(t *testing.T, args ...string) *prometheusRule {
	t.Helper()
	m := mustRender(t, append([]string{"--set", "prometheusRule.enabled=true"}, args...)...)
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.prometheusRules))
	}
	return m.prometheusRules[0]
}

// TestPrometheusRuleOffByDefault: no PrometheusRule unless asked for.
func TestPrometheusRuleOffByDefault(t *testing.T) {
	if m := mustRender(t); len(m.prometheusRules) != 0 {
		t.Errorf("default values render %d PrometheusRules, want none", len(m.prometheusRules))
	}
}

// TestPrometheusRuleShape checks the rendered rule with the default values: every alert is
// there once, with a severity, summary, description and runbook_url under the default base,
// valid durations, and the default selector (the ServiceMonitor's job, the release namespace)
// in every expression.
func TestPrometheusRuleShape(t *testing.T) {
	pr := alertRules(t)
	if pr.Namespace != namespace {
		t.Errorf("namespace = %q, want the release namespace %q", pr.Namespace, namespace)
	}
	if !labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "idemproxy", "app.kubernetes.io/instance": releaseName}).Matches(labels.Set(pr.Labels)) {
		t.Errorf("labels %v lack the chart's selector labels", pr.Labels)
	}
	checkRuleFile(t, pr, `job="idemproxy", namespace="`+namespace+`"`, defaultRunbookBase, nil)
}

// TestPrometheusRuleValues checks every prometheusRule.* value of ci/alerts-values.yaml
// reaches the rendered rule.
func TestPrometheusRuleValues(t *testing.T) {
	m := mustRender(t, "-f", chartDir+"/ci/alerts-values.yaml")
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.prometheusRules))
	}
	pr := m.prometheusRules[0]
	if pr.Namespace != "monitoring" || pr.Labels["release"] != "kube-prometheus-stack" || pr.Annotations["owner"] != "payments" {
		t.Errorf("metadata = %s %v %v, want namespace monitoring, label release, annotation owner", pr.Namespace, pr.Labels, pr.Annotations)
	}
	if g := pr.Spec.Groups; len(g) != 1 || g[0].Interval != "30s" {
		t.Errorf("groups = %+v, want one with interval 30s", g)
	}
	checkRuleFile(t, pr, `job="idemproxy", namespace="payments", cluster="eu-1"`,
		"https://git.example.com/mirror/idemproxy/blob/v0.1.0/docs/runbook.md", map[string]string{"team": "payments"})
	want := map[string][]string{
		"IdemproxyHighTakeoverRate":  {"> 0.1\n"},
		"IdemproxyStoreErrors":       {") > 0.05\n"},
		"IdemproxyReadinessFlapping": {">= 3\n"},
	}
	wantFor := map[string]string{"IdemproxyHighTakeoverRate": "30m", "IdemproxyStoreErrors": "2m", "IdemproxyStoreUnsafe": "1h",
		"IdemproxyNotReady": "10m", "IdemproxyReplayCacheOff": "30m"}
	for _, r := range pr.Spec.Groups[0].Rules {
		for _, s := range want[r.Alert] {
			if !strings.Contains(r.Expr, s) {
				t.Errorf("%s expr does not contain %q:\n%s", r.Alert, s, r.Expr)
			}
		}
		if f, ok := wantFor[r.Alert]; ok && r.For != f {
			t.Errorf("%s for = %q, want %q", r.Alert, r.For, f)
		}
	}
}

// checkRuleFile checks what must hold of every rendered rule file.
func checkRuleFile(t *testing.T, pr *prometheusRule, selector, runbookBase string, extraLabels map[string]string) {
	t.Helper()
	var got []string
	for _, g := range pr.Spec.Groups {
		if g.Interval != "" && !operatorDuration.MatchString(g.Interval) {
			t.Errorf("group %s interval %q is not an operator Duration", g.Name, g.Interval)
		}
		for _, r := range g.Rules {
			got = append(got, r.Alert)
			if r.For != "" && !operatorDuration.MatchString(r.For) {
				t.Errorf("%s: for %q is not an operator Duration", r.Alert, r.For)
			}
			if !slices.Contains([]string{"warning", "critical"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, r.Labels["severity"])
			}
			for k, v := range extraLabels {
				if r.Labels[k] != v {
					t.Errorf("%s: label %s = %q, want %q", r.Alert, k, r.Labels[k], v)
				}
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			if want := runbookBase + "#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url = %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			// Every series the expression reads carries the selector.
			for _, sel := range matchersRE.FindAllStringSubmatch(r.Expr, -1) {
				if !strings.HasPrefix(sel[1], selector) {
					t.Errorf("%s: matchers {%s} do not start with the selector %s", r.Alert, sel[1], selector)
				}
			}
		}
	}
	if !slices.Equal(got, wantAlerts) {
		t.Errorf("alerts = %v, want %v", got, wantAlerts)
	}
}

// TestRunbookAnchors checks every runbook_url of the default render lands on a heading of
// docs/runbook.md, with GitHub's anchor rules.
func TestRunbookAnchors(t *testing.T) {
	readme, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := githubAnchors(string(readme))
	for _, r := range alertRules(t).Spec.Groups[0].Rules {
		url := r.Annotations["runbook_url"]
		_, anchor, ok := strings.Cut(url, "#")
		if !ok || !strings.HasPrefix(url, defaultRunbookBase+"#") {
			t.Errorf("%s: runbook_url %q is not %s#<anchor>", r.Alert, url, defaultRunbookBase)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("%s: runbook_url anchor #%s is not a heading of docs/runbook.md", r.Alert, anchor)
		}
	}
}

// githubAnchors returns the anchors GitHub gives the Markdown headings of doc: lower case,
// spaces to '-', punctuation other than '-' and '_' dropped, "-1", "-2"... on repeats.
// Fenced code blocks are skipped.
func githubAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		m := regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`).FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// promtool returns $PROMTOOL, else promtool from PATH. Missing, it fails the test in CI
// (CI=true) and skips it elsewhere, naming install-promtool.sh.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	msg := "promtool not found on PATH and $PROMTOOL is not set: run charts/validate/install-promtool.sh " +
		"and put its output in $PROMTOOL (`make chart-test` does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// runPromtool runs promtool in dir and fails the test with its output when it fails.
func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// writeRuleFile writes the spec of the rendered PrometheusRule into dir as a Prometheus rule
// file, rules.yaml, which is what testdata/alerts_test.yaml loads.
func writeRuleFile(t *testing.T, dir string, pr *prometheusRule) {
	t.Helper()
	b, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAlertRulesPromtool checks the rendered rules with `promtool check rules`, for the default
// values and for ci/alerts-values.yaml.
func TestAlertRulesPromtool(t *testing.T) {
	promtool(t)
	for _, tc := range []valuesCase{{name: "default"}, {name: "alerts-values.yaml", args: []string{"-f", chartDir + "/ci/alerts-values.yaml"}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeRuleFile(t, dir, alertRules(t, tc.args...))
			t.Log(runPromtool(t, dir, "check", "rules", "rules.yaml"))
		})
	}
}

// alertTests is the part of a promtool unit test file that the coverage check reads.
type alertTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRulesUnit runs testdata/alerts_test.yaml with `promtool test rules` against the
// rules rendered from the default values (rules.yaml beside a copy of the test file), after
// checking that the file tests every alert both firing and not firing.
func TestAlertRulesUnit(t *testing.T) {
	src, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(src, &tests); err != nil { // promtool itself reads it strictly
		t.Fatal(err)
	}
	if !slices.Equal(tests.RuleFiles, []string{"rules.yaml"}) {
		t.Fatalf("rule_files = %v, want [rules.yaml]: the rendered rules, not a copy", tests.RuleFiles)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, a := range wantAlerts {
		if !fires[a] {
			t.Errorf("testdata/alerts_test.yaml has no case where %s fires", a)
		}
		if !quiet[a] {
			t.Errorf("testdata/alerts_test.yaml has no case where %s stays quiet (exp_alerts empty)", a)
		}
	}

	promtool(t) // skips here, after the coverage check, when promtool is missing outside CI
	dir := t.TempDir()
	writeRuleFile(t, dir, alertRules(t))
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, dir, "test", "rules", "alerts_test.yaml"))
}

func TestGitHubAnchors(t *testing.T) {
	doc := "# idemproxy\n## Operating it\n### `ROUTES`\n```sh\n# not a heading\n```\n" +
		"## When something goes wrong\n### IdemproxyStoreErrors\n## Operating it\n### Store errors / 503 (fail-closed)\n"
	got := githubAnchors(doc)
	for _, a := range []string{"idemproxy", "operating-it", "routes", "when-something-goes-wrong", "idemproxystoreerrors", "operating-it-1", "store-errors--503-fail-closed"} {
		if !got[a] {
			t.Errorf("no anchor %q in %v", a, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a fenced block became an anchor")
	}
}
