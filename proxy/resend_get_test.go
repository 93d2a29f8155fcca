package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestKeyedBodilessRequestIsNeverResent: a ROUTES rule may cover GET (a legacy API with
// a non-idempotent GET). A keyed GET has no body, so ReverseProxy sends it
// with Body=nil: the Transport's rewindBody never calls the GetBody guard, and
// isReplayable is true for GET whatever the header's case. When the pooled
// connection breaks after the request was written, the Transport resends it.
func TestKeyedBodilessRequestIsNeverResent(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			var executed atomic.Int64
			var hungUp atomic.Bool
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			defer ln.Close()
			go func() {
				for range 20 {
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
							io.ReadAll(r.Body)
							if r.Header.Get("Idempotency-Key") == "dup" {
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
			routes, err := proxy.ParseRoutes(method + " /v1/send-sms")
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Upstream, _ = url.Parse("http://" + ln.Addr().String())
				o.Routes = routes
			})
			e.do(req{method: method, path: "/v1/send-sms"}) // no key: warms a pooled upstream connection
			r := e.do(req{method: method, path: "/v1/send-sms", key: "dup"})
			t.Logf("client got %d %q", r.StatusCode, r.body)
			if n := executed.Load(); n != 1 {
				t.Errorf("DOUBLE EXECUTION: upstream executed keyed %s %d times for one client request", method, n)
			}
		})
	}
}
