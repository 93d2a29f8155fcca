package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestNoInformationalToHTTP10: RFC 9110 section 15.2, a server must not
// send a 1xx to an HTTP/1.0 client. An upstream's 103 Early Hints is
// relayed to HTTP/1.1 clients only, keyed or not; the HTTP/1.0 client's
// first answer is the final one (pass-through: reviewPT2_expect_test.go,
// for a 100 Continue).
func TestNoInformationalToHTTP10(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 5 * time.Second })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	for _, tc := range []struct{ name, proto, key string }{
		{"keyed HTTP/1.0", "HTTP/1.0", "Idempotency-Key: k10\r\n"},
		{"pass-through HTTP/1.0", "HTTP/1.0", ""},
		{"keyed HTTP/1.1", "HTTP/1.1", "Idempotency-Key: k11\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "POST /v1/orders %s\r\nHost: x\r\n%sContent-Length: 1\r\n\r\nb", tc.proto, tc.key)
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			want := http.StatusCreated
			if tc.proto == "HTTP/1.1" {
				want = http.StatusEarlyHints // still relayed to HTTP/1.1
			}
			if res.StatusCode != want {
				t.Errorf("first answer %d, want %d", res.StatusCode, want)
			}
		})
	}
}
