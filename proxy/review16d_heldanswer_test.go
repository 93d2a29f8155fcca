package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview16dCompleteAnswerThenBodyStall: an upstream answers in full
// (Content-Length) before it has the whole request body, and the client's
// body then stalls. The passthrough's deferred func clears the read
// deadline when the handler returns; net/http then flushes the answer only
// after discarding the rest of the request body (no full duplex), a read
// that now has no deadline. The client never gets the complete 200 and the
// connection is held, past REQUEST_READ_TIMEOUT, for as long as the client
// keeps it open; nothing is logged but the access line's 200.
func TestReview16dCompleteAnswerThenBodyStall(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = time.Second
		o.RequestReadTimeout = 300 * time.Millisecond
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		// Answers at once, then drains the body it does not need (as a
		// server that answers 401 or 413 early may).
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		buf := make([]byte, 3)
		_, _ = io.ReadFull(r.Body, buf)
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "hello")
		_ = rc.Flush()
		_, _ = io.Copy(io.Discard, r.Body)
	})
	c := dialProxy(t, e)
	defer c.Close()
	// The first chunk, then nothing.
	fmt.Fprint(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
	waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
	// Ten times REQUEST_READ_TIMEOUT, three times UPSTREAM_TIMEOUT.
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := io.ReadAll(c)
	t.Logf("client got %q, %v", got, err)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("3 s after the upstream's complete answer (REQUEST_READ_TIMEOUT 300ms), the client has %q and the connection is still open", got)
	}
	if strings.HasPrefix(string(got), "HTTP/1.1 200") && !strings.HasSuffix(string(got), "hello") {
		t.Errorf("a 200 without its body: %q", got)
	}
}

// TestReview16dFullDuplexBodyReachesUpstreamWhole: an upstream that answers
// (and flushes) before it has read the whole body, then reads the rest
// (the full duplex case 0d91a08 is about). The proxy's server is not in
// full-duplex mode: when the answer's headers are flushed, net/http
// discards the request body still to come (up to 256 KiB) on the handler's
// goroutine, racing the Transport, which forwards it. The upstream gets a
// body with holes and answers 200 as if it were whole.
func TestReview16dFullDuplexBodyReachesUpstreamWhole(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 5 * time.Second })
	got := make(chan int64, 1)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		buf := make([]byte, 3)
		_, _ = io.ReadFull(r.Body, buf)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "tick\n")
		_ = rc.Flush()
		n, _ := io.Copy(io.Discard, r.Body)
		got <- n + 3
		_, _ = io.WriteString(w, "done\n")
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
	sent := int64(3)
	for range 20 { // at most 20 chunks, 20 ms apart
		<-time.After(20 * time.Millisecond)
		fmt.Fprintf(c, "400\r\n%s\r\n", strings.Repeat("y", 1024))
		sent += 1024
	}
	fmt.Fprint(c, "0\r\n\r\n")
	select {
	case n := <-got:
		if n != sent {
			t.Errorf("the client sent %d body bytes, the upstream received %d", sent, n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not read the body's end within 5 s")
	}
}
