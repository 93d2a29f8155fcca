package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// hangUpOnce is an upstream (raw TCP, keep-alive) that counts requests
// carrying key and, the first time, hangs up after reading one, before
// answering: the request was written and executed, its outcome unknown.
func hangUpOnce(t *testing.T, key string) (*url.URL, *atomic.Int64) {
	t.Helper()
	var executed atomic.Int64
	var hungUp atomic.Bool
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for range 50 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for range 100 {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					if r.Header.Get("Idempotency-Key") == key {
						executed.Add(1)
						if hungUp.CompareAndSwap(false, true) {
							return // executed, then hang up before answering
						}
					}
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}(c)
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	return u, &executed
}

// TestTransportNeverResendsAWrittenKeyedRequest: net/http's Transport
// resends a request carrying the canonical Idempotency-Key header when a
// pooled connection breaks after the request was written.
func TestTransportNeverResendsAWrittenKeyedRequest(t *testing.T) {
	upstream, executed := hangUpOnce(t, "dup")
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Upstream = upstream })
	e.do(req{body: "warm"}) // pooled upstream connection
	r := e.do(req{key: "dup", body: `{"amount":100}`})
	if r.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 (outcome unknown, claim kept)", r.StatusCode)
	}
	if n := executed.Load(); n != 1 {
		t.Errorf("DOUBLE EXECUTION: upstream executed key dup %d times for one client request", n)
	}
}

// TestStalledClientDoesNotBlockRecording: a client that stops reading must
// not hold the upstream copy until UPSTREAM_TIMEOUT cuts it (which would
// leave the answer unrecorded, and its retry would execute again).
func TestStalledClientDoesNotBlockRecording(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 2 * time.Second
		o.Default.LockTTL = 4 * time.Second
	})
	big := strings.Repeat("x", 16<<20) // more than socket buffers hold
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		_, _ = io.WriteString(w, big)
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: stall\r\nContent-Length: 1\r\n\r\nx")
	line, _ := bufio.NewReader(c).ReadString('\n') // then stop reading
	t.Logf("stalled client got %q", strings.TrimSpace(line))
	eventually(t, 10*time.Second, "the stalled request ends", func() bool {
		return counter(t, e.reg, "idemproxy_requests_total", nil) >= 1
	})
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "executed"}); got != 1 {
		t.Fatalf("stalled request outcome: executed=%v, want the answer recorded", got)
	}
	r := e.do(req{key: "stall", body: "x"})
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d replayed=%q, want a replay", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
	}
	if n := e.calls.Load(); n != 1 {
		t.Errorf("DOUBLE EXECUTION: upstream called %d times for key stall", n)
	}
}
