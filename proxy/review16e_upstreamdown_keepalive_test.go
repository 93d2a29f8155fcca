package proxy_test

import (
	"bufio"
	"net"
	"net/http"
	"net/url"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview16eUpstreamDownKeepsConnection: the upstream refuses the
// connection (down, or restarting in a deploy) and a pass-through request
// with a body, sent whole by the client, gets the proxy's 502. The
// Transport never read the body: it closed it, and net/http's server body
// drains the rest on Close (up to 256 KiB, to its end here). idleBody counts
// only its own reads, so complete() is false and statusWriter adds
// "Connection: close": every client connection that sends a POST while the
// upstream is down is dropped, where before 44bf381 it was kept (net/http
// saw the body closed at its end and reused the connection). A GET, with no
// body, keeps it still.
func TestReview16eUpstreamDownKeepsConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: the dial is refused
	for name, raw := range map[string]string{
		"content-length": "POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"chunked":        "POST /v1/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Upstream, _ = url.Parse(down) })
			c := dialProxy(t, e)
			defer c.Close()
			br := bufio.NewReader(c)
			for i := range 2 {
				resp := sendOn(t, c, br, raw, i)
				if resp.StatusCode != http.StatusBadGateway {
					t.Fatalf("request %d: status %d, want 502", i, resp.StatusCode)
				}
				if resp.Close {
					t.Fatalf("request %d: 502 with Connection: close; the client sent its whole body, the connection can be kept", i)
				}
			}
		})
	}
}
