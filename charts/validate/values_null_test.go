package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestValuesLeftNull: config.goMemLimitRatio and config.maxBufferedBytes
// left null -- empty in a values file, --set ...=null, or `helm upgrade
// --reuse-values` from a chart version before they existed (Helm then
// renders the new templates with the old chart's values, which lack the
// keys) -- are left out of the ConfigMap, so that the proxy's defaults
// apply, as for a configuration from before the variables. (The ratio used
// to render as "<nil>", which the proxy refuses at start: every new pod of
// the rollout crash-looped; the buffer bound failed the render.)
func TestValuesLeftNull(t *testing.T) {
	emptyKeys := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(emptyKeys, []byte("config:\n  goMemLimitRatio:\n  maxBufferedBytes:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vals := chartValues(t)
	old := regexp.MustCompile(`(?m)^  (goMemLimitRatio|maxBufferedBytes): .*\n`).ReplaceAll(vals, nil)
	if len(vals)-len(old) < len("  maxBufferedBytes: 1\n") {
		t.Fatal("values.yaml: no goMemLimitRatio and maxBufferedBytes lines to drop")
	}
	oldChart := chartWithValues(t, old)
	for _, tc := range []struct {
		name  string
		chart string
		args  []string
	}{
		{"--set null", chartDir, []string{"--set", "config.goMemLimitRatio=null", "--set", "config.maxBufferedBytes=null"}},
		{"-f with the keys left empty", chartDir, []string{"-f", emptyKeys}},
		{"upgrade --reuse-values from a chart without them", oldChart, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(helmBinary(t), append([]string{"template", releaseName, tc.chart, "--namespace", namespace}, tc.args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("helm template %v: %v\n%s", tc.args, err, out)
			}
			m := decodeAll(t, string(out))
			data := m.configMap(m.deployment.Name).Data
			for _, k := range []string{"GOMEMLIMIT_RATIO", "MAX_BUFFERED_BYTES"} {
				if v, ok := data[k]; ok {
					t.Errorf("%s=%q rendered; want it left out (the proxy's default)", k, v)
				}
			}
		})
	}
}

// TestEveryConfigKeyMissing: helm upgrade --reuse-values from a chart
// version that did not have a config key renders without it. For every key
// of config, the render either fails (the schema requires it: the upgrade
// stops with a message) or leaves its variable out, so that the proxy's
// default applies: never an empty value or "<nil>" that would mean
// something else (KEY_PREFIX="" is no prefix, and every key moves;
// SCOPE_HEADERS="" is no scope; REPLAY_CACHE_BYTES="0" is no cache).
func TestEveryConfigKeyMissing(t *testing.T) {
	vals := chartValues(t)
	keys := blockKeys(t, vals, "config")
	if len(keys) < 30 {
		t.Fatalf("found %d config keys, want the 30 and more of values.yaml", len(keys))
	}
	out, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	base := decodeAll(t, out)
	want := base.configMap(base.deployment.Name).Data
	for _, key := range keys {
		t.Run(key, func(t *testing.T) {
			dir := chartWithValues(t, withoutKey(t, vals, "config", key))
			out, err := exec.Command(helmBinary(t), "template", releaseName, dir, "--namespace", namespace).CombinedOutput()
			if err != nil {
				return // refused at render, with a message
			}
			m := decodeAll(t, string(out))
			for name, v := range m.configMap(m.deployment.Name).Data {
				if v != want[name] {
					t.Errorf("config.%s missing: %s=%q rendered, want %q or left out", key, name, v, want[name])
				}
			}
		})
	}
}

// blockKeys lists the keys of the top-level block name of values.yaml.
func blockKeys(t *testing.T, vals []byte, name string) []string {
	t.Helper()
	block := regexp.MustCompile(`(?ms)^` + name + `:\n(.*?)^\S`).FindSubmatch(vals)
	if block == nil {
		t.Fatalf("values.yaml: no %s block", name)
	}
	var keys []string
	for _, k := range regexp.MustCompile(`(?m)^  ([A-Za-z0-9]+):`).FindAllSubmatch(block[1], -1) {
		keys = append(keys, string(k[1]))
	}
	return keys
}

// withoutKey is vals without the key of the top-level block name: its line
// and whatever is nested under it. Other blocks' keys of the same name stay.
func withoutKey(t *testing.T, vals []byte, name, key string) []byte {
	t.Helper()
	at := regexp.MustCompile(`(?m)^` + name + `:\n`).FindIndex(vals)
	if at == nil {
		t.Fatalf("values.yaml: no %s block", name)
	}
	loc := regexp.MustCompile(`(?m)^  ` + key + `:.*\n(    .*\n|  - .*\n)*`).FindIndex(vals[at[1]:])
	if loc == nil {
		t.Fatalf("values.yaml: no %s.%s", name, key)
	}
	return append(append([]byte{}, vals[:at[1]+loc[0]]...), vals[at[1]+loc[1]:]...)
}

// chartValues is the chart's values.yaml.
func chartValues(t *testing.T) []byte {
	t.Helper()
	vals, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// chartWithValues copies the chart with vals as its values.yaml, as an
// older version of it whose values lack keys added since.
func chartWithValues(t *testing.T, vals []byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "idemproxy")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "values.yaml"), vals, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
