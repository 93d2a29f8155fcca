package validate

import (
	"os"
	"path/filepath"
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
