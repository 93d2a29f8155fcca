package proxy_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestBufferBudgetIdleHeadersHoldNothing: MAX_BUFFERED_BYTES counts the body
// bytes that have arrived, never what a client declares. Four connections
// send the headers of keyed requests (two declaring 16 KiB, two 1 MiB) and
// not one byte of body; a legitimate keyed request with a 4-byte body is
// still served. (Found by review: chunks were taken before they were read
// into, so about 2048 idle connections held the default budget and every
// keyed request with a body got 503.)
func TestBufferBudgetIdleHeadersHoldNothing(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.RequestReadTimeout = 5 * time.Second
	}, func(t *testing.T, e *env) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for i, length := range []int{proxy.BodyChunk, proxy.BodyChunk, 1 << 20, 1 << 20} {
			c, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			// Headers only: not one byte of the body is ever sent.
			if _, err := fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: idle-%d\r\nContent-Length: %d\r\n\r\n", i, length); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 3*time.Second, "the four idle requests in the handler", func() bool {
			return counter(t, e.reg, "idemproxy_inflight_requests", nil) >= 4
		})
		time.Sleep(100 * time.Millisecond) // and in readBody
		t.Logf("idemproxy_buffered_bytes with 4 connections that sent 0 body bytes: %v (MAX_BUFFERED_BYTES=%d)",
			bufferedBytes(t, e), 4*proxy.BodyChunk)

		r := e.do(req{key: "legit", body: "tiny"})
		if r.StatusCode != http.StatusCreated {
			t.Errorf("legitimate keyed request with a 4-byte body while 4 clients sent headers and no body: status %d %s; want 201 "+
				"(connections that sent nothing must not hold MAX_BUFFERED_BYTES)", r.StatusCode, r.body)
		}
	})
}
