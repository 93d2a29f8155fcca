package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview14KeyedEmptyBodyKeepsContentLength: a keyed POST, PUT or PATCH
// with an empty body (Content-Length: 0, as a capture or confirm call
// sends it) must reach the upstream as Content-Length: 0, as the same
// request without a key does. The keyed ReverseProxy's Rewrite gives an
// empty body a non-nil io.NopCloser(strings.NewReader("")) (so that the
// Transport asks GetBody before resending a bodiless request); with
// ContentLength 0 and a non-nil Body, Request.outgoingLength is -1
// (unknown), and the Transport sends POST, PUT and PATCH with
// Transfer-Encoding: chunked and a zero-size chunk. An upstream that
// requires a length (411 Length Required: many legacy servers, WAFs and
// gateways), or speaks HTTP/1.0, refuses or misreads every keyed empty
// request that it accepts without a key.
func TestReview14KeyedEmptyBodyKeepsContentLength(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		o.Methods = []string{"POST", "PUT", "PATCH"}
	}, func(t *testing.T, e *env) {
		// A legacy upstream: no chunked request bodies.
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if len(r.TransferEncoding) > 0 || r.Header.Get("Content-Length") == "" {
				w.WriteHeader(http.StatusLengthRequired)
				fmt.Fprintf(w, "te=%v content-length=%q", r.TransferEncoding, r.Header.Get("Content-Length"))
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "content-length=%s", r.Header.Get("Content-Length"))
		})
		for _, method := range []string{"POST", "PUT", "PATCH"} {
			path := "/v1/charges/ch_1/capture"
			unkeyed := e.do(req{method: method, path: path})
			keyed := e.do(req{method: method, path: path, key: "empty-" + strings.ToLower(method)})
			if unkeyed.StatusCode != http.StatusCreated {
				t.Fatalf("%s without a key: %d %s (the test upstream refuses it too)", method, unkeyed.StatusCode, unkeyed.body)
			}
			if keyed.StatusCode != http.StatusCreated {
				t.Errorf("%s with a key, empty body: upstream answered %d %s; without a key it got %s",
					method, keyed.StatusCode, keyed.body, unkeyed.body)
			}
		}
	})
}
