package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShutdownTimeoutCoversTheHeaderWindow: on SIGTERM,
// http.Server.Shutdown closes idle connections, but a *new* connection
// (StateNew) is left alone until it is 5 s old (net/http closeIdleConns,
// issue 22682; whole Unix seconds, so up to 6 s). A client whose headers
// complete in that window is served normally: its keyed body may take
// REQUEST_READ_TIMEOUT, its claim is written, the upstream call takes up to
// UPSTREAM_TIMEOUT and recording up to 10 s (claim.CompleteBudget). The
// rule in config.go (af8a375) counts only REQUEST_READ_TIMEOUT +
// UPSTREAM_TIMEOUT + 10 s, so at its minimum the process can exit with that
// claim in flight, and after LOCK_TTL the client's retry executes again:
// the double execution the rule is there to prevent.
//
// Correct: either the rule adds the header window (6 s; plus Redis's claim
// round trip), or the handler stops claiming keys once shutdown has begun
// (answer 503 with Retry-After and Connection: close before claiming), so
// that only requests already in ServeHTTP at SIGTERM remain to be covered.
func TestShutdownTimeoutCoversTheHeaderWindow(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=50s"}
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a connection accepted just before SIGTERM may finish its headers up to ~6s later, "+
			"then need 10s (body) + 30s (upstream) + 10s (record) = 56s > SHUTDOWN_TIMEOUT 50s", env)
	}
}

// TestChartGraceDefaultDocumented: values.yaml documents the derived
// terminationGracePeriodSeconds with a helm-docs "@default" annotation that
// still says "45 + 15 = 60" (the SHUTDOWN_TIMEOUT default before af8a375).
// The default is now 60s, so the derived grace is 75 s, as the chart README
// and README say.
//
// Correct: the annotation reads ceil(config.shutdownTimeout) +
// terminationGraceExtraSeconds from the same file: "60 + 15 = 75".
func TestChartGraceDefaultDocumented(t *testing.T) {
	b, err := os.ReadFile("charts/idemproxy/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	values := string(b)
	num := func(re string) int {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(values)
		if m == nil {
			t.Fatalf("values.yaml: no match for %s", re)
		}
		if strings.HasSuffix(m[1], "s") {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatal(err)
			}
			return int(d.Seconds())
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	shutdown := num(`(?m)^  shutdownTimeout: (\S+)`)
	extra := num(`(?m)^terminationGraceExtraSeconds: (\d+)`)
	m := regexp.MustCompile(`@default -- null \(derived[^:]*: (\d+) \+ (\d+) = (\d+)\)`).FindStringSubmatch(values)
	if m == nil {
		t.Fatal("values.yaml: no '@default -- null (derived: A + B = C)' annotation")
	}
	want := []string{strconv.Itoa(shutdown), strconv.Itoa(extra), strconv.Itoa(shutdown + extra)}
	if m[1] != want[0] || m[2] != want[1] || m[3] != want[2] {
		t.Errorf("values.yaml documents the derived grace as %s + %s = %s; with shutdownTimeout %ds and terminationGraceExtraSeconds %d it is %s + %s = %s",
			m[1], m[2], m[3], shutdown, extra, want[0], want[1], want[2])
	}
}
