package main

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestVariablesDocumented: every variable Config reads is documented in the
// README's Configuration section, listed in config.example.env, and has a
// key in the chart (values.yaml, rendered by the ConfigMap or, for
// credentials, the Deployment from a Secret); and none of them lists a
// variable the proxy does not read.
func TestVariablesDocumented(t *testing.T) {
	var vars []string
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("env"), ","); name != "" {
			vars = append(vars, name)
		}
	}
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme := read("README.md")
	start, end := strings.Index(readme, "## Configuration"), strings.Index(readme, "### `ROUTES`")
	if start < 0 || end < start {
		t.Fatal("README: no Configuration section")
	}
	example := read("config.example.env")
	exampleVars := regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*)=`).FindAllStringSubmatch(example, -1)
	values := read("charts/idemproxy/values.yaml")
	templates := read("charts/idemproxy/templates/configmap.yaml") + read("charts/idemproxy/templates/deployment.yaml")
	for _, v := range vars {
		if !strings.Contains(readme[start:end], "`"+v+"`") {
			t.Errorf("README Configuration does not document %s", v)
		}
		if !regexp.MustCompile(`(?m)^` + v + `=`).MatchString(example) {
			t.Errorf("config.example.env does not list %s", v)
		}
		if !regexp.MustCompile(`(# -- |Key holding |Inline )` + v + `\b`).MatchString(values) {
			t.Errorf("charts/idemproxy/values.yaml does not document %s", v)
		}
		if !regexp.MustCompile(`\b` + v + `\b`).MatchString(templates) {
			t.Errorf("the chart's ConfigMap and Deployment never set %s", v)
		}
	}
	for _, m := range exampleVars {
		if !slices.Contains(vars, m[1]) {
			t.Errorf("config.example.env lists %s, which the proxy does not read", m[1])
		}
	}
}
