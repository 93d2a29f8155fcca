package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

func observe(o *proxy.Options) { o.Default.Observe = true }

// wantForwarded checks that an answer is the upstream's own, untouched:
// its status, and none of the headers the proxy adds when it enforces.
func wantForwarded(t *testing.T, r response, status int) {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("status %d (%s), want the upstream's %d", r.StatusCode, r.body, status)
	}
	for _, h := range []string{"Idempotent-Replayed", "Idempotency-Key", "Retry-After"} {
		if v := r.Header.Get(h); v != "" {
			t.Errorf("%s: %q on an observed answer, want none", h, v)
		}
	}
}

func outcomes(t *testing.T, e *env, names ...string) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for _, n := range names {
		got[n] = counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": n})
	}
	return got
}

// TestObserveChangesNoAnswer: every request is forwarded and answered by
// the upstream; the first is claimed and recorded exactly as in enforce, and
// each duplicate is counted as what enforcing would have done.
func TestObserveChangesNoAnswer(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		observe(o)
		o.MaxBodyBytes = 64
	}, func(t *testing.T, e *env) {
		first := e.do(req{key: "o1", body: "b"})
		wantForwarded(t, first, http.StatusCreated)
		dup := e.do(req{key: "o1", body: "b"})
		wantForwarded(t, dup, http.StatusCreated)
		if string(dup.body) == string(first.body) {
			t.Errorf("duplicate answered %s, the first's body: want the upstream's fresh answer", dup.body)
		}
		wantForwarded(t, e.do(req{key: "o1", body: "other"}), http.StatusCreated)
		wantForwarded(t, e.do(req{key: strings.Repeat("k", 300), body: "b"}), http.StatusCreated)

		// A chunked body over MAX_BODY_BYTES is forwarded whole, unclaimed.
		var seen atomic.Int64
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			seen.Store(int64(len(b)))
			e.created(w, r)
		})
		big := strings.Repeat("x", 100<<10)
		hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", io.MultiReader(strings.NewReader(big))) // no length: chunked
		hr.Header.Set("Idempotency-Key", "big")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || seen.Load() != int64(len(big)) {
			t.Errorf("large body: %d, upstream saw %d bytes, want 201 and %d", resp.StatusCode, seen.Load(), len(big))
		}
		if got := e.calls.Load(); got != 5 {
			t.Errorf("upstream calls %d, want 5 (every request)", got)
		}
		want := map[string]float64{"executed": 1, "would_replay": 1, "would_mismatch": 1, "would_reject": 2}
		if got := outcomes(t, e, "executed", "would_replay", "would_mismatch", "would_reject"); !equalMaps(got, want) {
			t.Errorf("outcomes %v, want %v", got, want)
		}

		// The first record was never overwritten: enforcing now replays it.
		enforce := e.opts
		enforce.Default.Observe = false
		_, srv, _ := e.newProxy(enforce)
		r := e.doTo(srv, req{key: "o1", body: "b"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
			t.Errorf("enforce after observe: %d %s, want the first answer %s replayed", r.StatusCode, r.body, first.body)
		}
	})
}

func equalMaps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestObserveInFlightAndRequired: a duplicate of a request still in flight
// is forwarded at once (would_conflict), even with a wait policy; a route
// that requires a key forwards a request without one (would_reject).
func TestObserveInFlightAndRequired(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		observe(o)
		o.Default.Wait = 5 * time.Second
		o.Default.Required = true
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	done := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "slow", body: "b"})
		done <- r
	}()
	g.wait(t)
	start := time.Now()
	wantForwarded(t, e.do(req{key: "slow", body: "b"}), http.StatusCreated)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("duplicate took %v: observe must not wait", d)
	}
	wantForwarded(t, e.do(req{body: "no key"}), http.StatusCreated)
	g.open()
	wantForwarded(t, <-done, http.StatusCreated)
	want := map[string]float64{"executed": 1, "would_conflict": 1, "would_reject": 1}
	if got := outcomes(t, e, "executed", "would_conflict", "would_reject"); !equalMaps(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
}

// TestObserveAcrossReplicas: two replicas on one Redis count one first
// request and one would-be replay, whichever replica sees which.
func TestObserveAcrossReplicas(t *testing.T) {
	e := newEnv(t, realBackend, observe)
	_, srvB, regB := e.newProxy(e.opts)
	wantForwarded(t, e.do(req{key: "r1", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.doTo(srvB, req{key: "r1", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.doTo(srvB, req{key: "r1", body: "c"}), http.StatusCreated)
	if got := e.calls.Load(); got != 3 {
		t.Errorf("upstream calls %d, want 3", got)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "executed"}); got != 1 {
		t.Errorf("replica A executed %v, want 1", got)
	}
	if got := counter(t, regB, "idemproxy_requests_total", map[string]string{"outcome": "would_replay"}); got != 1 {
		t.Errorf("replica B would_replay %v, want 1", got)
	}
	if got := counter(t, regB, "idemproxy_requests_total", map[string]string{"outcome": "would_mismatch"}); got != 1 {
		t.Errorf("replica B would_mismatch %v, want 1", got)
	}
}

// TestObserveRedisDown: Redis unreachable in observe is forwarded, never
// 503, and counted store_error.
func TestObserveRedisDown(t *testing.T) {
	e := newEnv(t, realBackend, observe)
	e.redis.Kill()
	wantForwarded(t, e.do(req{key: "down", body: "b"}), http.StatusCreated)
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "store_error"}); got != 1 {
		t.Errorf("store_error %v, want 1", got)
	}
}

// TestObserveRoute: the route option observe applies to its route only; a
// held unknown key counts as would_replay there.
func TestObserveRoute(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /v1/shadow/* observe unknown=hold")
	})
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "s", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "s", body: "b"}), http.StatusCreated)
	if r := e.do(req{path: "/v1/orders", key: "t", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotency-Key") != "t" {
		t.Fatalf("enforced route: %d, key echo %q", r.StatusCode, r.Header.Get("Idempotency-Key"))
	}
	if r := e.do(req{path: "/v1/orders", key: "t", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("enforced route's duplicate not replayed")
	}
	// An unknown outcome on the observed route.
	k := claim.NewKey([]string{""}, "u")
	lease, _, err := claim.NewStore(e.rdb, "idem:", nil).Acquire(context.Background(), k,
		fingerprintOf(http.MethodPost, "/v1/shadow/1", "", "b"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Hold(context.Background(), http.StatusGatewayTimeout, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "u", body: "b"}), http.StatusCreated)
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "would_replay", "route": "/v1/shadow/*"}); got != 2 {
		t.Errorf("would_replay on the observed route %v, want 2", got)
	}
}

// TestDocsURL: with DOCS_URL every problem the proxy writes links to it;
// the upstream's answers and replays do not.
func TestDocsURL(t *testing.T) {
	const link = `<https://docs.example.com/idempotency>; rel="describedby"`
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.DocsURL = "https://docs.example.com/idempotency"
		o.Routes = mustRoutes(t, "POST /v1/required/* required")
	})
	first := e.do(req{key: "d", body: "b"})
	if first.StatusCode != http.StatusCreated || first.Header.Get("Link") != "" {
		t.Errorf("upstream answer: %d Link %q, want none", first.StatusCode, first.Header.Get("Link"))
	}
	if r := e.do(req{key: "d", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Link") != "" {
		t.Errorf("replay: Link %q, want none", r.Header.Get("Link"))
	}
	for name, r := range map[string]response{
		"422": e.do(req{key: "d", body: "other"}),
		"400": e.do(req{path: "/v1/required/1", body: "b"}),
	} {
		r.problem(t)
		if got := r.Header.Get("Link"); got != link {
			t.Errorf("%s: Link %q, want %q", name, got, link)
		}
	}
	e.redis.Kill()
	r := e.do(req{key: "e", body: "b"})
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Link") != link {
		t.Errorf("503: %d Link %q, want %q", r.StatusCode, r.Header.Get("Link"), link)
	}
	e.upstream.Close()
	r = e.do(req{method: http.MethodGet, path: "/v1/orders"})
	if r.StatusCode != http.StatusBadGateway || r.Header.Get("Link") != link {
		t.Errorf("pass-through 502: %d Link %q, want %q", r.StatusCode, r.Header.Get("Link"), link)
	}
}
