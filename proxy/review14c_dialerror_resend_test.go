package proxy_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview14cDialErrorAfterUnreportedResend: an empty keyed POST goes as
// http.NoBody. Its write to a reused connection reaches the socket whole
// while the layer above reports (0, error) (faultUnreported: the model
// TestResendNeverOnceBytesReachedTheSocket uses for crypto/tls), so the
// Transport resends it without asking GetBody (exchange.rewind never vets
// it). The resend's dial then fails with a real *net.OpError{Op: "dial"}
// (an upstream that reset its connections and now refuses new ones).
//
// exchange.left() is true here (the first attempt's connection, still in
// ex.conn, counted the request's bytes), but execute decides with
// `!ex.left() || (isDialError(ex.upErr) && !ex.leftBefore.Load())`:
// leftBefore is computed only in gotConnection, which the failed dial never
// reaches, so the dial error alone releases the claim and the client's
// retry executes the request a second time.
//
// (TestReview14bEmptyKeyedBodyResendNotForgotten's failDial error is not a
// *net.OpError, which is why it does not see this.)
func TestReview14cDialErrorAfterUnreportedResend(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold bool
	}{
		{"default", false},
		{"hold", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fault{mode: faultUnreported}
			var refuse, refused atomic.Bool
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Hold = tc.hold
				tr := withFault(proxy.NewTransport(), f, false)
				dial := tr.DialContext
				tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
					if refuse.CompareAndSwap(true, false) {
						refused.Store(true)
						return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
					}
					return dial(ctx, network, addr)
				}
				o.Transport = tr
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up: status %d", r.StatusCode)
			}
			// The copy that reaches the upstream is held until the proxy has
			// answered, so that its 201 cannot beat the write error.
			key := "review14c-" + tc.name
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			t.Cleanup(open)
			var calls atomic.Int64
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Idempotency-Key") == key && calls.Add(1) == 1 {
					select {
					case <-release:
					case <-time.After(5 * time.Second):
					}
				}
				e.created(w, r)
			})
			refuse.Store(true)
			f.armed.Store(true)
			r := e.do(req{key: key, body: ""})
			open()
			t.Logf("client got %d %s (dials %d, resend's dial refused: %v)", r.StatusCode, r.body, f.dials.Load(), refused.Load())
			if !refused.Load() {
				t.Fatal("the Transport did not resend (the refused dial was not reached)")
			}
			eventually(t, 5*time.Second, "the upstream receives the copy that reached its socket", func() bool {
				return e.upstream.KeyCalls(key) >= 1
			})
			if r.StatusCode == http.StatusBadGateway && problemType(t, r) == typeUnreachable {
				t.Errorf("status 502 %s: the request reached the upstream, yet the proxy says it was not sent and released the claim", typeUnreachable)
			}
			r2 := e.do(req{key: key, body: ""})
			t.Logf("client retry got %d replayed=%q %s", r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), r2.body)
			if n := e.upstream.KeyCalls(key); n > 1 {
				t.Errorf("DOUBLE EXECUTION: upstream executed key %s %d times", key, n)
			}
		})
	}
}
