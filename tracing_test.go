package main

// Tests of tracing.go: the OTEL_* variables checked at start, and tracing
// end to end: the proxy started with OTEL_* variables exports to an
// in-process OTLP receiver (OTLP/HTTP protobuf, or gRPC), and the spans it
// receives are checked: names, parents, attributes, the upstream's
// traceparent, the replay's link to its execution, and what a hostile client
// can make it export. The SDK reads OTEL_* from the process's environment
// (t.Setenv), and otel's error handler is the process's: none of these
// tests may run in parallel.

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

func TestTracingConfig(t *testing.T) {
	base := []string{"UPSTREAM_URL=http://127.0.0.1:1"}
	tests := []struct {
		name     string
		env      []string
		wantErr  string // "" means valid
		wantOn   bool
		wantProt string
	}{
		{name: "off by default"},
		{name: "endpoint", env: []string{envEndpoint + "=http://127.0.0.1:4318"}, wantOn: true, wantProt: protocolHTTP},
		{name: "traces endpoint, grpc", env: []string{envTracesEndpoint + "=http://127.0.0.1:4317", envProtocol + "=grpc"}, wantOn: true, wantProt: protocolGRPC},
		{name: "per-signal protocol wins", env: []string{envEndpoint + "=http://c:4318", envProtocol + "=grpc", envTracesProtocol + "=http/protobuf"}, wantOn: true, wantProt: protocolHTTP},
		{name: "bad protocol", env: []string{envEndpoint + "=http://c:4318", envProtocol + "=http/json"}, wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`},
		{name: "bad traces protocol", env: []string{envEndpoint + "=http://c:4318", envTracesProtocol + "=thrift"}, wantErr: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="thrift"`},
		{name: "bad endpoint", env: []string{envEndpoint + "=collector:4318"}, wantErr: `OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318"`},
		{name: "bad sampler", env: []string{envEndpoint + "=http://c:4318", envSampler + "=sometimes"}, wantErr: `OTEL_TRACES_SAMPLER="sometimes"`},
		{name: "bad ratio", env: []string{envEndpoint + "=http://c:4318", envSampler + "=parentbased_traceidratio", envSamplerArg + "=2"}, wantErr: `OTEL_TRACES_SAMPLER_ARG="2"`},
		{name: "ratio", env: []string{envEndpoint + "=http://c:4318", envSampler + "=traceidratio", envSamplerArg + "=0.25"}, wantOn: true, wantProt: protocolHTTP},
		{name: "bad headers", env: []string{envEndpoint + "=http://c:4318", envHeaders + "=Authorization"}, wantErr: `OTEL_EXPORTER_OTLP_HEADERS: pair 1`},
		{name: "bad resource attributes", env: []string{envEndpoint + "=http://c:4318", envResourceAttrs + "=team"}, wantErr: `OTEL_RESOURCE_ATTRIBUTES="team"`},
		{name: "bad timeout", env: []string{envEndpoint + "=http://c:4318", envTimeout + "=5s"}, wantErr: `OTEL_EXPORTER_OTLP_TIMEOUT="5s"`},
		{name: "no export deadline", env: []string{envEndpoint + "=http://c:4318", envTracesTimeout + "=0"}, wantErr: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="0": must be at least 1`},
		{name: "batch processor spinning", env: []string{envEndpoint + "=http://c:4318", "OTEL_BSP_SCHEDULE_DELAY=0"}, wantErr: `OTEL_BSP_SCHEDULE_DELAY="0": must be at least 1`},
		{name: "batch export without deadline", env: []string{envEndpoint + "=http://c:4318", "OTEL_BSP_EXPORT_TIMEOUT=0"}, wantErr: `OTEL_BSP_EXPORT_TIMEOUT="0": must be at least 1`},
		{name: "off: protocol not checked", env: []string{envProtocol + "=http/json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(append(append([]string(nil), base...), tt.env...))
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("loadConfig: got %v, want an error naming %s", err, tt.wantErr)
			case tt.wantErr != "":
				return
			case err != nil:
				t.Fatalf("loadConfig: %v", err)
			}
			if cfg.tracing.enabled != tt.wantOn || (tt.wantOn && cfg.tracing.protocol != tt.wantProt) {
				t.Errorf("tracing: got %+v, want enabled %v protocol %q", cfg.tracing, tt.wantOn, tt.wantProt)
			}
		})
	}
}

// TestTracingVariablesTheSDKWouldIgnoreRefused: the SDK honours more OTEL_*
// variables than the handful checkTracing once validated, and for a bad one
// it only logs (through otel's global logger, not as a start-up refusal
// naming the variable) and goes on with a default: a CA file that does not
// exist (exports then fail TLS at run time), an unknown compression, a queue
// size or delay that is not a number, a non-numeric attribute limit.
// OTEL_TRACES_EXPORTER, a standard variable, was ignored altogether: "none"
// (the standard way to turn traces off) still exported. Each is refused at
// start, naming the variable, or honoured.
func TestTracingVariablesTheSDKWouldIgnoreRefused(t *testing.T) {
	base := []string{"UPSTREAM_URL=http://127.0.0.1:1", envEndpoint + "=http://127.0.0.1:4318"}
	for _, bad := range []string{
		"OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/idemproxy-test-ca.pem",
		"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=/nonexistent/idemproxy-test-ca.pem",
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

// TestTracingHeaderNamesMustBeTokens: the exporter drops a header of
// OTEL_EXPORTER_OTLP_HEADERS whose name is not an HTTP token (a space, a
// colon, a slash), logging through otel's global logger only; when
// checkKeyValues accepted any non-empty key, the proxy started and exported
// without its credentials, and every export failed 401.
func TestTracingHeaderNamesMustBeTokens(t *testing.T) {
	for _, v := range []string{"x api key=abc", "Authorization:Bearer=abc", "team/key=abc"} {
		t.Run(v, func(t *testing.T) {
			_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", envEndpoint + "=http://127.0.0.1:4318", envHeaders + "=" + v})
			if err == nil || !strings.Contains(err.Error(), envHeaders) {
				t.Errorf("loadConfig with %s=%q: got %v, want a refusal naming %s (not a valid header name)", envHeaders, v, err, envHeaders)
			}
		})
	}
}

// TestTracingRefusalsNeverShowCredentials: OTEL_EXPORTER_OTLP_HEADERS holds
// the collector's credentials (the chart reads it from a Secret). A
// malformed value, such as the common "Authorization: Bearer ..." (a colon,
// not "="), or a bad percent escape, stops the proxy; its message used to
// quote the whole value, so the token landed in the pod's logs. The rest of
// the configuration redacts credentials (redactURL for REDIS_URL,
// UPSTREAM_URL, DOCS_URL); so does this, and an endpoint URL with user
// info.
func TestTracingRefusalsNeverShowCredentials(t *testing.T) {
	const secret = "sk_live_Zq7xCollectorS3cret"
	tests := []struct {
		name string
		env  []string
		want string // the variable the refusal must still name
	}{
		{"headers with a colon", []string{envEndpoint + "=http://c:4318", envHeaders + "=Authorization: Bearer " + secret}, envHeaders},
		{"headers bad escape", []string{envEndpoint + "=http://c:4318", envHeaders + "=authorization=Bearer%zz" + secret}, envHeaders},
		{"traces headers", []string{envEndpoint + "=http://c:4318", envTracesHeaders + "=x-api-key " + secret}, envTracesHeaders},
		{"endpoint with user info", []string{envEndpoint + "=grpcs://otel:" + secret + "@collector:4317"}, envEndpoint},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(append([]string{"UPSTREAM_URL=http://127.0.0.1:1"}, tt.env...))
			if err == nil {
				t.Fatalf("loadConfig(%q): accepted; want a refusal", tt.env)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("refusal does not name %s: %v", tt.want, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("refusal quotes the credential: %v", err)
			}
		})
	}
}

// TestTracingBadProtocolRefusesToStart: a bad protocol stops the process
// at start, naming the variable.
func TestTracingBadProtocolRefusesToStart(t *testing.T) {
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := run(ctx, []string{"idemproxy"}, []string{"UPSTREAM_URL=http://127.0.0.1:1", "LISTEN_ADDR=127.0.0.1:0",
		envTracesEndpoint + "=http://127.0.0.1:4318", envTracesProtocol + "=http/json"}, io.Discard, &stderr)
	if err == nil || !strings.Contains(err.Error(), `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json"`) {
		t.Fatalf("run: got %v, want a refusal naming OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", err)
	}
}

func TestTracingSpans(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		sink     func(*testing.T) (*otlpSink, string)
	}{
		{name: "http/protobuf", protocol: "", sink: newOTLPHTTPSink},
		{name: "grpc", protocol: "grpc", sink: newOTLPGRPCSink},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink, endpoint := tt.sink(t)
			kv := []string{envEndpoint + "=" + endpoint}
			if tt.protocol != "" {
				kv = append(kv, envProtocol+"="+tt.protocol)
			}
			testTracingSpans(t, sink, tracingEnv(t, kv...))
		})
	}
}

func testTracingSpans(t *testing.T, sink *otlpSink, otelEnv []string) {
	mr := miniredis.RunT(t)
	up, traceparents := tracedUpstream(t)
	env := append([]string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "REDIS_URL=redis://" + mr.Addr(),
		"ROUTES=POST /v1/orders ttl=1h"}, otelEnv...)
	a, _ := startEnv(t, env...)
	if a.tracing == nil {
		t.Fatal("tracing is off with " + envEndpoint + " set")
	}
	c := newClient(t)
	base := proxyURL(a, "")
	waitReplayCacheOn(t, c, a) // else the second replay too is read from Redis

	// 1. Executed, continuing the client's trace.
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(`{"amount":42}`))
	req.Header.Set("Idempotency-Key", secretKey)
	req.Header.Set("Traceparent", "00-"+incomingTraceID+"-"+incomingSpanID+"-01")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("first POST: got %v, want %v", res.StatusCode, http.StatusCreated)
	}
	// 2. Replayed (from Redis), then 3. replayed again (from the replay cache).
	for i := range 2 {
		if r := mustPost(t, c, base+"/v1/orders", secretKey, `{"amount":42}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %d: got %v (replayed %q), want a replayed 201", i, r.status, r.header.Get("Idempotent-Replayed"))
		}
	}
	// 4. A pass-through GET.
	if status, _, err := get(c, base+"/v1/orders/1"); err != nil || status != http.StatusCreated {
		t.Fatalf("GET: got %v %v, want 201", status, err)
	}
	flush(t, a)

	spans, services := sink.snapshot()
	if len(services) == 0 || services[0] != "idemproxy" {
		t.Errorf("service.name: got %q, want idemproxy", services)
	}
	for _, sp := range spans {
		for k, v := range attrs(sp) {
			if strings.Contains(v, secretKey) || strings.Contains(v, "amount") {
				t.Errorf("span %q attribute %s=%q holds the key or the body", sp.GetName(), k, v)
			}
		}
	}
	servers := serverSpans(spans)
	if len(servers) != 4 {
		t.Fatalf("server spans: got %d, want 4 (spans: %v)", len(servers), spanNames(spans))
	}
	byOutcome := map[string][]*tracepb.Span{}
	for _, sp := range servers {
		o := attrs(sp)["idempotency.outcome"]
		byOutcome[o] = append(byOutcome[o], sp)
	}
	if len(byOutcome["executed"]) != 1 || len(byOutcome["replayed"]) != 2 || len(byOutcome["passthrough"]) != 1 {
		t.Fatalf("server span outcomes: got %v", keysOf(byOutcome))
	}

	exec := byOutcome["executed"][0]
	if got := hexID(exec.GetTraceId()); got != incomingTraceID {
		t.Errorf("executed span trace id: got %s, want the incoming %s", got, incomingTraceID)
	}
	if got := hexID(exec.GetParentSpanId()); got != incomingSpanID {
		t.Errorf("executed span parent: got %s, want the incoming %s", got, incomingSpanID)
	}
	wantAttrs := map[string]string{
		"http.request.method": "POST", "url.path": "/v1/orders", "http.route": "/v1/orders",
		"http.response.status_code": "201", "idempotency.outcome": "executed", "idempotency.key_source": "header",
		"server.address": "127.0.0.1",
	}
	checkAttrs(t, exec, wantAttrs)
	if exec.GetName() != "POST /v1/orders" {
		t.Errorf("executed span name: got %q, want %q", exec.GetName(), "POST /v1/orders")
	}
	if kh := attrs(exec)["idempotency.key_hash"]; len(kh) != 64 {
		t.Errorf("idempotency.key_hash: got %q, want a sha-256 in hex", kh)
	}
	kids := children(spans, exec)
	for _, name := range []string{"redis claim", "POST", "redis complete"} {
		if len(kids[name]) != 1 {
			t.Fatalf("children of the executed span: got %v, want one each of redis claim, POST, redis complete", keysOf(kids))
		}
	}
	checkAttrs(t, kids["redis claim"][0], map[string]string{"db.system.name": "redis", "db.operation.name": "EVALSHA",
		"idempotency.script": "claim.lua", "idempotency.script.result": "claimed"})
	checkAttrs(t, kids["redis complete"][0], map[string]string{"db.system.name": "redis", "idempotency.script": "complete.lua",
		"idempotency.script.result": "ok"})
	client := kids["POST"][0]
	if client.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("upstream span kind: got %v, want client", client.GetKind())
	}
	checkAttrs(t, client, map[string]string{"http.request.method": "POST", "http.response.status_code": "201",
		"url.full": up.URL + "/v1/orders"})

	// The upstream saw the client span as its parent, in the incoming trace.
	tps := traceparents()
	if len(tps) != 2 {
		t.Fatalf("upstream calls: got %d, want 2 (one execution, one GET)", len(tps))
	}
	if want := "00-" + incomingTraceID + "-" + hexID(client.GetSpanId()) + "-01"; tps[0] != want {
		t.Errorf("upstream traceparent: got %q, want %q (the upstream client span)", tps[0], want)
	}

	// The record keeps the execution's trace and span id.
	keys := mr.Keys()
	if len(keys) != 1 {
		t.Fatalf("Redis keys: got %v, want one record", keys)
	}
	if got, want := mr.HGet(keys[0], "tr"), incomingTraceID+"-"+hexID(exec.GetSpanId()); got != want {
		t.Errorf("record field tr: got %q, want %q", got, want)
	}

	// Each replay links to the execution, in a trace of its own.
	for i, rp := range byOutcome["replayed"] {
		links := rp.GetLinks()
		if len(links) != 1 || hexID(links[0].GetTraceId()) != incomingTraceID || !bytes.Equal(links[0].GetSpanId(), exec.GetSpanId()) {
			t.Errorf("replay %d links: got %v, want one to the execution %s/%s", i, links, incomingTraceID, hexID(exec.GetSpanId()))
		}
		if hexID(rp.GetTraceId()) == incomingTraceID {
			t.Errorf("replay %d: in the execution's trace; want a new one (its request sent no traceparent)", i)
		}
		checkAttrs(t, rp, map[string]string{"idempotency.execution": incomingTraceID + "-" + hexID(exec.GetSpanId())})
	}
	var fromRedis int
	for _, rp := range byOutcome["replayed"] {
		if k := children(spans, rp); len(k["redis claim"]) == 1 {
			checkAttrs(t, k["redis claim"][0], map[string]string{"idempotency.script.result": "replay"})
			fromRedis++
		}
	}
	if fromRedis != 1 {
		t.Errorf("replays answered by a claim.lua run: got %d, want 1 (the other from the replay cache, no span)", fromRedis)
	}

	// The pass-through has its server span and an upstream client span.
	pt := byOutcome["passthrough"][0]
	checkAttrs(t, pt, map[string]string{"http.request.method": "GET", "http.response.status_code": "201", "idempotency.key_source": "none"})
	ptKids := children(spans, pt)
	if len(ptKids["GET"]) != 1 {
		t.Fatalf("children of the pass-through span: got %v, want one GET", keysOf(ptKids))
	}
	if want := "00-" + hexID(pt.GetTraceId()) + "-" + hexID(ptKids["GET"][0].GetSpanId()) + "-01"; tps[1] != want {
		t.Errorf("pass-through upstream traceparent: got %q, want %q", tps[1], want)
	}
}

// TestTracingOffWritesNothing: tracing off (no endpoint), or every trace
// sampled out: nothing is exported and no trace id is written to Redis. Off,
// the upstream receives the client's traceparent untouched (or none); sampled
// out, an unsampled traceparent (flags 00) in the client's trace, as W3C
// Trace Context asks.
func TestTracingOffWritesNothing(t *testing.T) {
	sink, endpoint := newOTLPHTTPSink(t)
	tests := []struct {
		name    string
		otelEnv []string
		wantOn  bool
	}{
		{name: "no endpoint"},
		{name: "sdk disabled", otelEnv: []string{envEndpoint + "=" + endpoint, envSDKDisabled + "=true"}},
		{name: "sampler always_off", otelEnv: []string{envEndpoint + "=" + endpoint, envSampler + "=always_off"}, wantOn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			up, traceparents := tracedUpstream(t)
			env := append([]string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=", "REDIS_URL=redis://" + mr.Addr()},
				tracingEnv(t, tt.otelEnv...)...)
			a, _ := startEnv(t, env...)
			if (a.tracing != nil) != tt.wantOn {
				t.Fatalf("tracing on: got %v, want %v", a.tracing != nil, tt.wantOn)
			}
			c := newClient(t)
			url := proxyURL(a, "/v1/orders")
			mustPost(t, c, url, "k1", `{}`)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "k2")
			const incoming = "00-" + incomingTraceID + "-" + incomingSpanID + "-00"
			req.Header.Set("Traceparent", incoming)
			res, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if a.tracing != nil {
				flush(t, a)
			}
			for _, k := range mr.Keys() {
				if tr := mr.HGet(k, "tr"); tr != "" {
					t.Errorf("record %s has tr=%q; want no trace id written", k, tr)
				}
			}
			tps := traceparents()
			switch {
			case len(tps) != 2:
				t.Errorf("upstream calls: got %d, want 2", len(tps))
			case !tt.wantOn && (tps[0] != "" || tps[1] != incoming):
				t.Errorf("upstream traceparents with tracing off: got %q, want none, then the client's %q", tps, incoming)
			case tt.wantOn && (!strings.HasSuffix(tps[0], "-00") || !strings.HasPrefix(tps[1], "00-"+incomingTraceID+"-") || !strings.HasSuffix(tps[1], "-00")):
				t.Errorf("upstream traceparents sampled out: got %q, want unsampled ones, the second in the client's trace", tps)
			}
			if spans, _ := sink.snapshot(); len(spans) != 0 {
				t.Errorf("exported spans: got %v, want none", spanNames(spans))
			}
		})
	}
}

// TestTracingUpstreamError: an upstream that cannot be reached: the upstream
// span records the error, the server span the proxy's 502 and the outcome
// (the claim released).
func TestTracingUpstreamError(t *testing.T) {
	sink, endpoint := newOTLPHTTPSink(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused from now on
	env := append([]string{"UPSTREAM_URL=" + deadURL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR="},
		tracingEnv(t, envEndpoint+"="+endpoint)...)
	a, _ := startEnv(t, env...)
	c := newClient(t)
	if r := mustPost(t, c, proxyURL(a, "/v1/orders"), "k-err", `{}`); r.status != http.StatusBadGateway {
		t.Fatalf("POST: got %v, want %v", r.status, http.StatusBadGateway)
	}
	flush(t, a)
	spans, _ := sink.snapshot()
	servers := serverSpans(spans)
	if len(servers) != 1 {
		t.Fatalf("server spans: got %d, want 1 (%v)", len(servers), spanNames(spans))
	}
	srv := servers[0]
	checkAttrs(t, srv, map[string]string{"http.response.status_code": "502", "idempotency.outcome": "released", "error.type": "502"})
	if srv.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("server span status: got %v, want error", srv.GetStatus())
	}
	kids := children(spans, srv)
	if len(kids["POST"]) != 1 || len(kids["redis release"]) != 1 {
		t.Fatalf("children: got %v, want POST and redis release", keysOf(kids))
	}
	up := kids["POST"][0]
	checkAttrs(t, up, map[string]string{"error.type": "upstream_error"})
	if up.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("upstream span status: got %v, want error", up.GetStatus())
	}
	if _, ok := attrs(up)["http.response.status_code"]; ok {
		t.Errorf("upstream span has a response status; there was no response")
	}
}

// TestTracingSpanAttributesBounded: a client controls User-Agent, the path
// and Host, and with the default parentbased sampler also whether its
// request is sampled. The SDK's attribute value length limit is unlimited by
// default (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT unset): with none set by
// newTracing, every byte of those headers (up to net/http's 1 MB header
// limit) was exported in each span. The proxy bounds what a client can make
// it export.
func TestTracingSpanAttributesBounded(t *testing.T) {
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
	req, _ := http.NewRequest(http.MethodGet, proxyURL(a, longPath), nil)
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

// TestTracingQueuedSpansMemoryBounded: with the collector hanging (down
// behind a load balancer, or slow), every span waits in the batch
// processor's queue (2048 spans by default). Each queued span keeps its
// client-supplied attributes alive, so memory grew with the size of the
// clients' headers, not with a bound the proxy sets. 48 requests with a
// 600 KB User-Agent must not pin ~30 MB.
func TestTracingQueuedSpansMemoryBounded(t *testing.T) {
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
		req, _ := http.NewRequest(http.MethodGet, proxyURL(a, "/v1/orders/1"), nil)
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

// otlpSink collects the spans exported to it, with their service name.
type otlpSink struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	requests int
}

func (s *otlpSink) add(req *coltracepb.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				s.services = append(s.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			s.spans = append(s.spans, ss.GetSpans()...)
		}
	}
}

func (s *otlpSink) snapshot() ([]*tracepb.Span, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*tracepb.Span(nil), s.spans...), append([]string(nil), s.services...)
}

// newOTLPHTTPSink is an OTLP/HTTP receiver: POST /v1/traces with an
// ExportTraceServiceRequest in protobuf.
func newOTLPHTTPSink(t *testing.T) (*otlpSink, string) {
	t.Helper()
	sink := &otlpSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		b, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			t.Errorf("OTLP receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sink.add(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return sink, srv.URL
}

type grpcSink struct {
	coltracepb.UnimplementedTraceServiceServer
	sink *otlpSink
}

func (g grpcSink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.sink.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// newOTLPGRPCSink is an OTLP/gRPC receiver on 127.0.0.1.
func newOTLPGRPCSink(t *testing.T) (*otlpSink, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sink := &otlpSink{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, grpcSink{sink: sink})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return sink, "http://" + l.Addr().String()
}

// tracingEnv sets the OTEL_* variables in the process environment (the SDK
// reads them there) and returns them for loadConfig too. Tests using it
// cannot run in parallel.
func tracingEnv(t *testing.T, kv ...string) []string {
	t.Helper()
	for _, name := range []string{envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol, envSampler, envSamplerArg,
		"OTEL_SERVICE_NAME", envResourceAttrs, envSDKDisabled, envHeaders, envTracesHeaders} {
		t.Setenv(name, "") // restored when the test ends
		os.Unsetenv(name)
	}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	return kv
}

// flush exports every span ended so far.
func flush(t *testing.T, a *app) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.tracing.sdk.ForceFlush(ctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
}

func attrs(sp *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range sp.GetAttributes() {
		m[kv.GetKey()] = anyValue(kv.GetValue())
	}
	return m
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return v.String()
}

func hexID(b []byte) string { return hex.EncodeToString(b) }

// children returns the spans whose parent is sp, by name.
func children(spans []*tracepb.Span, sp *tracepb.Span) map[string][]*tracepb.Span {
	m := map[string][]*tracepb.Span{}
	for _, c := range spans {
		if bytes.Equal(c.GetParentSpanId(), sp.GetSpanId()) && bytes.Equal(c.GetTraceId(), sp.GetTraceId()) {
			m[c.GetName()] = append(m[c.GetName()], c)
		}
	}
	return m
}

func serverSpans(spans []*tracepb.Span) []*tracepb.Span {
	var out []*tracepb.Span
	for _, sp := range spans {
		if sp.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
			out = append(out, sp)
		}
	}
	return out
}

// tracedUpstream answers 201 and remembers the traceparent of each call.
func tracedUpstream(t *testing.T) (*testutil.Upstream, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	up := testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":1}`)
	})
	return up, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

const (
	incomingTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpanID  = "00f067aa0ba902b7"
	secretKey       = "order-secret-key-7f3a"
)

func checkAttrs(t *testing.T, sp *tracepb.Span, want map[string]string) {
	t.Helper()
	got := attrs(sp)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q attribute %s: got %q, want %q", sp.GetName(), k, got[k], v)
		}
	}
}

func spanNames(spans []*tracepb.Span) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, sp.GetName())
	}
	return out
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
