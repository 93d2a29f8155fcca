package e2e

// Redis goes away and comes back: the binary on the embedded Redis or on a
// redis-server that the test kills and restarts on the same port.

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestEndToEnd: the proxy and its admin listener as production runs them.
// Ready with the right warning and gauge, keyed requests executed once and
// replayed; then, on a redis-server, Redis goes away (not ready, keyed
// requests fail closed) and comes back (the same process recovers by
// itself).
func TestEndToEnd(t *testing.T) {
	t.Parallel()
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
			t.Parallel()
			up := newUpstream(t)
			env := []string{"UPSTREAM_URL=" + up.URL}
			var srv *redistest.Server
			if tt.realRedis {
				srv = redistest.Start(t)
				env = append(env, "REDIS_URL="+srv.URL())
			}
			p := startProxy(t, env...)
			c := newClient(t)
			proxyURL := p.url("/v1/orders")

			body := p.waitReady(t, http.StatusOK, 10*time.Second)
			switch {
			case tt.wantWarning == "" && strings.Contains(body, "warning"):
				t.Errorf("/readyz body: got %q, want no warning", body)
			case tt.wantWarning != "" && !(strings.Contains(body, "warning") && strings.Contains(body, tt.wantWarning)):
				t.Errorf("/readyz body: got %q, want a warning about %q", body, tt.wantWarning)
			}
			if tt.wantWarning != "" && !strings.Contains(p.logs(), tt.wantWarning) {
				t.Errorf("log: got %q, want a warning about %q", p.logs(), tt.wantWarning)
			}
			if m := getBody(t, c, p.adminURL(t, "/metrics")); !strings.Contains(m, "\n"+tt.wantUnsafe+"\n") {
				t.Errorf("/metrics: want line %q; got:\n%v", tt.wantUnsafe, grepLines(m, "idemproxy_store_unsafe"))
			}
			if status, _, err := get(c, p.adminURL(t, "/healthz")); err != nil || status != http.StatusOK {
				t.Errorf("/healthz: got %v %v, want %v", status, err, http.StatusOK)
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
			if m := getBody(t, c, p.adminURL(t, "/metrics")); !strings.Contains(m, replayed+"\n") {
				t.Errorf("/metrics: want %q; got:\n%v", replayed, grepLines(m, "idemproxy_requests_total"))
			}
			if srv == nil {
				return
			}

			// Redis goes away: not ready, and keyed requests fail closed.
			srv.Kill()
			p.waitReady(t, http.StatusServiceUnavailable, 10*time.Second)
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
			p.waitReady(t, http.StatusOK, 10*time.Second)
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

// TestPurgeWatchLogsAnOutageOnce: while Redis is down the lost subscription
// is tried again and again; the log says so once (then at most once a
// minute), not once per attempt, and once more when it is back.
func TestPurgeWatchLogsAnOutageOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t)
	p := startProxy(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "ADMIN_ADDR=")
	srv.Kill()
	testutil.Eventually(t, 10*time.Second, "the lost subscription is logged", func() bool {
		return p.countLog("purge subscription failed") >= 1
	})
	// What is checked is an absence over time: the attempts after 1 s and
	// 2 s (then more) fall in this window, and must log nothing more.
	time.Sleep(3500 * time.Millisecond)
	if n := p.countLog("purge subscription failed"); n != 1 {
		t.Errorf("%d lines for one outage of a few seconds, want 1:\n%s", n, p.logs())
	}
	srv.Restart()
	testutil.Eventually(t, 10*time.Second, "the confirmation is logged", func() bool {
		return p.countLog("purge subscription confirmed") == 1
	})
}

// TestReplayCacheOnFollowsTheSubscription: the gauge goes back to 0 when
// a verified subscription fails (Redis gone), and to 1 once a new one is
// verified.
func TestReplayCacheOnFollowsTheSubscription(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t)
	p := startProxy(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL())
	p.cachedAnswer(t, newClient(t), "follow")
	srv.Kill()
	testutil.Eventually(t, 5*time.Second, "idemproxy_replay_cache_on 0 once Redis is gone (the cache no longer answers)", func() bool {
		return p.metric(t, "idemproxy_replay_cache_on") == 0
	})
	srv.Restart()
	p.waitReplayCacheOn(t)
}
