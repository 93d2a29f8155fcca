package validate

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The IdemproxyReplayCacheOff alert (added in e5c29b6) and the
// prometheusRule values around it: left null, missing, or set.

// TestReplayCacheOffForLeftNull: prometheusRule.replayCacheOffFor left null
// (--set ...=null, -f with the key empty, or `helm upgrade --reuse-values` from the chart
// before e5c29b6, whose values lack the key; Helm then renders with the old chart's values)
// must render the alert with its 15m default, or refuse the render. On e5c29b6 it renders
// `for: ` (null): Prometheus reads no `for`, so the warning fires at the first scrape of a 0
// (every Redis blip, every slow start), and the description says "off for : its ...".
func TestReplayCacheOffForLeftNull(t *testing.T) {
	emptyKey := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(emptyKey, []byte("prometheusRule:\n  replayCacheOffFor:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vals := chartValues(t)
	old := regexp.MustCompile(`(?m)^  replayCacheOffFor: .*\n`).ReplaceAll(vals, nil)
	if len(old) == len(vals) {
		t.Fatal("values.yaml: no replayCacheOffFor line to drop")
	}
	oldChart := chartWithValues(t, old)
	for _, tc := range []struct {
		name  string
		chart string
		args  []string
	}{
		{"--set null", chartDir, []string{"--set", "prometheusRule.replayCacheOffFor=null"}},
		{"-f with the key left empty", chartDir, []string{"-f", emptyKey}},
		{"upgrade --reuse-values from a chart without it", oldChart, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", releaseName, tc.chart, "--namespace", namespace, "--set", "prometheusRule.enabled=true"}, tc.args...)
			out, err := exec.Command(helmBinary(t), args...).CombinedOutput()
			if err != nil {
				return // refused with a message: acceptable
			}
			m := decodeAll(t, string(out))
			for _, r := range m.prometheusRules[0].Spec.Groups[0].Rules {
				if r.Alert != "IdemproxyReplayCacheOff" {
					continue
				}
				if r.For != "15m" {
					t.Errorf("IdemproxyReplayCacheOff for = %q, want the default 15m (empty: it fires at the first 0 scraped)", r.For)
				}
				if d := r.Annotations["description"]; strings.Contains(d, "off for :") || strings.Contains(d, "<nil>") {
					t.Errorf("description: %q", d)
				}
			}
		})
	}
}

// TestPrometheusRuleKeysMissing: the same for every prometheusRule key (pre-existing
// for all but replayCacheOffFor): `helm upgrade --reuse-values --set prometheusRule.enabled=true`
// from a chart version without the key renders the same rules as the defaults, or refuses.
// Empty thresholds render `> ` (an expression Prometheus refuses: the operator drops the whole
// PrometheusRule, every idemproxy alert with it), an empty runbookBaseURL "#anchor".
func TestPrometheusRuleKeysMissing(t *testing.T) {
	vals := chartValues(t)
	keys := blockKeys(t, vals, "prometheusRule")
	want, err := json.Marshal(alertRules(t).Spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if key == "enabled" {
			continue
		}
		t.Run(key, func(t *testing.T) {
			dir := chartWithValues(t, withoutKey(t, vals, "prometheusRule", key))
			out, err := exec.Command(helmBinary(t), "template", releaseName, dir, "--namespace", namespace,
				"--set", "prometheusRule.enabled=true").CombinedOutput()
			if err != nil {
				return // refused at render, with a message
			}
			m := decodeAll(t, string(out))
			got, err := json.Marshal(m.prometheusRules[0].Spec)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("prometheusRule.%s missing: the rules differ from the defaults' (%s)", key, firstDiff(string(want), string(got)))
			}
		})
	}
}

// firstDiff shows where two renders part.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-60)
	return "default …" + a[lo:min(len(a), i+40)] + "… vs …" + b[lo:min(len(b), i+40)] + "…"
}

// TestAlertsValuesSetEveryKey: ci/alerts-values.yaml says it is "the PrometheusRule
// with every override set", and TestPrometheusRuleValues relies on it to see each value reach
// the rules; notReadyFor (pre-existing) and replayCacheOffFor (e5c29b6) are not in it.
func TestAlertsValuesSetEveryKey(t *testing.T) {
	vals := chartValues(t)
	ci, err := os.ReadFile(filepath.Join(chartDir, "ci", "alerts-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var civ struct {
		PrometheusRule map[string]any `json:"prometheusRule"`
	}
	if err := yaml.Unmarshal(ci, &civ); err != nil {
		t.Fatal(err)
	}
	for _, k := range blockKeys(t, vals, "prometheusRule") {
		if _, ok := civ.PrometheusRule[k]; !ok {
			t.Errorf("ci/alerts-values.yaml does not set prometheusRule.%s", k)
		}
	}
}

// TestAlertLabelsSeverity (pre-existing, every alert): alertLabels with a severity
// key renders each rule with two `severity:` keys; strict decoding (the API server with
// fieldValidation=Strict) refuses it, a lenient one keeps whichever comes last. The schema
// should refuse the key, or the template should let it win once.
func TestAlertLabelsSeverity(t *testing.T) {
	out, err := render(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.alertLabels.severity=page")
	if err != nil {
		return // refused: acceptable
	}
	for _, doc := range splitDocuments(t, out) {
		if _, tm, err := decodeStrict(doc); err != nil && tm.Kind == "PrometheusRule" {
			t.Errorf("alertLabels.severity renders a PrometheusRule the API server's strict validation refuses: %v", err)
		}
	}
}

// TestReplayCacheOnPanelThresholds: the gauge's panel marks 1 (cache on) red and 0
// green, the reverse of its sibling "Ready per pod" (red base, green from 1). Latent while
// thresholdsStyle is off, wrong as soon as anyone turns it on.
func TestReplayCacheOnPanelThresholds(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "idemproxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title       string `json:"title"`
			FieldConfig struct {
				Defaults struct {
					Thresholds struct {
						Steps []struct {
							Color string   `json:"color"`
							Value *float64 `json:"value"`
						} `json:"steps"`
					} `json:"thresholds"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range d.Panels {
		if len(p.Targets) == 0 || !strings.Contains(p.Targets[0].Expr, "idemproxy_replay_cache_on") {
			continue
		}
		found = true
		steps := p.FieldConfig.Defaults.Thresholds.Steps
		if len(steps) == 0 || steps[0].Color != "red" {
			t.Errorf("panel %q: thresholds %+v; want red at the base (0: cache off, the alert's state) and green from 1, as \"Ready per pod\"", p.Title, steps)
		}
	}
	if !found {
		t.Fatal("no panel reads idemproxy_replay_cache_on")
	}
}
