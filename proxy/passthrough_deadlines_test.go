package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// slowUpload sends a pass-through POST (no key) on a raw connection whose
// body of n pieces arrives one piece every gap: a slow but steady client,
// which the README allows ("a streamed request body must keep arriving, at
// most REQUEST_READ_TIMEOUT between reads"; "a stream that flows is never
// cut"). It returns the answer as read by a fast client, or the error that
// ended it.
func slowUpload(t *testing.T, e *env, path string, n int, gap time.Duration) (*http.Response, string, error) {
	t.Helper()
	c := dialProxy(t, e)
	t.Cleanup(func() { c.Close() })
	piece := "0123456789abcdef"
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", path, n*len(piece))
	for i := 0; i < n; i++ {
		time.Sleep(gap)
		if _, err := io.WriteString(c, piece); err != nil {
			return nil, "", fmt.Errorf("writing piece %d: %w", i, err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	var resp *http.Response
	var err error
	for range 5 { // skip informational answers (bounded)
		resp, err = http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode >= 200 {
			break
		}
	}
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestSlowUploadThenStreamedAnswer: a pass-through upload that
// flows for longer than UPSTREAM_TIMEOUT (each piece well within
// REQUEST_READ_TIMEOUT; the watchdog is paused while the client is read),
// then an upstream that answers at once, fully within its timeout.
//
// Defect (af8a375, handler.go ServeHTTP): ServeHTTP puts a write deadline
// of request start + UPSTREAM_TIMEOUT on the connection, and the pass-through
// path only moves it in statusWriter.Write. Anything written to the client
// before the first body Write goes out under the stale deadline:
//   - a streamed answer (chunked, or text/event-stream): ReverseProxy
//     flushes the headers at once (flushInterval -1) before any body byte;
//   - a 1xx (103 Early Hints) relayed by WriteHeader.
//
// That flush fails with a timeout; net/http then cancels the request and the
// bufio writer stays broken, so the client gets no answer at all, although
// its body flowed and the upstream answered in time. Before af8a375 the
// pass-through set no deadline until its first write.
//
// Correct: a pass-through answer is written under UPSTREAM_TIMEOUT per
// write (the README's promise), counted from when the answer is written,
// not from when the request started: statusWriter should extend the
// deadline in WriteHeader (1xx and final) and before flushes too.
func TestSlowUploadThenStreamedAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream func(w http.ResponseWriter)
	}{
		{"chunked", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			// The headers reach the proxy first; the body follows a moment
			// later (a streaming upstream). 300ms is far longer than the
			// proxy's immediate header flush; its only role is ordering.
			time.Sleep(300 * time.Millisecond)
			_, _ = io.WriteString(w, "done")
		}},
		{"event-stream", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Length", "11")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(300 * time.Millisecond)
			_, _ = io.WriteString(w, "data: done\n")
		}},
		{"early-hints", func(w http.ResponseWriter) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Length", "4")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "done")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				// 2s: the watchdog runs from the last piece until the answer's
				// headers, which takes milliseconds, but a loaded CI machine
				// (-race, packages in parallel) once stretched it past 1s.
				o.UpstreamTimeout = 2 * time.Second
				o.RequestReadTimeout = 2 * time.Second
			})
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				tc.upstream(w)
			})
			// 12 pieces, 200ms apart: 2.4s of upload, every gap a tenth of
			// REQUEST_READ_TIMEOUT; the whole upload outlasts UPSTREAM_TIMEOUT.
			resp, body, err := slowUpload(t, e, "/upload", 12, 200*time.Millisecond)
			if err != nil {
				t.Fatalf("ANSWER LOST: the client uploaded steadily and the upstream answered at once, but the client got: %v", err)
			}
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "done") {
				t.Fatalf("status %d body %q, want 200 with the upstream's body", resp.StatusCode, body)
			}
		})
	}
}

// blackhole returns the address of a loopback listener whose accept queue
// is full and never drained: the kernel drops further SYNs, so a dial to it
// hangs until the dialer's own timeout (net.Dialer.Timeout is 5s in
// NewTransport), as a dial to a firewalled or vanished upstream does.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the queue (backlog 0 holds one); then check that a dial hangs.
	for i := 0; i < 3; i++ {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // this dial hung: the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("could not fill the accept queue of a loopback listener on this kernel")
	return ""
}

// TestPassThroughDialThatHangsIsUnreachable: a pass-through request
// to an upstream whose dial hangs (no connection ever obtained), with an
// UPSTREAM_TIMEOUT below the dialer's 5s timeout.
//
// Defect (af8a375, passthrough.go watchdog + plainError): the watchdog runs
// from the start of the forward, dial included. When it fires during the
// dial, the Transport's getConn returns the context's cause
// (errUpstreamStalled, a DeadlineExceeded), which is not a dial *net.OpError,
// so plainError answers 504 upstream-timeout ("the request may have been
// executed"). Before af8a375 the dial ran into its own timeout and was 502
// upstream-unreachable, as the README's table and its "What counts as sent"
// define it (no connection obtained: the request never left). A client of a
// non-idempotent pass-through POST told "timed out" must assume it may have
// executed; it never left.
//
// Correct: 502 upstream-unreachable whenever no connection was obtained
// (track GotConn in passthrough as execute does; the watchdog's cause is a
// timeout only once a connection exists).
func TestPassThroughDialThatHangsIsUnreachable(t *testing.T) {
	addr := blackhole(t)
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = time.Second
		o.Upstream = &url.URL{Scheme: "http", Host: addr}
	})
	start := time.Now()
	r := e.do(req{path: "/upload", body: "no key: pass-through"})
	if r.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d after %v, want 502: no connection to the upstream was ever obtained", r.StatusCode, time.Since(start).Round(time.Millisecond))
	}
	if p := r.problem(t); p["type"] != "urn:idemproxy:problem:upstream-unreachable" {
		t.Errorf("problem type %v, want urn:idemproxy:problem:upstream-unreachable (the request never left)", p["type"])
	}
}
