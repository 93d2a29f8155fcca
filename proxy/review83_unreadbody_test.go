package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview83RefusalWithUnsentBodyIsBounded (review 83): a request the
// proxy refuses before its body is read (an invalid key, a missing required
// key, a declared body over MAX_BODY_BYTES, a refused upgrade), or while
// reading it (a chunked body past the limit), leaves the body unread when
// the handler returns. net/http reads up to 256 KiB of it before writing the
// answer, to keep the connection: with no read deadline, a client that
// declares a body and never sends it held the connection for ever and never
// got its answer. It must get the answer within REQUEST_READ_TIMEOUT.
func TestReview83RefusalWithUnsentBodyIsBounded(t *testing.T) {
	const readTimeout = time.Second
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.RequestReadTimeout = readTimeout
		o.MaxBodyBytes = 10
		o.Routes, _ = proxy.ParseRoutes("POST /required required")
	})
	cases := []struct {
		name, head, body string
		status           int
	}{
		{"invalid key", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a,b\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"required key missing", "POST /required HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"declared body over MAX_BODY_BYTES", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Length: 100\r\n\r\n", "", http.StatusRequestEntityTooLarge},
		{"protocol upgrade refused", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"chunked body over MAX_BODY_BYTES, then stalled", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k2\r\nTransfer-Encoding: chunked\r\n\r\n", "14\r\n01234567890123456789\r\n", http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { expectAnswerWithoutBody(t, e, c.head+c.body, c.status, readTimeout) })
	}
}

// expectAnswerWithoutBody sends head (a request that declares a body it
// never sends, and whatever part of it is in head) and requires an answer of
// status within readTimeout and 4 s of slack.
func expectAnswerWithoutBody(t *testing.T, e *env, head string, status int, readTimeout time.Duration) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprint(conn, head); err != nil {
		t.Fatal(err)
	}
	// The rest of the body is never sent.
	_ = conn.SetReadDeadline(time.Now().Add(readTimeout + 4*time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within %v (REQUEST_READ_TIMEOUT=%v): %v", time.Since(start).Round(time.Millisecond), readTimeout, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	t.Logf("answered %d after %v", resp.StatusCode, time.Since(start).Round(time.Millisecond))
}
