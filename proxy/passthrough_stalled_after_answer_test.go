package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestPassthroughBodyStalledAfterTheAnswerBegan: an upstream may answer
// before it has the whole request body (full duplex). When the client's
// body then stalls past REQUEST_READ_TIMEOUT, net/http cancels the request
// and the answer is cut short: the request's log says why, as a warning
// with its request_id, and does not blame the upstream. (The access line
// alone says the upstream's 200.)
func TestPassthroughBodyStalledAfterTheAnswerBegan(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 5 * time.Second
		o.RequestReadTimeout = 300 * time.Millisecond
	})
	e.setUpstream(streamEarly(nil, 300))
	c := dialProxy(t, e)
	defer c.Close()
	// The first chunk, then nothing: the body stalls.
	fmt.Fprint(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 200") {
		t.Fatalf("the answer did not begin before the body stalled: %q (%v)", got, err)
	}
	waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
	line := logLine(e.logs, "request body stalled")
	if line == "" || !strings.Contains(line, `"level":"warn"`) || !strings.Contains(line, `"request_id"`) {
		t.Errorf("no warning of the request says its body stalled after the answer began:\n%s", e.logs)
	}
	if strings.Contains(e.logs.String(), "upstream answer broke off") {
		t.Errorf("the upstream was blamed:\n%s", e.logs)
	}
}

// TestPassthroughBodyStalledBeforeTheAnswer: the same stall before any
// answer is the 408 of plainError, told once, not also as a cut answer.
func TestPassthroughBodyStalledBeforeTheAnswer(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 5 * time.Second
		o.RequestReadTimeout = 300 * time.Millisecond
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // waits for the whole body
		w.WriteHeader(http.StatusCreated)
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 408") {
		t.Fatalf("answer %q, want 408", got)
	}
	waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
	if logLine(e.logs, "request body stalled; forward abandoned") == "" || logLine(e.logs, "after the answer began") != "" {
		t.Errorf("want the 408's warning alone:\n%s", e.logs)
	}
}

// TestPassthroughKeepAliveAfterWholeBody: an answer that comes after the
// whole body (as nearly every upstream answers) leaves the connection open
// for the next request, chunked or with a length; only an answer before the
// body is all in closes it (TestReview16dCompleteAnswerThenBodyStall).
func TestPassthroughKeepAliveAfterWholeBody(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	})
	c := dialProxy(t, e)
	defer c.Close()
	br := bufio.NewReader(c)
	for i, raw := range []string{
		"POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"POST /v1/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST /v1/c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
	} {
		resp := sendOn(t, c, br, raw, i)
		if resp.StatusCode != http.StatusCreated || resp.Close {
			t.Fatalf("request %d: status %d, Connection: close %v; want 201 on a connection kept open", i, resp.StatusCode, resp.Close)
		}
	}
}

// TestPassthroughUpstreamDownTrickleBounded: when the upstream is down, the
// body read before the 502 (to keep the connection) is bounded in time as
// well as in bytes: a client that trickles a byte per read, each within
// REQUEST_READ_TIMEOUT, gets its 502 within about twice that, not after
// its whole body.
func TestPassthroughUpstreamDownTrickleBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: the dial is refused
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Upstream, _ = url.Parse(down)
		o.RequestReadTimeout = 300 * time.Millisecond
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nb")
	answered := make(chan string, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		answered <- line
	}()
	start := time.Now()
	for i := 0; i < 60; i++ { // a byte every 100 ms, at most 6 s
		select {
		case line := <-answered:
			if !strings.HasPrefix(line, "HTTP/1.1 502") {
				t.Fatalf("answer %q, want 502", line)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("502 after %v of trickling; want it within about 2×REQUEST_READ_TIMEOUT (300 ms)", d)
			}
			return
		case <-time.After(100 * time.Millisecond):
			_, _ = c.Write([]byte("b"))
		}
	}
	t.Fatal("no answer within 6 s of a trickling body to an upstream that is down")
}

// streamEarly is an upstream that answers 200 once it has the body's first
// 3 bytes (full duplex: it does not wait for the rest) and streams a tick
// every 10 ms, at most ticks, until its request ends. answered, when not
// nil, gets a value once the first tick is flushed.
func streamEarly(answered chan<- struct{}, ticks int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		buf := make([]byte, 3)
		_, _ = io.ReadFull(r.Body, buf) // the first chunk: the Transport is sending the body
		w.WriteHeader(http.StatusOK)
		for i := range ticks {
			if _, err := io.WriteString(w, "tick\n"); err != nil || rc.Flush() != nil {
				return
			}
			if i == 0 && answered != nil {
				answered <- struct{}{}
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}
