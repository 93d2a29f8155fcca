package proxy_test

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// An empty keyed POST, PUT, PATCH or DELETE goes upstream as http.NoBody
// (Content-Length: 0). On a nothing-written error from a reused connection
// the Transport resends such a request without asking GetBody, so
// exchange.rewind does not vet that resend: net/http's own count of bytes
// written decides. On the connections the proxy dials that count is exact
// (net.TCPConn), and crypto/tls reports nothing written only when no whole
// record left, which the upstream cannot decrypt, let alone execute. The
// review's test of that resend (TestReview14bEmptyKeyedBodyIsResentWithout
// TheGuard) needed a connection layer that reports 0 bytes after writing the
// whole request; it is not kept as a test. What is kept: the answer after
// such a resend is decided by the connections' counts (exchange.left).

// TestReview14bEmptyKeyedBodyResendNotForgotten: the other side of the
// same bypass. After a resend of a request whose first attempt wrote
// nothing, the answer must be decided by the resent attempt (rewind forgets
// the first one): a resend that gets no connection means the request never
// left, the claim is released and the client's retry executes
// (TestResendThenFailure/dial-fails, for a request with a body). For an
// empty keyed POST, rewind is never called, gotConn stays set from the
// first attempt, and the proxy answers "may have been executed": with
// ON_UNKNOWN=hold the key is held until an operator purges it, for a
// request the upstream never received. (The dial error here is not a
// *net.OpError, as when UPSTREAM_TIMEOUT runs out while the Transport
// waits for the new connection.)
func TestReview14bEmptyKeyedBodyResendNotForgotten(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"with-body", resendBody}, // the control: passes
		{"empty-body", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fault{mode: faultNothing}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Hold = true
				o.Transport = withFault(proxy.NewTransport(), f, false)
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up: status %d", r.StatusCode)
			}
			f.failDial.Store(true)
			f.armed.Store(true)
			key := "redial-" + tc.name
			r := e.do(req{key: key, body: tc.body})
			if f.failDial.Load() {
				t.Fatal("the Transport did not resend (the failing dial was not reached)")
			}
			if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeUnreachable {
				t.Errorf("status %d %s, want 502 %s: nothing was sent", r.StatusCode, r.body, typeUnreachable)
			}
			r2 := e.do(req{key: key, body: tc.body})
			if r2.StatusCode != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") == "true" {
				t.Errorf("client retry: %d replayed=%q %s, want it executed (201): the upstream never saw the first request",
					r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), r2.body)
			}
			if n := e.upstream.KeyCalls(key); n != 1 && r2.StatusCode == http.StatusCreated {
				t.Errorf("upstream executed key %s %d times, want 1", key, n)
			}
		})
	}
}
