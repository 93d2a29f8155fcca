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

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/proxy"
)

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
	t.Parallel()
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
	// The replay goes through a second replica on the same Redis whose
	// UPSTREAM_TIMEOUT, which bounds each write of the replay, is short:
	// only the first answer needed the long one.
	opts := e.opts
	opts.UpstreamTimeout = time.Second
	_, srv, reg := e.newProxy(opts)
	c := dialServer(t, srv)
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\nContent-Length: 1\r\n\r\nb")
	// Never read. The replay must end (logged, gauge back to zero) by the deadline.
	start := time.Now()
	eventually(t, 15*time.Second, "replay handler ended", func() bool {
		return counter(t, reg, "idemproxy_requests_total", map[string]string{"outcome": "replayed"}) == 1 &&
			counter(t, reg, "idemproxy_inflight_requests", nil) == 0
	})
	t.Logf("replay to a non-reading client ended after %v", time.Since(start))
}

// TestRequestTrailersReachTheUpstream: a chunked request's trailers (a
// checksum sent after the body, say) reach the upstream with their values,
// keyed or not: the proxy must not drop what the client sent. Those that
// RFC 9110 keeps out of trailers, or that the proxy sets or reads as
// headers, do not: an upstream that merged them into its headers would
// find a client's X-Forwarded-For or Authorization there.
func TestRequestTrailersReachTheUpstream(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// sendForTrailers sends raw (one request) on a new connection, waits
// for its answer and returns the trailers the upstream read.
func sendForTrailers(t *testing.T, e *env, raw string) http.Header {
	t.Helper()
	_, tr := trailerSend(t, e, raw)
	return tr
}

// TestEmptyKeyedBodyKeepsItsTrailers: the README says a request's
// trailers are forwarded "keyed or not". A chunked body with no data and a
// trailer (a signature or digest of empty content) is forwarded with it on
// pass-through, but the keyed path only goes chunked when len(body) > 0:
// an empty keyed body is sent as "Content-Length: 0" and its trailers are
// dropped.
func TestEmptyKeyedBodyKeepsItsTrailers(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "empty-tr-1"} {
		name := "pass-through"
		keyLine := ""
		if key != "" {
			name, keyLine = "keyed", "Idempotency-Key: "+key+"\r\n"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			tr := sendForTrailers(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
				"Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n0\r\nX-Checksum: e3b0c442\r\n\r\n")
			if v := tr.Get("X-Checksum"); v != "e3b0c442" {
				t.Errorf("upstream got trailer X-Checksum %q (trailers %v), want %q", v, tr, "e3b0c442")
			}
		})
	}
}

// TestTraceparentTrailerNotForwarded: the README's rule is that
// fields "the proxy reads or sets as headers" are not forwarded as
// trailers, "so that an upstream that merges trailers into its headers
// never finds a client's value in their place". With tracing on, the proxy
// reads traceparent/tracestate and replaces them on the upstream request
// with its own client span's (traceOutgoing); trailerDenied does not name
// them, so a client's Traceparent and Tracestate trailers reach the
// upstream, keyed or not.
func TestTraceparentTrailerNotForwarded(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "tp-tr-1"} {
		name := "pass-through"
		keyLine := ""
		if key != "" {
			name, keyLine = "keyed", "Idempotency-Key: "+key+"\r\n"
		}
		t.Run(name, func(t *testing.T) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
			t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
			e := newEnv(t, miniBackend, func(o *proxy.Options) { o.TracerProvider = tp })
			tr := sendForTrailers(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
				"Transfer-Encoding: chunked\r\nTrailer: X-Checksum, Traceparent, Tracestate\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\n"+
				"Traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nTracestate: vendor=forged\r\n\r\n")
			if tr.Get("X-Checksum") != "abc" {
				t.Fatalf("upstream trailers %v: X-Checksum missing", tr)
			}
			if tr.Get("Traceparent") != "" || tr.Get("Tracestate") != "" {
				t.Errorf("the proxy sets traceparent/tracestate as headers, yet the client's reached the upstream as trailers: %v", tr)
			}
		})
	}
}

// TestUndeclaredTrailerSameWithTracing: a trailer the client did
// not announce in "Trailer:" (RFC 9110 only says SHOULD) was forwarded on
// the keyed path with tracing off, and dropped with tracing on (the traced
// request is a copy made before the body was read, whose Trailer map stays
// nil when net/http creates one at the body's end) and always on
// pass-through (likewise a copy). Whether a client's trailer reaches the
// upstream must not depend on TRACING: only announced trailers are
// forwarded (README), keyed or not, traced or not.
func TestUndeclaredTrailerSameWithTracing(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{false, true} {
		for _, key := range []string{"", "und-"} {
			name := "untraced"
			if traced {
				name = "traced"
			}
			if key == "" {
				name += " pass-through"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, miniBackend, func(o *proxy.Options) {
					if traced {
						tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
						t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
						o.TracerProvider = tp
					}
				})
				keyLine := ""
				if key != "" {
					keyLine = "Idempotency-Key: " + key + "1\r\n"
				}
				tr := sendForTrailers(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
					"Transfer-Encoding: chunked\r\nTrailer: X-Announced\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-Announced: yes\r\n\r\n")
				if tr.Get("X-Checksum") != "" || tr.Get("X-Announced") != "yes" {
					t.Errorf("%s: upstream trailers %v, want only the announced X-Announced", name, tr)
				}
			})
		}
	}
}

// TestKeyedEmptyBodyKeepsContentLength: a keyed POST, PUT or PATCH
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
func TestKeyedEmptyBodyKeepsContentLength(t *testing.T) {
	t.Parallel()
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

// TestRefusalWithUnsentBodyIsBounded: a request the
// proxy refuses before its body is read (an invalid key, a missing required
// key, a declared body over MAX_BODY_BYTES, a refused upgrade), or while
// reading it (a chunked body past the limit), leaves the body unread when
// the handler returns. net/http reads up to 256 KiB of it before writing the
// answer, to keep the connection: with no read deadline, a client that
// declares a body and never sends it held the connection for ever and never
// got its answer. It must get the answer within REQUEST_READ_TIMEOUT.
func TestRefusalWithUnsentBodyIsBounded(t *testing.T) {
	const readTimeout = time.Second
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.RequestReadTimeout = readTimeout
		o.MaxBodyBytes = 10
		o.Routes, _ = proxy.ParseRoutes("POST /required required")
	})
	cases := []struct {
		name, head, body string
		status           int
	}{
		{"invalid key", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a,b\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"required key missing", "POST /required HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"declared body over MAX_BODY_BYTES", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Length: 100\r\n\r\n", "", http.StatusRequestEntityTooLarge},
		{"protocol upgrade refused", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\n", "", http.StatusBadRequest},
		{"chunked body over MAX_BODY_BYTES, then stalled", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k2\r\nTransfer-Encoding: chunked\r\n\r\n", "14\r\n01234567890123456789\r\n", http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { expectAnswerWithoutBody(t, e, c.head+c.body, c.status, readTimeout) })
	}
}

// expectAnswerWithoutBody sends head (a request that declares a body it
// never sends, and whatever part of it is in head) and requires an answer of
// status within readTimeout and 4 s of slack.
func expectAnswerWithoutBody(t *testing.T, e *env, head string, status int, readTimeout time.Duration) {
	t.Helper()
	conn := dialProxy(t, e)
	defer conn.Close()
	if _, err := fmt.Fprint(conn, head); err != nil {
		t.Fatal(err)
	}
	// The rest of the body is never sent.
	_ = conn.SetReadDeadline(time.Now().Add(readTimeout + 4*time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within %v (REQUEST_READ_TIMEOUT=%v): %v", time.Since(start).Round(time.Millisecond), readTimeout, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	t.Logf("answered %d after %v", resp.StatusCode, time.Since(start).Round(time.Millisecond))
}

// TestLongRefusalWithUnsentBodyIsBounded: TestRefusalWithUnsentBodyIsBounded
// bounds the read net/http makes of an unread body by a read deadline set
// in Handler.finish, after the handler returns. But net/http reads that
// body when the answer's header is written, which for an answer over its
// 2 KiB response buffer is inside the handler's own Write (writeProblem),
// before finish runs and with no read deadline. Refusals that quote what
// the client sent are such answers: a refused Upgrade (its protocols), a
// key=query:NAME whose value does not decode (the value). A client that
// declares a body, sends a long value and never sends the body holds the
// handler for ever and never gets its answer.
func TestLongRefusalWithUnsentBodyIsBounded(t *testing.T) {
	const readTimeout = time.Second
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.RequestReadTimeout = readTimeout
		o.Routes, _ = proxy.ParseRoutes("POST /hooks/q key=query:id scope=")
	})
	long := strings.Repeat("a", 3000)
	cases := []struct{ name, head string }{
		{"refused upgrade, long protocol list",
			"POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket" + long + "\r\nContent-Length: 100\r\n\r\n"},
		{"key=query:id that does not decode, long",
			"POST /hooks/q?id=%zz" + long + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"},
		{"refused upgrade, short (control: bounded by TestRefusalWithUnsentBodyIsBounded)",
			"POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { expectAnswerWithoutBody(t, e, c.head, http.StatusBadRequest, readTimeout) })
	}
}
