package main

// End-to-end tests through start(): the proxy and its admin listener as
// production wires them, on the embedded Redis or a redis-server that the
// test kills and restarts.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

func TestStartEndToEnd(t *testing.T) {
	tests := []struct {
		name        string
		realRedis   bool
		wantWarning string // "" means no warning line at all
		wantUnsafe  string
	}{
		{name: "embedded miniredis", wantWarning: "embedded", wantUnsafe: "idemproxy_store_unsafe 1"},
		{name: "redis-server", realRedis: true, wantUnsafe: "idemproxy_store_unsafe 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			env := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0"}
			var srv *redistest.Server
			if tt.realRedis {
				srv = redistest.Start(t)
				env = append(env, "REDIS_URL="+srv.URL())
			}
			a, logs := startEnv(t, env...)
			c := newClient(t)
			admin := "http://" + a.adminAddr.String()
			proxyURL := "http://" + a.proxyAddr.String() + "/v1/orders"

			body := waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
			switch {
			case tt.wantWarning == "" && strings.Contains(body, "warning"):
				t.Errorf("/readyz body: got %q, want no warning", body)
			case tt.wantWarning != "" && !(strings.Contains(body, "warning") && strings.Contains(body, tt.wantWarning)):
				t.Errorf("/readyz body: got %q, want a warning about %q", body, tt.wantWarning)
			}
			if tt.wantWarning != "" && !strings.Contains(logs.String(), tt.wantWarning) {
				t.Errorf("log: got %q, want a warning about %q", logs.String(), tt.wantWarning)
			}
			if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, "\n"+tt.wantUnsafe+"\n") {
				t.Errorf("/metrics: want line %q; got:\n%v", tt.wantUnsafe, grepLines(m, "idemproxy_store_unsafe"))
			}
			if got := getStatus(t, c, admin+"/healthz"); got != http.StatusOK {
				t.Errorf("/healthz: got %v, want %v", got, http.StatusOK)
			}

			first := mustPost(t, c, proxyURL, "e2e-1", `{"amount":42}`)
			if first.status != http.StatusCreated {
				t.Fatalf("first POST: got %v, want %v (body %q)", first.status, http.StatusCreated, first.body)
			}
			if got := first.header.Get("Idempotent-Replayed"); got != "" {
				t.Errorf("first POST Idempotent-Replayed: got %q, want none", got)
			}
			second := mustPost(t, c, proxyURL, "e2e-1", `{"amount":42}`)
			if second.status != http.StatusCreated {
				t.Errorf("repeat POST: got %v, want %v", second.status, http.StatusCreated)
			}
			if got := second.header.Get("Idempotent-Replayed"); got != "true" {
				t.Errorf("repeat POST Idempotent-Replayed: got %q, want %q", got, "true")
			}
			if second.body != first.body {
				t.Errorf("replayed body: got %q, want %q", second.body, first.body)
			}
			if got, want := second.header.Get("Location"), first.header.Get("Location"); got != want {
				t.Errorf("replayed Location: got %q, want %q", got, want)
			}
			if got := up.Calls.Load(); got != 1 {
				t.Errorf("upstream calls: got %v, want 1", got)
			}
			const replayed = `idemproxy_requests_total{key_source="header",outcome="replayed",route="default"} 1`
			if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, replayed+"\n") {
				t.Errorf("/metrics: want %q; got:\n%v", replayed, grepLines(m, "idemproxy_requests_total"))
			}
			if srv == nil {
				return
			}

			// Redis goes away: not ready, and keyed requests fail closed.
			srv.Kill()
			waitStatus(t, c, admin+"/readyz", http.StatusServiceUnavailable, 10*time.Second)
			down := mustPost(t, c, proxyURL, "e2e-2", `{"amount":7}`)
			if down.status != http.StatusServiceUnavailable {
				t.Errorf("POST with Redis down: got %v, want %v", down.status, http.StatusServiceUnavailable)
			}
			checkProblem(t, down, http.StatusServiceUnavailable)
			if down.header.Get("Retry-After") == "" {
				t.Errorf("POST with Redis down: got no Retry-After, want one")
			}
			if got := up.Calls.Load(); got != 1 {
				t.Errorf("upstream calls with Redis down: got %v, want 1", got)
			}

			// Redis comes back: the same proxy recovers by itself.
			srv.Restart()
			waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
			var again response
			testutil.Eventually(t, 10*time.Second, "a POST after the Redis restart executes (201, not replayed)", func() bool {
				again = mustPost(t, c, proxyURL, "e2e-3", `{"amount":8}`)
				return again.status == http.StatusCreated && again.header.Get("Idempotent-Replayed") == ""
			})
			replay := mustPost(t, c, proxyURL, "e2e-3", `{"amount":8}`)
			if got := replay.header.Get("Idempotent-Replayed"); got != "true" || replay.body != again.body {
				t.Errorf("repeat after restart: got replayed=%q body %q, want replayed=true body %q", got, replay.body, again.body)
			}
			if got := up.Calls.Load(); got != 2 {
				t.Errorf("upstream calls after restart: got %v, want 2", got)
			}
		})
	}
}

func TestStartWarnsOnEvictionPolicy(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Client().ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy: %v", err)
	}
	up := newUpstream(t)
	a, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "REDIS_URL="+srv.URL())
	c := newClient(t)
	admin := "http://" + a.adminAddr.String()
	body := waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
	if !strings.Contains(body, "warning") || !strings.Contains(body, "allkeys-lru") {
		t.Errorf("/readyz body: got %q, want a warning naming allkeys-lru", body)
	}
	if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, "\nidemproxy_store_unsafe 1\n") {
		t.Errorf("/metrics: want idemproxy_store_unsafe 1; got:\n%v", grepLines(m, "idemproxy_store_unsafe"))
	}
	if !strings.Contains(logs.String(), "allkeys-lru") {
		t.Errorf("log: got %q, want a warning naming allkeys-lru", logs.String())
	}
}

func getStatus(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	status, _, err := get(c, url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return status
}

func getBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	status, body, err := get(c, url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: got %v %v, want %v", url, status, err, http.StatusOK)
	}
	return body
}

func checkProblem(t *testing.T, r response, status int) {
	t.Helper()
	if got := r.header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", got)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem: got %+v, want status %v and type, title, detail set", p, status)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
