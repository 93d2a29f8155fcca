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

// TestWebhookDocsSignedDeliveriesConsistent: the webhook page once said
// in one part that idemproxy checks no signature and that an upstream's 401
// to a forgery is recorded and replayed to the genuine delivery, the
// opposite of what verify= and the release of 401/403 on key= routes do;
// and it told Helm users to pass the secrets through envFrom or extraEnv,
// while the chart takes them as config.routes[].verify.secretName and keys
// (and renders variable names of its own, so a secret under extraEnv cannot
// be named by a chart route). An operator deciding whether the upstream
// must keep its own checks reads both.
func TestWebhookDocsSignedDeliveriesConsistent(t *testing.T) {
	b, err := os.ReadFile("docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, stale := range []string{
		"Signatures are not checked by idemproxy",
		"your API's refusal (401) is recorded and the real delivery gets it",
	} {
		if strings.Contains(readme, stale) {
			t.Errorf("docs/webhooks.md still says %q", stale)
		}
	}
	if !strings.Contains(readme, "secretName") {
		t.Error("docs/webhooks.md does not document the chart's config.routes[].verify.secretName/keys")
	}
}

// TestRunbookReplayCacheOffFailMode: the runbook "## IdemproxyReplayCacheOff" (docs/runbook.md) says
// "Nothing is replayed wrongly and nothing executes twice; replays cost a Redis round trip
// each", and lists "Redis unreachable from the pod" among its causes. While Redis is
// unreachable replays are not read from Redis: they follow FAIL_MODE, and with FAIL_MODE=open a
// retry of a completed request is forwarded again ("Replay cache", "Redis unreachable"; the
// metric's own row says "or follow FAIL_MODE while it is unreachable"). The section, and the
// alerts-table row ("every replay is read from Redis"), should say so.
func TestRunbookReplayCacheOffFailMode(t *testing.T) {
	b, err := os.ReadFile("docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	_, sec, ok := strings.Cut(readme, "\n## IdemproxyReplayCacheOff\n")
	if !ok {
		t.Fatal("no runbook section")
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	flat := strings.Join(strings.Fields(sec), " ")
	if strings.Contains(flat, "nothing executes twice") && strings.Contains(flat, "unreachable") && !strings.Contains(flat, "FAIL_MODE") {
		t.Errorf("runbook IdemproxyReplayCacheOff says nothing executes twice and names Redis unreachable as a cause, without FAIL_MODE (open: retries of completed requests are forwarded again)")
	}
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `IdemproxyReplayCacheOff` |") && !strings.Contains(line, "FAIL_MODE") {
			t.Errorf("alerts table row says %q; while Redis is unreachable replays follow FAIL_MODE, not read from Redis", line)
		}
	}
}

// TestChartReadmeDocumentsRecordFormat: the chart's README maps
// each config value to its variable in one table ("The config block maps
// one key to each environment variable of the proxy"); config.recordFormat
// was once missing from it, though that table is where a chart user looks
// for the rollout switch.
func TestChartReadmeDocumentsRecordFormat(t *testing.T) {
	b, err := os.ReadFile("charts/idemproxy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "`config.recordFormat`") || !strings.Contains(string(b), "`RECORD_FORMAT`") {
		t.Errorf("charts/idemproxy/README.md: no row for config.recordFormat (RECORD_FORMAT) in its table of config values")
	}
}

// TestPerformanceDocMeasuresStringRecords: docs/performance.md says how to
// measure RECORD_FORMAT=string beside hashes, and never describes the
// string record as work "not done" that "needs a two-phase rollout".
func TestPerformanceDocMeasuresStringRecords(t *testing.T) {
	b, err := os.ReadFile("docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	perf := string(b)
	if !strings.Contains(perf, "RECORD_FORMAT") {
		t.Errorf("docs/performance.md never mentions RECORD_FORMAT: it has no measurement of string records")
	}
	for _, stale := range []string{"15 µs would take at most about 5 commands per first request; not done", "which needs a two-phase rollout because\nolder replicas cannot read it"} {
		if strings.Contains(perf, stale) {
			t.Errorf("docs/performance.md still says %q of the string record this change ships", stale)
		}
	}
}
