package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview12UnknownCountedOncePerKey: idemproxy_unknown_outcomes_total
// counts "keys that entered the state unknown". Here one key enters it
// once: its claim's lock expires on Redis's clock while the first request
// is still waiting for the upstream (Redis's clock jumped ahead, e.g. a
// failover to a replica whose clock is ahead; equally a Lease.Hold that is
// retried past the lock), a retry finds it and holds it as unknown
// (lock_expired, counted); then the first request's upstream times out and
// Lease.Hold finds the record already unknown. complete.lua answers a plain
// "ok" for that (cur[1] == ARGV[6]), and hold() counts upstream_timeout a
// second time for the same key: alerts on the counter see two unknown keys
// where an operator will find one.
func TestReview12UnknownCountedOncePerKey(t *testing.T) {
	e := newEnv(t, miniBackend, hold) // UPSTREAM_TIMEOUT 300ms, LOCK_TTL 400ms
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "twice", body: "b"})
		first <- r
	}()
	g.wait(t)
	e.advance(time.Second) // Redis's clock: past the lock
	wantUnknown(t, e.do(req{key: "twice", body: "b"}), http.StatusGatewayTimeout)
	select {
	case r := <-first:
		if r.Response == nil || r.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("first request: %+v, want its 504", r.Response)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first request did not finish within 5s")
	}
	total := 0.0
	byCause := map[string]float64{}
	for _, c := range []string{"upstream_timeout", "upstream_failed", "lock_expired"} {
		byCause[c] = counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": c})
		total += byCause[c]
	}
	if total != 1 {
		t.Errorf("idemproxy_unknown_outcomes_total %v in all (%v) for one key that entered unknown once, want 1", total, byCause)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
}

// TestReview12HoldSlowOriginalReleaseWins: the README's rule "a known
// answer is strictly better than unknown" (script result late) covers a
// slow original that completes, not one that releases. The original's
// lock expires (here: Redis's clock jumps), a retry holds the key as
// unknown, then the upstream answers 503. With ON_5XX=release that answer
// means "nothing happened: retry with the same key", and the first caller
// is told so; but release.lua only deletes an in-flight record, so it
// answers lost and the key stays unknown: the caller's retry gets 504
// outcome-unknown until an operator purges a key whose outcome is known.
// release.lua should accept its own token on a 'u' record as complete.lua
// does.
func TestReview12HoldSlowOriginalReleaseWins(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Default.Hold = true
		o.UpstreamTimeout = 2 * time.Second
		o.Default.LockTTL = 3 * time.Second
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "rel", body: "b"})
		first <- r
	}()
	g.wait(t)
	e.advance(5 * time.Second) // Redis's clock: past the lock
	wantUnknown(t, e.do(req{key: "rel", body: "b"}), http.StatusGatewayTimeout)
	g.open()
	select {
	case r := <-first:
		if r.Response == nil || r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("original: %+v, want the upstream's 503", r.Response)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("original did not finish within 5s")
	}
	r := e.do(req{key: "rel", body: "b"})
	if r.StatusCode != http.StatusCreated {
		t.Errorf("retry after the original's 503 (released: nothing happened): %d %s; want it executed (201)", r.StatusCode, r.body)
	}
}
