package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview16HalfClosedClientGetsNoFakeSuccess: a client that sends its
// whole request, half-closes (shutdown write: "I have nothing more to
// send") and waits for the answer is not told 200 OK for a forward that
// was abandoned. net/http cancels the request on the half-close (its
// background read sees EOF); plainError then returns without writing, and
// net/http finishes the request with its implicit "200 OK", Content-Length
// 0 -- a success, while the access log and idemproxy_responses_total say 499
// and the upstream (non-idempotent, no key) may have executed the request.
func TestReview16HalfClosedClientGetsNoFakeSuccess(t *testing.T) {
	for _, tc := range []struct{ name, req string }{
		{"HTTP/1.1 with a body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb"},
		{"HTTP/1.1 without a body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"},
		{"HTTP/1.0", "POST /v1/orders HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nb"},
		{"GET", "GET /v1/orders HTTP/1.1\r\nHost: x\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 5 * time.Second })
			arrived := make(chan struct{}, 1)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				arrived <- struct{}{}
				select { // the order is placed; the answer takes a moment
				case <-r.Context().Done():
				case <-time.After(2 * time.Second):
				}
				w.WriteHeader(http.StatusCreated)
			})
			c := dialProxy(t, e)
			defer c.Close()
			fmt.Fprint(c, tc.req)
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream did not get the request within 5 s")
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, _ := io.ReadAll(c)
			status := strings.SplitN(string(got), "\r\n", 2)[0]
			if strings.HasPrefix(status, "HTTP/1.1 2") || strings.HasPrefix(status, "HTTP/1.0 2") {
				t.Errorf("a half-closed client still waiting was told %q for a forward the proxy abandoned:\n%s", status, got)
			}
			line := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
			t.Logf("client read %q; access line %s", status, line)
		})
	}
}

// TestReview16HalfClosedKeyedWaiterGetsNoFakeSuccess: the same for the
// keyed duplicate that waits (WAIT_TIMEOUT) for an in-flight first request,
// which the README's new paragraph also calls 499: its answer (typ "")
// writes nothing, and net/http's implicit 200 reaches a client that
// half-closed and is still reading. Pre-existing (claimAnswer's 499), but
// the same "499 writes nothing" that d340fa7 extends to pass-through.
func TestReview16HalfClosedKeyedWaiterGetsNoFakeSuccess(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Default.Wait = 30 * time.Second })
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() { first <- e.do(req{key: "hc", body: "b"}) }()
	g.wait(t)
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hc\r\nContent-Length: 1\r\n\r\nb")
	eventually(t, 5*time.Second, "the duplicate polls Redis", func() bool {
		return counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "inflight"}) >= 1
	})
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	status := strings.SplitN(string(got), "\r\n", 2)[0]
	if strings.HasPrefix(status, "HTTP/1.1 2") {
		t.Errorf("a half-closed duplicate still waiting was told %q, though nothing was executed or replayed for it:\n%s", status, got)
	}
	g.open()
	<-first
}
