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

func TestTransportNeverResendsAWrittenKeyedRequest(t *testing.T) {
	var executed atomic.Int64
	var hungUp atomic.Bool
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; i < 100; i++ {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.ReadAll(r.Body)
					if r.Header.Get("Idempotency-Key") == "dup" {
						executed.Add(1)
						if hungUp.CompareAndSwap(false, true) {
							return // executed, then hang up before answering
						}
					}
					fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
				}
			}(c)
		}
	}()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Upstream, _ = url.Parse("http://" + ln.Addr().String()) })
	e.do(req{body: "warm"}) // pooled upstream connection
	r := e.do(req{key: "dup", body: `{"amount":100}`})
	t.Logf("client got %d %q", r.StatusCode, r.body)
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
