package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReviewPTEarlyHintsDuringPausedUpload: a pass-through upload whose
// client pauses between two pieces of its body for longer than
// UPSTREAM_TIMEOUT but well within REQUEST_READ_TIMEOUT (legal: the README
// bounds a streamed body only "between reads" by REQUEST_READ_TIMEOUT, and
// the watchdog is paused while the body is read). The upstream sends a
// small 103 Early Hints during that pause; the client reads promptly.
//
// Defect (passthrough.go watchdog.pause / left): pause stops the timer
// but leaves `due` where the last resume (or the creation) put it, so
// during a long body read `due` is in the past. statusWriter.WriteHeader
// then computes half of a negative time left, and writeBy puts a write
// deadline in the past on the connection: the 103 write fails at once,
// net/http marks the connection broken and cancels the request, and the
// prompt client gets neither the 103 nor the upstream's 201. Before
// 78a664a the 103 was written under UPSTREAM_TIMEOUT (arm) and all went
// through. While paused, the upstream has at least UPSTREAM_TIMEOUT left.
// Fixed: a paused watchdog leaves the upstream all of UPSTREAM_TIMEOUT
// (watchdog.left).
func TestReviewPTEarlyHintsDuringPausedUpload(t *testing.T) {
	const d = 500 * time.Millisecond
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = d
		o.RequestReadTimeout = 5 * time.Second
	})
	started := make(chan struct{})
	send103 := make(chan struct{})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-send103:
		case <-time.After(5 * time.Second):
		}
		w.Header().Set("Link", "</a.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})

	c, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// No Idempotency-Key: a pass-through. The body (1 byte) comes later.
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n")
	select {
	case <-started:
	case <-time.After(3 * time.Second):
		t.Fatal("upstream never called")
	}
	// The client takes 3 UPSTREAM_TIMEOUTs (1.5 s of its 5 s
	// REQUEST_READ_TIMEOUT) before the body's byte; meanwhile the
	// upstream sends its 103. This wait is the scenario, not a race: the
	// watchdog's `due` (its creation + 0.5 s) is then 1 s in the past.
	time.Sleep(3 * d)
	close(send103)

	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	first, err := http.ReadResponse(br, nil)
	if err != nil {
		// Show what the client gets then: it sends its byte and waits.
		_, _ = io.WriteString(c, "b")
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		rest, rerr := io.ReadAll(br)
		t.Fatalf("prompt client, 103 sent during its (legal) body pause: reading the 103: %v; after sending the body byte the client read %q (%v)\nproxy log:\n%s",
			err, rest, rerr, e.logs)
	}
	if first.StatusCode != http.StatusEarlyHints {
		t.Fatalf("first answer %d, want 103", first.StatusCode)
	}
	_, _ = io.WriteString(c, "b")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	final, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the final answer: %v", err)
	}
	body, _ := io.ReadAll(final.Body)
	if final.StatusCode != http.StatusCreated || string(body) != "b" {
		t.Errorf("final answer %d %q, want 201 \"b\"", final.StatusCode, body)
	}
	if strings.Contains(e.logs.String(), "context canceled") {
		t.Errorf("request canceled:\n%s", e.logs)
	}
}
