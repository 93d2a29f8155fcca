package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// smallSendBuffers gives every accepted connection a small kernel send
// buffer, as a proxy under memory pressure (or with tuned tcp_wmem) has: a
// client that does not read then blocks the proxy's writes after a few KiB.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// dialSmallRcvbuf dials addr with a small receive buffer: a client that
// does not read stops taking bytes after a few KiB.
func dialSmallRcvbuf(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReviewDLKeyedEarlyHintsToStalledClientStillRecorded: a keyed request
// whose upstream answers at once, with a 103 Early Hints (a large Link
// header, as a page with many preloads sends) and then 201. The client
// stalls and does not read. The README ("A client that cannot take the
// answer in time"): each write of a keyed answer must finish within half of
// the UPSTREAM_TIMEOUT still left; past that the client is cut off, and the
// proxy still reads the upstream's answer to the end and records it, so
// the client's retry replays it.
//
// Defect (keyed.go exchange.WriteHeader, ex.arm = res.arm): a 1xx is
// written under the ordinary deadline, now + UPSTREAM_TIMEOUT (+ slack),
// not the slow-client one, and it is written from the Transport's readLoop
// goroutine (ReverseProxy's Got1xxResponse). While that write blocks, the
// Transport cannot read the final answer; ResponseHeaderTimeout (=
// UPSTREAM_TIMEOUT) fires first, the request ends in 504 "may have been
// executed", nothing is recorded, and the retry gets 409 (then, once the
// lock expires, executes again). Meanwhile the handler goroutine writes its
// 504 to the same ResponseWriter and result (writeBy) while readLoop is
// still inside its write: run with -race, the detector reports it.
func TestReviewDLKeyedEarlyHintsToStalledClientStillRecorded(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = time.Second
		o.Default.LockTTL = 4 * time.Second
	})
	var done atomic.Int32
	e.setUpstream(largeHintsThenCreated(&done))

	srv := smallBufferServer(t, e.h)

	c := dialSmallRcvbuf(t, srv.Listener.Addr().String())
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hints-stall\r\nContent-Length: 1\r\n\r\nb")
	// The client never reads. The upstream answers within milliseconds.
	for end := time.Now().Add(3 * time.Second); done.Load() == 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if done.Load() == 0 {
		t.Fatal("upstream never called")
	}

	// The retry (a fresh, fast client) must replay 201 once the first
	// request has had UPSTREAM_TIMEOUT (1 s) plus the record to finish.
	// Bounded: 6 tries over ~3 s.
	var last response
	for i := 0; i < 6; i++ {
		time.Sleep(500 * time.Millisecond)
		last = e.doTo(e.srv, req{key: "hints-stall", body: "b"})
		if last.StatusCode != http.StatusConflict {
			break
		}
	}
	c.Close()
	if last.StatusCode != http.StatusCreated || last.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after the upstream answered 201 at once: status %d, replayed %q (body %s); want the recorded 201 replayed",
			last.StatusCode, last.Header.Get("Idempotent-Replayed"), last.body)
	}
	if n := e.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

// largeHintsThenCreated is an upstream that answers at once: a 103 Early
// Hints with a ~200 KiB Link header, then 201 "done"; done counts its answers.
func largeHintsThenCreated(done *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", strings.Repeat("</a.css>; rel=preload, ", 200<<10/24)) // ~200 KiB
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
		done.Add(1)
	}
}

// smallBufferServer serves h on 127.0.0.1 with small kernel send buffers
// (smallSendBuffers), closed when the test ends.
func smallBufferServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}
