package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"
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
