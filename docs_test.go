package main

import (
	"maps"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
)

// TestVariablesDocumented: every variable Config reads is documented in the
// Variables section of docs/configuration.md, listed in config.example.env, and has a
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
	readme := read("docs/configuration.md")
	start, end := strings.Index(readme, "## Variables"), strings.Index(readme, "## `ROUTES`")
	if start < 0 || end < start {
		t.Fatal("docs/configuration.md: no Variables section")
	}
	example := read("config.example.env")
	exampleVars := regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*)=`).FindAllStringSubmatch(example, -1)
	values := read("charts/idemproxy/values.yaml")
	templates := read("charts/idemproxy/templates/configmap.yaml") + read("charts/idemproxy/templates/deployment.yaml")
	for _, v := range vars {
		if !strings.Contains(readme[start:end], "`"+v+"`") {
			t.Errorf("docs/configuration.md Variables does not document %s", v)
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

// TestMetricsDocumented: every idemproxy_* metric family the proxy exports
// has a row in the metrics table of docs/operations.md, and every row names
// one it exports.
func TestMetricsDocumented(t *testing.T) {
	up := newUpstream(t)
	mr := miniredis.RunT(t)
	// A route keyed from a JSON body exports its not-JSON counter at zero.
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL=redis://"+mr.Addr(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0",
		"ROUTES=POST /hooks key=stripe-events scope=")
	c := newClient(t)
	// Families with labels are exported from their first series on.
	if r := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/orders", "documented", `{}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %q", r.status, r.body)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# HELP (idemproxy_\w+) `).FindAllStringSubmatch(getBody(t, c, "http://"+a.adminAddr.String()+"/metrics"), -1) {
		exported[m[1]] = true
	}
	b, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(idemproxy_\\w+)` \\|").FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = true
	}
	if len(exported) < 10 {
		t.Fatalf("exported families: %v, want the proxy's metrics", slices.Sorted(maps.Keys(exported)))
	}
	for name := range exported {
		if !documented[name] {
			t.Errorf("docs/operations.md's metrics table has no row for %s", name)
		}
	}
	for name := range documented {
		if !exported[name] {
			t.Errorf("docs/operations.md's metrics table documents %s, which the proxy does not export", name)
		}
	}
}
