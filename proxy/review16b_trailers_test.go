package proxy_test

import (
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/proxy"
)

// review16bTrailerSend sends raw (one request) on a new connection, waits
// for its answer and returns the trailers the upstream read.
func review16bTrailerSend(t *testing.T, e *env, raw string) http.Header {
	t.Helper()
	_, tr := trailerSend(t, e, raw)
	return tr
}

// TestReview16bEmptyKeyedBodyKeepsItsTrailers: the README says a request's
// trailers are forwarded "keyed or not". A chunked body with no data and a
// trailer (a signature or digest of empty content) is forwarded with it on
// pass-through, but the keyed path only goes chunked when len(body) > 0:
// an empty keyed body is sent as "Content-Length: 0" and its trailers are
// dropped.
func TestReview16bEmptyKeyedBodyKeepsItsTrailers(t *testing.T) {
	for _, key := range []string{"", "empty-tr-1"} {
		name := "pass-through"
		keyLine := ""
		if key != "" {
			name, keyLine = "keyed", "Idempotency-Key: "+key+"\r\n"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			tr := review16bTrailerSend(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
				"Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n0\r\nX-Checksum: e3b0c442\r\n\r\n")
			if v := tr.Get("X-Checksum"); v != "e3b0c442" {
				t.Errorf("upstream got trailer X-Checksum %q (trailers %v), want %q", v, tr, "e3b0c442")
			}
		})
	}
}

// TestReview16bTraceparentTrailerNotForwarded: the README's rule is that
// fields "the proxy reads or sets as headers" are not forwarded as
// trailers, "so that an upstream that merges trailers into its headers
// never finds a client's value in their place". With tracing on, the proxy
// reads traceparent/tracestate and replaces them on the upstream request
// with its own client span's (traceOutgoing); trailerDenied does not name
// them, so a client's Traceparent and Tracestate trailers reach the
// upstream, keyed or not.
func TestReview16bTraceparentTrailerNotForwarded(t *testing.T) {
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
			tr := review16bTrailerSend(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
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

// TestReview16bUndeclaredTrailerSameWithTracing: a trailer the client did
// not announce in "Trailer:" (RFC 9110 only says SHOULD) was forwarded on
// the keyed path with tracing off, and dropped with tracing on (the traced
// request is a copy made before the body was read, whose Trailer map stays
// nil when net/http creates one at the body's end) and always on
// pass-through (likewise a copy). Whether a client's trailer reaches the
// upstream must not depend on TRACING: only announced trailers are
// forwarded (README), keyed or not, traced or not.
func TestReview16bUndeclaredTrailerSameWithTracing(t *testing.T) {
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
				tr := review16bTrailerSend(t, e, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n"+keyLine+
					"Transfer-Encoding: chunked\r\nTrailer: X-Announced\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-Announced: yes\r\n\r\n")
				if tr.Get("X-Checksum") != "" || tr.Get("X-Announced") != "yes" {
					t.Errorf("%s: upstream trailers %v, want only the announced X-Announced", name, tr)
				}
			})
		}
	}
}
