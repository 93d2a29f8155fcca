package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestRequestTrailersReachTheUpstream: a chunked request's trailers (a
// checksum sent after the body, say) reach the upstream with their values,
// keyed or not: the proxy must not drop what the client sent.
func TestRequestTrailersReachTheUpstream(t *testing.T) {
	for _, key := range []string{"", "tr-1"} {
		name := "pass-through"
		if key != "" {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			got := make(chan string, 1)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got <- string(b) + "|" + r.Trailer.Get("X-Checksum")
				w.WriteHeader(http.StatusCreated)
			})
			c := dialProxy(t, e)
			defer c.Close()
			keyLine := ""
			if key != "" {
				keyLine = "Idempotency-Key: " + key + "\r\n"
			}
			fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n%sTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"+
				"5\r\nhello\r\n0\r\nX-Checksum: abc123\r\n\r\n", keyLine)
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
			case s := <-got:
				if s != "hello|abc123" {
					t.Errorf("the upstream got body|trailer %q, want %q", s, "hello|abc123")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream was not called")
			}
		})
	}
}
