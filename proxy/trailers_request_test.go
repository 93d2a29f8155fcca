package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestRequestTrailersReachTheUpstream: a chunked request's trailers (a
// checksum sent after the body, say) reach the upstream with their values,
// keyed or not: the proxy must not drop what the client sent. Those that
// RFC 9110 keeps out of trailers, or that the proxy sets or reads as
// headers, do not: an upstream that merged them into its headers would
// find a client's X-Forwarded-For or Authorization there.
func TestRequestTrailersReachTheUpstream(t *testing.T) {
	for _, key := range []string{"", "tr-1"} {
		name := "pass-through"
		if key != "" {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			keyLine := ""
			if key != "" {
				keyLine = "Idempotency-Key: " + key + "\r\n"
			}
			body, tr := trailerSend(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
				"Transfer-Encoding: chunked\r\nTrailer: X-Checksum, X-Forwarded-For, Authorization\r\n\r\n"+
				"5\r\nhello\r\n0\r\nX-Checksum: abc123\r\nX-Forwarded-For: 6.6.6.6\r\nAuthorization: Bearer other\r\n"+
				"Idempotency-Key: other\r\nHost: elsewhere\r\n\r\n")
			if body != "hello" || tr.Get("X-Checksum") != "abc123" {
				t.Errorf("the upstream got body %q, X-Checksum %q; want hello, abc123", body, tr.Get("X-Checksum"))
			}
			for _, k := range []string{"X-Forwarded-For", "Authorization", "Idempotency-Key", "Host", "Content-Length"} {
				if v := tr.Values(k); len(v) > 0 {
					t.Errorf("trailer %s: %q forwarded", k, v)
				}
			}
		})
	}
}

// TestRequestTrailersNotTheRoutesOwnHeaders: a route's scope= and
// key=header: names are the proxy's to read as headers, so not forwarded as
// trailers either.
func TestRequestTrailersNotTheRoutesOwnHeaders(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /hooks/* key=github scope=X-Tenant-Id")
	})
	_, tr := trailerSend(t, e, "POST /hooks/gh HTTP/1.1\r\nHost: x\r\nX-GitHub-Delivery: d-1\r\nX-Tenant-Id: t-1\r\nTransfer-Encoding: chunked\r\n"+
		"Trailer: X-Checksum, X-Tenant-Id, X-GitHub-Delivery\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-Tenant-Id: t-2\r\nX-GitHub-Delivery: d-2\r\n\r\n")
	if tr.Get("X-Checksum") != "abc" || tr.Get("X-Tenant-Id") != "" || tr.Get("X-GitHub-Delivery") != "" {
		t.Errorf("the upstream got trailers %v, want only X-Checksum", tr)
	}
}

// trailerSend sends raw (one request) on a new connection, waits for its
// answer (201) and returns the body and the trailers the upstream read.
func trailerSend(t *testing.T, e *env, raw string) (string, http.Header) {
	t.Helper()
	type got struct {
		body string
		tr   http.Header
	}
	ch := make(chan got, 1)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- got{string(b), r.Trailer.Clone()}
		w.WriteHeader(http.StatusCreated)
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, raw)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	select {
	case g := <-ch:
		return g.body, g.tr
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream was not called")
	}
	return "", nil
}
