package validate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestRoutesParseInProxy renders each values file with routes and parses the ROUTES string with
// the proxy's own parser, so the chart can never emit a string the proxy refuses at start.
func TestRoutesParseInProxy(t *testing.T) {
	for _, valuesFile := range []string{
		chartDir + "/ci/routes-values.yaml",
		chartDir + "/ci/webhooks-values.yaml", // key=, scope= (empty too), fingerprint=
	} {
		t.Run(filepath.Base(valuesFile), func(t *testing.T) {
			m := mustRender(t, "-f", valuesFile)
			spec := m.configMap(m.deployment.Name).Data["ROUTES"]

			routes, err := proxy.ParseRoutes(spec)
			if err != nil {
				t.Fatalf("proxy.ParseRoutes(%q): %v", spec, err)
			}

			raw, err := os.ReadFile(valuesFile)
			if err != nil {
				t.Fatal(err)
			}
			var values struct {
				Config struct {
					Routes []map[string]any `json:"routes"`
				} `json:"config"`
			}
			if err := yaml.Unmarshal(raw, &values); err != nil {
				t.Fatal(err)
			}
			if got, want := len(routes), len(values.Config.Routes); got != want || want < 5 {
				t.Errorf("parsed %d rules, want %d (one per config.routes entry, at least 5)", got, want)
			}
		})
	}
}

// TestOffRouteWithObserveFalse: the off/upgrade check in
// _helpers.tpl tests each option with `index $r $opt`, so `observe: false`
// (the chart's spelling of the route option enforce) passed it as "unset",
// but the renderer appended the option whenever the key was present
// (hasKey): an off route rendered "POST /a off enforce", which the proxy
// refuses at start ("options off and upgrade cannot be combined"), i.e. a
// CrashLoopBackOff instead of a helm error. The chart must never emit a
// ROUTES the proxy refuses: it fails the render, as for every other option.
func TestOffRouteWithObserveFalse(t *testing.T) {
	for _, kind := range []string{"off", "upgrade"} {
		t.Run(kind, func(t *testing.T) {
			out, err := render(t, "--set", "config.routes[0].method=GET,config.routes[0].pattern=/a,config.routes[0]."+kind+"=true,config.routes[0].observe=false")
			if err != nil {
				if !strings.Contains(err.Error(), "off means plain pass-through") {
					t.Errorf("render error %v, want the off/upgrade message", err)
				}
				return
			}
			m := decodeAll(t, out)
			spec := m.configMap(m.deployment.Name).Data["ROUTES"]
			if _, err := proxy.ParseRoutes(spec); err != nil {
				t.Errorf("chart rendered ROUTES=%q, which the proxy refuses at start: %v", spec, err)
			}
		})
	}
}
