package proxy

// What the upstream receives of a hostile or unusual incoming trace
// context when tracing is on.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/claim"
)

// traceHandler is a traced handler whose upstream records the headers of
// each call.
func traceHandler(t *testing.T) (*Handler, func() []http.Header) {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var mu sync.Mutex
	var got []http.Header
	opts := memoryOptions(nil)
	opts.Transport = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		return memoryUpstream(r)
	})
	opts.TracerProvider = tp
	h, err := New(claim.NewStore(rdb, "idem:", nil, claim.Tracing(tp)), opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, func() []http.Header {
		mu.Lock()
		defer mu.Unlock()
		return append([]http.Header(nil), got...)
	}
}

// traceServe serves r, which must be answered 201 after exactly one
// upstream call, and returns the headers that call carried.
func traceServe(t *testing.T, h *Handler, upstream func() []http.Header, r *http.Request) []http.Header {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	got := upstream()
	if len(got) != 1 {
		t.Fatalf("upstream calls: %d, want 1", len(got))
	}
	return got
}

// W3C Trace Context: when traceparent cannot be parsed, tracestate MUST NOT
// be propagated (it belongs to a trace the receiver cannot identify). The
// proxy starts a new trace and sends its own traceparent, but the client's
// tracestate reaches the upstream untouched, now attached to the proxy's new
// trace id: the upstream's tracer continues vendor state (sampling
// decisions, tenant ids) the client invented for a trace that is not this
// one. Keyed and pass-through requests alike.
func TestTracestateDroppedWithInvalidTraceparent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method, key string
	}{{"keyed", http.MethodPost, "k-ts-1"}, {"passthrough", http.MethodGet, ""}} {
		t.Run(tc.name, func(t *testing.T) {
			h, upstream := traceHandler(t)
			r := httptest.NewRequest(tc.method, "/v1/orders", strings.NewReader(`{}`))
			if tc.key != "" {
				r.Header.Set("Idempotency-Key", tc.key)
			}
			r.Header.Set("Traceparent", "00-not-a-trace-context-01")
			r.Header.Set("Tracestate", "vendor=client-chosen-state")
			got := traceServe(t, h, upstream, r)
			if tp := got[0].Values("Traceparent"); len(tp) != 1 || strings.Contains(tp[0], "not-a-trace") {
				t.Errorf("upstream traceparent: got %q, want exactly one, the proxy's", tp)
			}
			if ts := got[0].Values("Tracestate"); len(ts) != 0 {
				t.Errorf("upstream tracestate: got %q with the proxy's new trace %q; want none (the client's traceparent was invalid)",
					ts, got[0].Get("Traceparent"))
			}
		})
	}
}

// A tracestate the SDK cannot parse is dropped from the proxy's span
// context, so Inject writes no tracestate, and the client's malformed value
// is forwarded as is next to the proxy's traceparent.
func TestMalformedTracestateNotForwarded(t *testing.T) {
	t.Parallel()
	h, upstream := traceHandler(t)
	r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k-ts-2")
	r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r.Header.Set("Tracestate", "Invalid Key=v,"+strings.Repeat("x", 600)+"=y")
	got := traceServe(t, h, upstream, r)
	if ts := got[0].Values("Tracestate"); len(ts) != 0 {
		t.Errorf("upstream tracestate: got %q; want none (the client's was not valid W3C tracestate)", ts)
	}
}

// W3C Trace Context: a tracestate split over several header lines is one
// list (RFC 9110 field combination). Extract reads only the first line and
// Inject's Set replaces them all, so members of the later lines never reach
// the upstream.
func TestTracestateOverSeveralLinesKept(t *testing.T) {
	t.Parallel()
	h, upstream := traceHandler(t)
	r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k-ts-3")
	r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r.Header.Add("Tracestate", "a=1")
	r.Header.Add("Tracestate", "b=2")
	got := traceServe(t, h, upstream, r)
	if ts := strings.Join(got[0].Values("Tracestate"), ","); !strings.Contains(ts, "a=1") || !strings.Contains(ts, "b=2") {
		t.Errorf("upstream tracestate: got %q; want both members a=1 and b=2 of the client's tracestate", ts)
	}
}
