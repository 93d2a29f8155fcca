package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// largeHints: a 103 Early Hints the size a page with many preloads sends
// (~200 KiB): a client that starts reading it late keeps its write going.
var largeHints = strings.Repeat("</a.css>; rel=preload, ", 200<<10/24) + "</b.js>; rel=preload"

// continueAfterLargeHints runs a pass-through request with "Expect:
// 100-continue" whose upstream sends a large 103 at once and reads the body
// after. The Transport waits ExpectContinueTimeout (1 s) for the upstream's
// 100, then reads the body: that first read makes net/http's server write
// its automatic "100 Continue" on the Transport's writeLoop, while the 103
// is still being written on its readLoop (the client, with a small receive
// buffer, starts reading only at 1.5 s: the scenario, not a race; it has
// UPSTREAM_TIMEOUT/2 = 5 s for the 103). The client must get the 103 intact,
// a 100, then (having sent its body) 201 with the body echoed.
func continueAfterLargeHints(t *testing.T, framing, body string) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 10 * time.Second
		o.RequestReadTimeout = 10 * time.Second
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", largeHints)
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
	srv := smallBufferServer(t, e.h)

	c := dialSmallRcvbuf(t, srv.Listener.Addr().String())
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n%s\r\n\r\n", framing)
	time.Sleep(1500 * time.Millisecond) // a client slow to start reading (see above)

	br := bufio.NewReaderSize(c, 1<<20)
	var codes []int
	sent := false
	for i := 0; i < 5; i++ { // 103, 100, [the upstream's 100], 201
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after %v: %v", codes, err)
		}
		codes = append(codes, res.StatusCode)
		switch res.StatusCode {
		case http.StatusEarlyHints:
			if got := res.Header.Get("Link"); got != largeHints {
				i := 0
				for i < len(got) && i < len(largeHints) && got[i] == largeHints[i] {
					i++
				}
				t.Fatalf("103 Link header corrupted at byte %d of %d (got %d bytes): ...%q...",
					i, len(largeHints), len(got), got[max(0, i-20):min(len(got), i+60)])
			}
		case http.StatusContinue:
			if !sent {
				_, _ = io.WriteString(c, body)
				sent = true
			}
		default:
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusCreated || string(b) != "b" {
				t.Fatalf("answers %v, final body %q; want 103, 100, 201 \"b\"", codes, b)
			}
			if codes[0] != http.StatusEarlyHints || !sent {
				t.Fatalf("answers %v; want 103 then 100 then 201", codes)
			}
			return
		}
	}
	t.Fatalf("answers %v: no final answer", codes)
}

// TestReviewPT2LengthContinueAfterLargeHints: control, a body with a
// Content-Length: the commit's empty first read under
// statusWriter.informational orders the 100 after the 103. Passes.
func TestReviewPT2LengthContinueAfterLargeHints(t *testing.T) {
	continueAfterLargeHints(t, "Content-Length: 1", "b")
}

// TestReviewPT2ChunkedContinueAfterLargeHints: the same with a chunked body
// (curl sends "Expect: 100-continue" for an upload of unknown size, which it
// sends chunked). net/http wraps it in expectContinueReader all the same
// (server.go: req.ContentLength != 0, and it is -1), but passthrough.go
// leaves it out of the lock (r.ContentLength > 0), so the automatic 100 is
// written into the bufio.Writer the readLoop is flushing the 103 through:
// the 103's header is corrupted on the wire (or -race reports the two
// goroutines writing conn.bufw).
func TestReviewPT2ChunkedContinueAfterLargeHints(t *testing.T) {
	continueAfterLargeHints(t, "Transfer-Encoding: chunked", "1\r\nb\r\n0\r\n\r\n")
}
