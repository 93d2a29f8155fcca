package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// resetConn is an upstream connection whose next write, once armed, fails
// before a byte of it leaves: the upstream (or a load balancer in front of
// it, such as one that resets idle connections) had reset the pooled
// connection, and the reset reached the proxy's write before its read loop
// noticed it. The Transport sees nothingWrittenError on a reused connection,
// which it retries on a fresh one.
type resetConn struct {
	net.Conn
	armed *atomic.Bool
}

// NetConn names the connection under resetConn, as crypto/tls does: the
// proxy judges "nothing written" by the bytes that reached the socket of
// the connection NewTransport dialed (its write counter, under this
// layer), and refuses a resend through a layer that hides it. resetConn
// stands for the socket failing, under every layer.
func (c resetConn) NetConn() net.Conn { return c.Conn }

func (c resetConn) Write(p []byte) (int, error) {
	if c.armed.CompareAndSwap(true, false) {
		return 0, &net.OpError{Op: "write", Net: "tcp", Addr: c.RemoteAddr(), Err: syscall.ECONNRESET}
	}
	return c.Conn.Write(p)
}

// TestReview14NothingWrittenKeyedRequestIsRetried: a keyed request whose
// write to a pooled upstream connection fails with nothing sent is safe to
// send again, and net/http's Transport retries it on a new connection
// (nothingWrittenError on a reused connection) after rewinding the body
// with GetBody. keyed.go sets GetBody for exactly this ("lets the transport
// resend on a pooled connection that the upstream had already closed before
// anything was written to it"), but its guard refuses whenever
// httptrace.WroteHeaders has fired, and WroteHeaders fires when the headers
// go into the Transport's bufio.Writer, before any byte reaches the socket.
// The Transport only asks GetBody once the body was read or closed, which is
// always after WroteHeaders: the guard never lets a retry through. The client
// gets 502 "may have been executed" for a request the upstream never saw, and
// its key is stuck (409 until the lock TTL, or held until an operator purges
// it with ON_UNKNOWN=hold). Pre-existing: it fails the same way at e3bccc3^
// (there the failed header flush closed the body, which also sends the
// Transport to GetBody); e3bccc3 does not change it.
func TestReview14NothingWrittenKeyedRequestIsRetried(t *testing.T) {
	for _, hold := range []bool{false, true} {
		name := "release"
		if hold {
			name = "hold"
		}
		t.Run(name, func(t *testing.T) {
			var armed atomic.Bool
			var dials atomic.Int64
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Hold = hold
				tr := proxy.NewTransport()
				dial := tr.DialContext
				tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := dial(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					dials.Add(1)
					return resetConn{c, &armed}, nil
				}
				o.Transport = tr
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated { // one pooled connection
				t.Fatalf("warm-up: status %d", r.StatusCode)
			}
			armed.Store(true)
			body := `{"amount":100,"note":"` + strings.Repeat("x", 200) + `"}`
			r := e.do(req{key: "reset-1", body: body})
			t.Logf("client got %d %s (dials %d, upstream calls %d)", r.StatusCode, r.body, dials.Load(), e.calls.Load())
			if r.StatusCode != http.StatusCreated {
				t.Errorf("status %d, want 201: nothing was written to the reset connection, so the Transport's retry on a new one must go through", r.StatusCode)
			}
			if n := e.upstream.KeyCalls("reset-1"); n != 1 {
				t.Errorf("upstream executed key reset-1 %d times, want 1", n)
			}
			// The client's own retry must then be a replay, not a 409 or a held 502.
			r2 := e.do(req{key: "reset-1", body: body})
			if r2.StatusCode != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("client retry: %d replayed=%q %s, want the 201 replayed", r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), r2.body)
			}
		})
	}
}
