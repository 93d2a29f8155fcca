package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// knownMetrics are the series the dashboard and the alerts may read: what idemproxy exports
// (histograms by their _bucket, _count and _sum series), plus Prometheus's `up` and the process
// collector's start time.
var knownMetrics = []string{
	"idemproxy_requests_total", "idemproxy_responses_total",
	"idemproxy_upstream_duration_seconds_bucket", "idemproxy_upstream_duration_seconds_count", "idemproxy_upstream_duration_seconds_sum",
	"idemproxy_redis_script_duration_seconds_bucket", "idemproxy_redis_script_duration_seconds_count", "idemproxy_redis_script_duration_seconds_sum",
	"idemproxy_inflight_requests", "idemproxy_record_failures_total", "idemproxy_double_executions_total",
	"idemproxy_takeover_claim_age_seconds_bucket", "idemproxy_takeover_claim_age_seconds_count", "idemproxy_takeover_claim_age_seconds_sum",
	"idemproxy_replay_cache_hits_total", "idemproxy_replay_cache_on", "idemproxy_store_unsafe", "idemproxy_build_info",
	"idemproxy_ready", "idemproxy_unknown_outcomes_total", "idemproxy_buffered_bytes", "idemproxy_buffer_full_total",
	"up", "process_start_time_seconds",
}

type dashPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Links []struct {
		Title string `json:"title"`
		URL   string `json:"url"`
	} `json:"links"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// readDashboard reads the dashboard's panels, those nested in collapsed rows included.
func readDashboard(t *testing.T) []dashPanel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "idemproxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []dashPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var all []dashPanel
	for _, p := range dash.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	return all
}

var selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)

// checkMetricNames reports every series an expression reads that is not in knownMetrics.
func checkMetricNames(t *testing.T, where, expr string) {
	t.Helper()
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		if !slices.Contains(knownMetrics, m[1]) {
			t.Errorf("%s reads %s, which is not a known metric:\n%s", where, m[1], expr)
		}
	}
}

// TestDashboardAndRulesReadKnownMetrics: every panel query and every alert expression reads
// only series that exist, so a renamed metric cannot leave an empty panel or a silent alert.
func TestDashboardAndRulesReadKnownMetrics(t *testing.T) {
	for _, p := range readDashboard(t) {
		for _, tg := range p.Targets {
			checkMetricNames(t, fmt.Sprintf("panel %d %q", p.ID, p.Title), tg.Expr)
		}
	}
	for _, r := range alertRules(t).Spec.Groups[0].Rules {
		checkMetricNames(t, r.Alert, r.Expr)
	}
}

// TestKnownMetricsDefined: every idemproxy_ series in knownMetrics is registered by the Go code.
func TestKnownMetricsDefined(t *testing.T) {
	var src strings.Builder
	for _, glob := range []string{"../../*.go", "../../proxy/*.go", "../../claim/*.go"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name:\s*"(idemproxy_[a-z_]+)"`).FindAllStringSubmatch(src.String(), -1) {
		defined[m[1]] = true
	}
	for _, name := range knownMetrics {
		if !strings.HasPrefix(name, "idemproxy_") {
			continue
		}
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
		switch {
		case defined[base] || defined[name]:
		default:
			t.Errorf("%s is not registered by the Go code (Name: %q)", name, base)
		}
	}
}

// TestDashboardQueriesPromtool parses every panel query with promtool: each becomes a recording
// rule (Grafana's variables replaced by values) in a rule file that `promtool check rules` reads.
func TestDashboardQueriesPromtool(t *testing.T) {
	vars := strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*", "$job", ".*", "$route", ".*")
	var rules []rule
	for _, p := range readDashboard(t) {
		for _, tg := range p.Targets {
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel%d_%s", p.ID, tg.RefID), Expr: vars.Replace(tg.Expr)})
		}
	}
	if len(rules) < 30 {
		t.Fatalf("%d panel queries, want the dashboard's (30 or more)", len(rules))
	}
	promtool(t)
	b, err := yaml.Marshal(ruleFile{Groups: []ruleGroup{{Name: "dashboard", Rules: rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, dir, "check", "rules", "dashboard.yaml"))
}

// TestDashboardAlertPanels: one panel per alert, titled after it and linking its runbook, the
// unknown-outcome and observe-mode panels, and no two panels on the same spot.
func TestDashboardAlertPanels(t *testing.T) {
	panels := readDashboard(t)
	for _, a := range wantAlerts {
		i := slices.IndexFunc(panels, func(p dashPanel) bool { return strings.HasPrefix(p.Title, a+": ") })
		if i < 0 {
			t.Errorf("no panel titled %q", a+": ...")
			continue
		}
		want := defaultRunbookBase + "#" + strings.ToLower(a)
		if !slices.ContainsFunc(panels[i].Links, func(l struct {
			Title string `json:"title"`
			URL   string `json:"url"`
		}) bool {
			return l.URL == want
		}) {
			t.Errorf("panel %q does not link %s", panels[i].Title, want)
		}
	}
	for _, title := range []string{"Unknown outcomes", "Observe: would-be duplicates", "Observe: would-be mismatches and rejects"} {
		if !slices.ContainsFunc(panels, func(p dashPanel) bool { return p.Title == title }) {
			t.Errorf("no panel %q", title)
		}
	}
	var exprs strings.Builder
	for _, p := range panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	for _, o := range []string{`outcome="unknown"`, "would_replay", "would_conflict", "would_mismatch", "would_reject"} {
		if !strings.Contains(exprs.String(), o) {
			t.Errorf("no panel query reads %s", o)
		}
	}

	ids := map[int]string{}
	for i, p := range panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		a := p.GridPos
		if a.X+a.W > 24 {
			t.Errorf("panel %q is wider than the grid: %+v", p.Title, a)
		}
		for _, q := range panels[:i] {
			b := q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q %+v and %q %+v overlap", q.Title, b, p.Title, a)
			}
		}
	}
}
