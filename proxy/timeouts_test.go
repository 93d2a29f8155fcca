package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// dialProxy opens a raw connection to the proxy under test.
func dialProxy(t *testing.T, e *env) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(e.srv.URL, "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sendOn writes one raw request on c and reads its answer through br
// (within 5 s), body drained; step names it in a failure.
func sendOn(t *testing.T, c net.Conn, br *bufio.Reader, raw string, step int) *http.Response {
	t.Helper()
	fmt.Fprint(c, raw)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("request %d on the same connection: %v", step, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestSlowKeyedBodyTimesOut: a keyed request whose body does not arrive
// within REQUEST_READ_TIMEOUT gets 408 problem+json, nothing is claimed and
// the upstream is not called.
func TestSlowKeyedBodyTimesOut(t *testing.T) {
	forBoth(t, func(o *proxy.Options) { o.RequestReadTimeout = 300 * time.Millisecond }, func(t *testing.T, e *env) {
		c := dialProxy(t, e)
		defer c.Close()
		start := time.Now()
		fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\nContent-Length: 100\r\n\r\nonly-some")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		took := time.Since(start)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "urn:idemproxy:problem:request-timeout") {
			t.Errorf("status %d body %s, want 408 request-timeout", resp.StatusCode, body)
		}
		if took < 250*time.Millisecond || took > 3*time.Second {
			t.Errorf("answered after %v, want about the 300ms REQUEST_READ_TIMEOUT", took)
		}
		if e.calls.Load() != 0 {
			t.Errorf("upstream called %d times", e.calls.Load())
		}
		if keys := e.redisKeys(); len(keys) != 0 {
			t.Errorf("Redis keys %v, want none (nothing claimed)", keys)
		}
		// The connection is closed after the 408.
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("connection still open after the 408")
		}
	})
}

// TestSlowBodiesDoNotPinMemory: 500 connections that declare a 1 MiB keyed
// body and send none of it must not make the proxy allocate their declared
// sizes, and are all closed by REQUEST_READ_TIMEOUT.
func TestSlowBodiesDoNotPinMemory(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.RequestReadTimeout = 2 * time.Second
		o.MaxBodyBytes = 1 << 20
	})
	const conns = 500
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := range conns {
		c := dialProxy(t, e)
		cs = append(cs, c)
		fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Length: %d\r\n\r\n", i, 1<<20)
	}
	// Every handler is now waiting in its body read: each request shows up
	// in the in-flight gauge.
	eventually(t, 10*time.Second, "all requests in flight", func() bool {
		return counter(t, e.reg, "idemproxy_inflight_requests", nil) >= conns
	})
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grew := int64(during.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use grew by %.1f MiB for %d stalled 1 MiB bodies", float64(grew)/(1<<20), conns)
	if grew > 50<<20 {
		t.Errorf("heap grew by %d MiB for %d stalled bodies, want under 50 MiB", grew>>20, conns)
	}

	// All of them are answered 408 and closed by the deadline.
	var wg sync.WaitGroup
	errs := make(chan string, conns)
	start := time.Now()
	for _, c := range cs {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				errs <- err.Error()
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout {
				errs <- fmt.Sprintf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Errorf("stalled connection: %s, want 408", msg)
		break
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("stalled connections closed after %v, want about REQUEST_READ_TIMEOUT (2s)", took)
	}
	if e.calls.Load() != 0 {
		t.Errorf("upstream called %d times", e.calls.Load())
	}
}

// TestStalledPassThroughBody: a request without a key streams its body to
// the upstream; when it stops arriving for REQUEST_READ_TIMEOUT the forward
// is abandoned with 408. A body that keeps flowing is never cut.
func TestStalledPassThroughBody(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.RequestReadTimeout = 300 * time.Millisecond })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "got %d", n)
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nsome")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled pass-through body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled: status %d, want 408", resp.StatusCode)
	}

	// Flowing: 6 pieces, 100ms apart (600ms in all, twice the timeout).
	pr, pw := io.Pipe()
	go func() {
		for range 6 {
			time.Sleep(100 * time.Millisecond)
			_, _ = pw.Write([]byte("0123456789"))
		}
		pw.Close()
	}()
	hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/upload", pr)
	r2, err := e.srv.Client().Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK || string(b) != "got 60" {
		t.Errorf("flowing upload: %d %q, want 200 \"got 60\"", r2.StatusCode, b)
	}
}

// TestPassThroughWaitsForHeadersAtMostUpstreamTimeout: requests without a
// key, uncovered methods and "off" routes get 504 from a hung upstream after
// UPSTREAM_TIMEOUT, while a streamed answer whose headers came in time runs
// past it uncut.
func TestPassThroughWaitsForHeadersAtMostUpstreamTimeout(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /off off")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 300 * time.Millisecond
		o.Routes = routes
	})
	hung := make(chan struct{})
	defer close(hung)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.WriteHeader(http.StatusOK)
			for range 8 { // 800ms: well past UPSTREAM_TIMEOUT
				_, _ = io.WriteString(w, "data: x\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
			return
		}
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	})
	for _, tc := range []req{
		{method: http.MethodPost, path: "/v1/orders"},   // no key
		{method: http.MethodGet, path: "/v1/orders"},    // method not covered
		{method: http.MethodPost, path: "/off"},         // route off
		{method: http.MethodPut, path: "/v1/orders/1x"}, // method not covered
	} {
		start := time.Now()
		r := e.do(tc)
		if r.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("%s %s: status %d, want 504", tc.method, tc.path, r.StatusCode)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("%s %s: answered after %v, want about 300ms", tc.method, tc.path, took)
		}
	}
	r := e.do(req{method: http.MethodGet, path: "/stream"})
	if r.StatusCode != http.StatusOK || strings.Count(string(r.body), "data: x") != 8 {
		t.Errorf("stream: status %d, %d events, want 200 and 8 (not cut)", r.StatusCode, strings.Count(string(r.body), "data: x"))
	}
}

// TestStreamCutByUpstreamTimeoutIsRecorded: a keyed answer whose status
// arrived but whose body UPSTREAM_TIMEOUT cut (a long SSE stream) did
// execute: the retry gets its status, recorded without the body, and the
// upstream is not called again.
func TestStreamCutByUpstreamTimeoutIsRecorded(t *testing.T) {
	forBoth(t, func(o *proxy.Options) { o.UpstreamTimeout = 300 * time.Millisecond }, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusAccepted)
			for range 30 {
				if _, err := io.WriteString(w, "data: tick\n\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
		_, err := e.send(context.Background(), e.srv, req{key: "sse", body: "b"})
		if err == nil {
			t.Errorf("the client got a complete answer from a stream cut by UPSTREAM_TIMEOUT")
		}
		r := e.do(req{key: "sse", body: "b"})
		if r.StatusCode != http.StatusAccepted || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d replayed %q, want the recorded 202", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:response-not-stored" {
			t.Errorf("retry problem %v", p)
		}
		if e.calls.Load() != 1 {
			t.Errorf("upstream calls %d, want 1", e.calls.Load())
		}
	})
}

// TestReplayToAClientThatNeverReads: a large replay to a client that never
// reads ends by UPSTREAM_TIMEOUT instead of holding its handler forever.
func TestReplayToAClientThatNeverReads(t *testing.T) {
	const size = 8 << 20
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		// Room for the first 8 MiB answer under -race on a loaded machine.
		o.UpstreamTimeout = 6 * time.Second
		o.Default.LockTTL = 12 * time.Second
		o.MaxStoredBytes = size + 1
	})
	big := strings.Repeat("z", size)
	e.setUpstream(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, big) })
	if r := e.do(req{key: "big", body: "b"}); len(r.body) != size {
		t.Fatalf("first: %d bytes", len(r.body))
	}
	c := dialProxy(t, e)
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\nContent-Length: 1\r\n\r\nb")
	// Never read. The replay must end (logged, gauge back to zero) by the deadline.
	start := time.Now()
	eventually(t, 15*time.Second, "replay handler ended", func() bool {
		return counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "replayed"}) == 1 &&
			counter(t, e.reg, "idemproxy_inflight_requests", nil) == 0
	})
	t.Logf("replay to a non-reading client ended after %v", time.Since(start))
}
