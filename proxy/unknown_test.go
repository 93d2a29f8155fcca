package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// hold configures ON_UNKNOWN=hold with a lock far shorter than the key's
// TTL, so that every test also shows the lock's expiry changes nothing.
func hold(o *proxy.Options) {
	o.Default.Hold = true
	o.UpstreamTimeout = 300 * time.Millisecond
	o.Default.LockTTL = 400 * time.Millisecond
}

// wantUnknown checks the answer to a request whose key's outcome is
// unknown: the first answer's status, outcome-unknown, replayed, no
// Retry-After.
func wantUnknown(t *testing.T, r response, status int) {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("status %d (%s), want %d outcome-unknown", r.StatusCode, r.body, status)
	}
	p := r.problem(t)
	if p["type"] != "urn:idemproxy:problem:outcome-unknown" || p["title"] != "Outcome of the original request is unknown" {
		t.Errorf("problem %v, want outcome-unknown", p)
	}
	if r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Retry-After") != "" {
		t.Errorf("Idempotent-Replayed %q Retry-After %q, want true and none", r.Header.Get("Idempotent-Replayed"), r.Header.Get("Retry-After"))
	}
}

// TestHoldUpstreamTimeout is case (a): the upstream timed out after the
// request was sent. The caller gets 504 as before; from that moment every
// retry gets 504 outcome-unknown without reaching the upstream, past the
// lock TTL too, until the key is purged; then exactly one executes.
func TestHoldUpstreamTimeout(t *testing.T) {
	e := newEnv(t, realBackend, hold)
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	r := e.do(req{key: "pay-1", body: "b"})
	if r.StatusCode != http.StatusGatewayTimeout || r.problem(t)["type"] != "urn:idemproxy:problem:upstream-timeout" {
		t.Fatalf("first: %d %s, want 504 upstream-timeout", r.StatusCode, r.body)
	}
	if !strings.Contains(r.problem(t)["detail"].(string), "purges") {
		t.Errorf("detail %q does not say the key is held for an operator", r.problem(t)["detail"])
	}
	wantUnknown(t, e.do(req{key: "pay-1", body: "b"}), http.StatusGatewayTimeout)
	e.advance(600 * time.Millisecond) // past LOCK_TTL
	wantUnknown(t, e.do(req{key: "pay-1", body: "b"}), http.StatusGatewayTimeout)
	if r := e.do(req{key: "pay-1", body: "other"}); r.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("other body: %d, want 422", r.StatusCode)
	}
	if got := e.calls.Load(); got != 1 {
		t.Fatalf("upstream calls %d, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "upstream_timeout"}); got != 1 {
		t.Errorf("unknown outcomes (upstream_timeout) %v, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "unknown"}); got != 2 {
		t.Errorf("requests with outcome unknown %v, want 2", got)
	}
	if !strings.Contains(e.logs.String(), `"outcome":"unknown"`) {
		t.Errorf("access log lacks outcome unknown")
	}

	purge(t, e, "pay-1")
	g.open()
	if r := e.do(req{key: "pay-1", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after purge: %d, want an execution", r.StatusCode)
	}
	if r := e.do(req{key: "pay-1", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after purge, retry: %d, want the replay", r.StatusCode)
	}
	if got := e.calls.Load(); got != 2 {
		t.Errorf("upstream calls %d, want 2 (one before, one after the purge)", got)
	}
}

// purge deletes a header key's record as `idemproxy keys purge` does.
func purge(t *testing.T, e *env, key string) {
	t.Helper()
	k := claim.NewKey([]string{""}, key) // the tests send no Authorization
	if n, err := e.rdb.Del(context.Background(), claim.RecordKey("idem:", k)).Result(); err != nil || n != 1 {
		t.Fatalf("purge: %d keys deleted, %v", n, err)
	}
}

// TestHoldConnectionResetAfterSend is case (b): the connection broke after
// the request was sent, before a status line: 502, and 502 outcome-unknown
// for every retry.
func TestHoldConnectionResetAfterSend(t *testing.T) {
	e := newEnv(t, realBackend, hold)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	r := e.do(req{key: "reset", body: "b"})
	if r.StatusCode != http.StatusBadGateway {
		t.Fatalf("first: %d, want 502", r.StatusCode)
	}
	e.advance(600 * time.Millisecond)
	wantUnknown(t, e.do(req{key: "reset", body: "b"}), http.StatusBadGateway)
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "upstream_failed"}); got != 1 {
		t.Errorf("unknown outcomes (upstream_failed) %v, want 1", got)
	}
}

// TestHoldAbandonedClaim is case (c): a claim whose proxy died (here: a
// claim made and never completed) turns unknown when a request finds its
// lock expired, and is never executed.
func TestHoldAbandonedClaim(t *testing.T) {
	forBoth(t, hold, func(t *testing.T, e *env) {
		dead := claim.NewStore(e.rdb, "idem:", nil)
		terms := claim.Terms{LockTTL: 400 * time.Millisecond, TTL: time.Hour, Hold: true}
		if _, _, err := dead.Acquire(context.Background(), claim.NewKey([]string{""}, "orphan"), fingerprintOf(http.MethodPost, "/v1/orders", "", "b"), terms); err != nil {
			t.Fatal(err)
		}
		if r := e.do(req{key: "orphan", body: "b"}); r.StatusCode != http.StatusConflict {
			t.Fatalf("within the lock: %d, want 409", r.StatusCode)
		}
		e.advance(600 * time.Millisecond)
		wantUnknown(t, e.do(req{key: "orphan", body: "b"}), http.StatusGatewayTimeout)
		wantUnknown(t, e.do(req{key: "orphan", body: "b"}), http.StatusGatewayTimeout)
		if got := e.calls.Load(); got != 0 {
			t.Errorf("upstream calls %d, want 0", got)
		}
		if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "lock_expired"}); got != 1 {
			t.Errorf("unknown outcomes (lock_expired) %v, want 1", got)
		}
	})
}

// TestHoldSlowOriginalWins: the original proxy was slow, not dead. Its lock
// expired and a retry held the key as unknown; the original's answer then
// arrives, and its token still matches: the real answer is recorded over
// the unknown state, and later retries replay it.
func TestHoldSlowOriginalWins(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Default.Hold = true
		o.UpstreamTimeout = 3 * time.Second
		o.Default.LockTTL = 200 * time.Millisecond // below UPSTREAM_TIMEOUT: config refuses this, Options do not
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "slow", body: "b"})
		first <- r
	}()
	g.wait(t)
	time.Sleep(300 * time.Millisecond) // past the lock, on Redis's clock
	wantUnknown(t, e.do(req{key: "slow", body: "b"}), http.StatusGatewayTimeout)
	g.open()
	if r := <-first; r.StatusCode != http.StatusCreated {
		t.Fatalf("original: %d, want 201", r.StatusCode)
	}
	r := e.do(req{key: "slow", body: "b"})
	if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the original answered: %d %s, want its 201 replayed", r.StatusCode, r.body)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
}

// TestExpireIsUnchanged: without hold the contract's Part 1 holds: a timed
// out key is retried after its lock TTL.
func TestExpireIsUnchanged(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		hold(o)
		o.Routes = mustRoutes(t, "POST /v1/expire/* unknown=expire")
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("first: %d, want 504", r.StatusCode)
	}
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusConflict {
		t.Fatalf("within the lock: %d, want 409", r.StatusCode)
	}
	e.advance(600 * time.Millisecond)
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("after the lock: %d, want a takeover", r.StatusCode)
	}
}

func mustRoutes(t *testing.T, spec string) []proxy.Route {
	t.Helper()
	rs, err := proxy.ParseRoutes(spec)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
