package main

// Review of issue 13 (tracing): failing tests for what a hostile client or a
// misconfigured deployment can do with tracing on.

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// A client controls User-Agent, the path and Host, and with the default
// parentbased sampler also whether its request is sampled. The SDK's
// attribute value length limit is unlimited by default
// (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT unset), and newTracing sets none: every
// byte of those headers (up to net/http's 1 MB header limit) is exported in
// each span. The proxy should bound what a client can make it export.
func TestReview13SpanAttributesBoundedAgainstHostileHeaders(t *testing.T) {
	sink, endpoint := newOTLPHTTPSink(t)
	mr := miniredis.RunT(t)
	up, _ := tracedUpstream(t)
	env := append([]string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=", "REDIS_URL=redis://" + mr.Addr()},
		tracingEnv(t, envEndpoint+"="+endpoint)...)
	a, _ := startEnv(t, env...)
	c := newClient(t)

	const limit = 4096 // any sane bound; OTel's own examples use a few KB
	ua := strings.Repeat("A", 200<<10)
	longPath := "/v1/orders/" + strings.Repeat("p", 100<<10)
	req, _ := http.NewRequest(http.MethodGet, "http://"+a.proxyAddr.String()+longPath, nil)
	req.Header.Set("User-Agent", ua)
	// A sampled parent: the client forces its request to be exported.
	req.Header.Set("Traceparent", "00-"+incomingTraceID+"-"+incomingSpanID+"-01")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	flush(t, a)

	spans, _ := sink.snapshot()
	if len(spans) == 0 {
		t.Fatal("no spans exported")
	}
	total := 0
	for _, sp := range spans {
		for k, v := range attrs(sp) {
			total += len(v)
			if len(v) > limit {
				t.Errorf("span %q attribute %s: %d bytes exported from client-controlled input; want at most %d", sp.GetName(), k, len(v), limit)
			}
		}
	}
	t.Logf("attribute bytes exported for one request: %d", total)
}

// With the collector hanging (down behind a load balancer, or slow), every
// span waits in the batch processor's queue (2048 spans by default). Each
// queued span keeps its client-supplied attributes alive, so memory grows
// with the size of the clients' headers, not with a bound the proxy sets.
// 48 requests with a 600 KB User-Agent should not pin ~30 MB.
func TestReview13QueuedSpansMemoryBoundedWhenCollectorHangs(t *testing.T) {
	release := make(chan struct{})
	hanging := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // bounded: released at cleanup, or by the exporter's own timeout
		case <-release:
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	})
	srv := httptest.NewServer(hanging)
	t.Cleanup(srv.Close)
	collector := srv.URL
	mr := miniredis.RunT(t)
	up, _ := tracedUpstream(t)
	env := append([]string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=", "REDIS_URL=redis://" + mr.Addr()},
		tracingEnv(t, envEndpoint+"="+collector, envTimeout+"=2000")...)
	a, _ := startEnv(t, env...)
	t.Cleanup(func() { close(release) })
	c := newClient(t)

	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	const n = 48
	for i := range n {
		req, _ := http.NewRequest(http.MethodGet, "http://"+a.proxyAddr.String()+"/v1/orders/1", nil)
		req.Header.Set("User-Agent", strings.Repeat(string(rune('a'+i%26)), 600<<10))
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	c.CloseIdleConnections()
	grown := int64(heap()) - int64(before)
	const budget = 8 << 20
	if grown > budget {
		t.Errorf("heap grew by %.1f MB after %d requests with a hanging collector; want at most %d MB (spans queued with client-sized attributes)",
			float64(grown)/(1<<20), n, budget>>20)
	}
}

// checkTracing validates a handful of OTEL_* variables, but the SDK honours
// more, and for these it only logs (through otel's global logger, not as a
// start-up refusal naming the variable) and goes on with a default: a CA file
// that does not exist (exports then fail TLS at run time), an unknown
// compression, a queue size or delay that is not a number, a non-numeric
// attribute limit. OTEL_TRACES_EXPORTER, a standard variable, is ignored
// altogether: "none" (the standard way to turn traces off) still exports.
func TestReview13UncheckedOTELVariablesRefused(t *testing.T) {
	base := []string{"UPSTREAM_URL=http://127.0.0.1:1", envEndpoint + "=http://127.0.0.1:4318"}
	for _, bad := range []string{
		"OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/review13-ca.pem",
		"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=/nonexistent/review13-ca.pem",
		"OTEL_EXPORTER_OTLP_COMPRESSION=zstd",
		"OTEL_BSP_MAX_QUEUE_SIZE=lots",
		"OTEL_BSP_SCHEDULE_DELAY=5s",
		"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=4KB",
		"OTEL_TRACES_EXPORTER=zipkin",
	} {
		name, _, _ := strings.Cut(bad, "=")
		t.Run(name, func(t *testing.T) {
			_, err := loadConfig(append(append([]string(nil), base...), bad))
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("loadConfig with %s: got %v, want a refusal naming %s", bad, err, name)
			}
		})
	}
	t.Run("OTEL_TRACES_EXPORTER=none", func(t *testing.T) {
		cfg, err := loadConfig(append(append([]string(nil), base...), "OTEL_TRACES_EXPORTER=none"))
		if err == nil && cfg.tracing.enabled {
			t.Errorf("OTEL_TRACES_EXPORTER=none with an endpoint: tracing on (%+v); want it off, or a refusal", cfg.tracing)
		}
	})
}

// checkKeyValues accepts any non-empty key in OTEL_EXPORTER_OTLP_HEADERS,
// but the exporter drops a header whose name is not an HTTP token (a space,
// a colon, a slash), logging through otel's global logger only: the proxy
// starts and exports without its credentials, and every export fails 401.
func TestReview13InvalidHeaderNameRefused(t *testing.T) {
	for _, v := range []string{"x api key=abc", "Authorization:Bearer=abc", "team/key=abc"} {
		t.Run(v, func(t *testing.T) {
			_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", envEndpoint + "=http://127.0.0.1:4318", envHeaders + "=" + v})
			if err == nil || !strings.Contains(err.Error(), envHeaders) {
				t.Errorf("loadConfig with %s=%q: got %v, want a refusal naming %s (not a valid header name)", envHeaders, v, err, envHeaders)
			}
		})
	}
}
