package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/claim"
)

func BenchmarkParseKeyAndFingerprint(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/v1/orders?expand=customer", nil)
	body := []byte(strings.Repeat("x", 200))
	vals := []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseKey(vals, 255); err != nil {
			b.Fatal(err)
		}
		_ = fingerprint(r, body, FingerprintStrict)
	}
}

// roundTripperFunc answers upstream requests in memory, so the benchmark
// measures the handler and Redis, not a network upstream.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var upstreamBody = strings.Repeat("y", 200)

func memoryUpstream(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode:    http.StatusCreated,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(upstreamBody)),
		ContentLength: int64(len(upstreamBody)),
		Request:       r,
	}, nil
}

func benchHandler(b *testing.B) *Handler {
	mr := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	b.Cleanup(func() { _ = rdb.Close() })
	u, _ := url.Parse("http://upstream.invalid")
	h, err := New(claim.NewStore(rdb, "idem:", nil), Options{
		Upstream:        u,
		KeyHeader:       "Idempotency-Key",
		Methods:         []string{"POST"},
		Default:         Policy{TTL: time.Hour, LockTTL: time.Minute},
		MaxKeyLength:    255,
		MaxBodyBytes:    1 << 20,
		MaxStoredBytes:  1 << 20,
		ScopeHeaders:    []string{"Authorization"},
		UpstreamTimeout: 10 * time.Second, RequestReadTimeout: 10 * time.Second,
		Transport: roundTripperFunc(memoryUpstream),
	})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

func serve(b *testing.B, h *Handler, key string) {
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Authorization", "Bearer sk_test")
	w := newRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// BenchmarkHandlerUnique: every request a new key (claim, forward, complete).
func BenchmarkHandlerUnique(b *testing.B) {
	h := benchHandler(b)
	var n atomic.Int64
	b.ReportAllocs()
	for b.Loop() {
		serve(b, h, fmt.Sprint("k", n.Add(1)))
	}
}

// BenchmarkHandlerReplay: every request a duplicate (one claim round trip).
func BenchmarkHandlerReplay(b *testing.B) {
	h := benchHandler(b)
	serve(b, h, "same")
	b.ReportAllocs()
	for b.Loop() {
		serve(b, h, "same")
	}
}

// fakeScripter answers the claim scripts in memory with fixed replies, so a
// benchmark sees the proxy's own cost and no Redis at all.
type fakeScripter struct{ reply []any }

func (f fakeScripter) cmd(ctx context.Context) *redis.Cmd {
	return redis.NewCmdResult(f.reply, nil)
}
func (f fakeScripter) Eval(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}
func (f fakeScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}
func (f fakeScripter) EvalRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}
func (f fakeScripter) EvalShaRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}
func (f fakeScripter) ScriptExists(ctx context.Context, _ ...string) *redis.BoolSliceCmd {
	return redis.NewBoolSliceResult([]bool{true}, nil)
}
func (f fakeScripter) ScriptLoad(ctx context.Context, _ string) *redis.StringCmd {
	return redis.NewStringResult("", nil)
}

// claimAndCompleteOK answers "claimed" to the claim script and "ok" to
// complete (both are answered by the same fake: the proxy only reads the
// status, and "claimed"/"ok" are both first elements).
type scriptByArgs struct{}

func (scriptByArgs) reply(args []any) []any {
	if _, ttl := args[3].(int64); ttl { // claim: token, fp, lock TTL, key TTL, upstream; complete: token, record, TTL, fp
		return []any{"claimed"}
	}
	return []any{"ok"}
}

type phaseScripter struct{ fakeScripter }

func (p phaseScripter) EvalSha(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	return redis.NewCmdResult(scriptByArgs{}.reply(args), nil)
}

// BenchmarkHandlerOwnCost: the whole handler for a first request (claim,
// forward, record), with Redis and upstream answered in memory: what the
// proxy itself costs per request, and its allocations.
func BenchmarkHandlerOwnCost(b *testing.B) {
	h, err := New(claim.NewStore(phaseScripter{}, "idem:", nil), memoryOptions(nil))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		serve(b, h, "k")
	}
}

// replayScripter answers every claim with a completed record.
type replayScripter struct {
	fakeScripter
	rec   string
	trace string // the record's field tr; "" for none
}

func (p replayScripter) EvalSha(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	if p.trace != "" {
		return redis.NewCmdResult([]any{"replay", p.rec, "3600000", p.trace}, nil)
	}
	return redis.NewCmdResult([]any{"replay", p.rec, "3600000"}, nil)
}

// BenchmarkHandlerReplayCached: a replay answered from the ReplayCache, no
// Redis and no upstream: the proxy's whole cost for a cached replay.
func BenchmarkHandlerReplayCached(b *testing.B) {
	rec := (&claim.Record{Status: 201, Header: map[string][]string{
		"Content-Type": {"application/json"}, "Content-Length": {"200"}, "Date": {"Sun, 22 Nov 2026 00:47:57 GMT"},
	}, Body: []byte(upstreamBody)}).Encode()
	h, err := New(claim.NewStore(replayScripter{rec: string(rec)}, "idem:", nil, claim.ReplayCache(1<<20, time.Minute)), memoryOptions(nil))
	if err != nil {
		b.Fatal(err)
	}
	body := `{"amount":100}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "same")
		r.Header.Set("Authorization", "Bearer sk_test")
		w := newRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// BenchmarkBareReverseProxy is the reference for BenchmarkHandlerOwnCost:
// the same request through a plain httputil.ReverseProxy.
func BenchmarkBareReverseProxy(b *testing.B) {
	u, _ := url.Parse("http://upstream.invalid")
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport:  roundTripperFunc(memoryUpstream),
		BufferPool: NewBufferPool(),
	}
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "k")
		r.Header.Set("Authorization", "Bearer sk_test")
		w := newRecorder()
		rp.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// BenchmarkKeySource1KiB is the handler's own cost for a first request
// with a 1 KiB JSON body, its key from the Idempotency-Key header or from
// the body's "id" (key=json:/id): the target "a json: key source adds
// no more than 10 % proxy CPU" measured without the noise of a shared machine.
func BenchmarkKeySource1KiB(b *testing.B) {
	body := `{"id":"evt_1NGqQ2LkdIwHu7ixaxS2bDnD","object":"event","api_version":"2023-10-16","created":1686089970,` +
		`"data":{"object":{"id":"pi_3NGqPzLkdIwHu7ix0YbwwpJ8","object":"payment_intent","amount":2000,"amount_capturable":0,` +
		`"amount_received":2000,"capture_method":"automatic","client_secret":"pi_3NGqPzLkdIwHu7ix0YbwwpJ8_secret_abcdefghijklmnop",` +
		`"confirmation_method":"automatic","created":1686089967,"currency":"usd","customer":"cus_O2vQy7Pt1cWb3C",` +
		`"description":"Subscription creation","latest_charge":"ch_3NGqPzLkdIwHu7ix0Ab1Cd2E","livemode":false,` +
		`"metadata":{"order_id":"6735","internal_ref":"ref_98765"},"payment_method":"pm_1NGqPyLkdIwHu7ixQwErTyUi",` +
		`"payment_method_types":["card"],"receipt_email":"jenny.rosen@example.com","status":"succeeded"}},` +
		`"livemode":false,"pending_webhooks":1,"request":{"id":"req_Kt4Yu8PcZ8cvJZ","idempotency_key":"a4f1c3e2-8b7d-4e6f-9a1b-2c3d4e5f6a7b"},` +
		`"type":"payment_intent.succeeded"}`
	routes, err := ParseRoutes("POST /hooks/stripe key=json:/id")
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(claim.NewStore(phaseScripter{}, "idem:", nil), memoryOptions(routes))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, path, key string }{{"header", "/v1/orders", "evt_1NGqQ2LkdIwHu7ixaxS2bDnD"}, {"json", "/hooks/stripe", ""}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, c.path, strings.NewReader(body))
				if c.key != "" {
					r.Header.Set("Idempotency-Key", c.key)
				}
				w := newRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

// deadlineRecorder is an httptest.ResponseRecorder with the connection
// deadlines a server's ResponseWriter has (no-ops here). Without them every
// ResponseController deadline call returns a new "feature not supported"
// error (fmt.Errorf, three allocations) that no real request pays: about ten
// of the allocations a first request seemed to cost in these benchmarks.
type deadlineRecorder struct{ *httptest.ResponseRecorder }

func newRecorder() deadlineRecorder { return deadlineRecorder{httptest.NewRecorder()} }

func (deadlineRecorder) SetReadDeadline(time.Time) error  { return nil }
func (deadlineRecorder) SetWriteDeadline(time.Time) error { return nil }

// memoryOptions are the options of the in-memory handler benchmarks: the
// upstream answered by memoryUpstream, the contract's defaults otherwise.
func memoryOptions(routes []Route) Options {
	u, _ := url.Parse("http://upstream.invalid")
	return Options{
		Upstream: u, KeyHeader: "Idempotency-Key", Methods: []string{"POST"}, Routes: routes,
		Default:      Policy{TTL: time.Hour, LockTTL: time.Minute},
		MaxKeyLength: 255, MaxBodyBytes: 1 << 20, MaxStoredBytes: 1 << 20,
		ScopeHeaders: []string{"Authorization"}, UpstreamTimeout: 10 * time.Second, RequestReadTimeout: 10 * time.Second,
		Transport: roundTripperFunc(memoryUpstream),
	}
}

// TestReplayAllocations bounds what a cached replay allocates in the
// handler, the request id and its header included: a request's log lines
// take its id as a field, so no logger, context or request copy is made per
// request (they were four allocations on every request).
func TestReplayAllocations(t *testing.T) {
	rec := (&claim.Record{Status: 201, Header: map[string][]string{
		"Content-Type": {"application/json"}, "Content-Length": {"200"},
	}, Body: []byte(upstreamBody)}).Encode()
	opts := memoryOptions(nil)
	opts.Logger = zerolog.New(io.Discard).Level(zerolog.WarnLevel)
	h, err := New(claim.NewStore(replayScripter{rec: string(rec)}, "idem:", nil, claim.ReplayCache(1<<20, time.Minute)), opts)
	if err != nil {
		t.Fatal(err)
	}
	newReq := func() (*http.Request, deadlineRecorder) {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "same")
		return r, newRecorder()
	}
	setup := testing.AllocsPerRun(200, func() { newReq() })
	total := testing.AllocsPerRun(200, func() {
		r, w := newReq()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("status %d, replayed %q", w.Code, w.Header().Get("Idempotent-Replayed"))
		}
	})
	t.Logf("%.0f allocations per cached replay in the handler (%.0f in the test's request)", total-setup, setup)
	if n := total - setup; n > 13 {
		t.Errorf("%.0f allocations per cached replay in the handler, want at most 13", n)
	}
}

// BenchmarkHandlerOwnCostTraced is BenchmarkHandlerOwnCost with tracing on:
// every request sampled, its spans (server, upstream client, one per Redis
// script) batched to an exporter that discards them. The difference is what
// tracing costs the proxy per request; tracing off is BenchmarkHandlerOwnCost.
func BenchmarkHandlerOwnCostTraced(b *testing.B) {
	for _, sampler := range []struct {
		name string
		s    sdktrace.Sampler
	}{{"sampled", sdktrace.AlwaysSample()}, {"sampled_out", sdktrace.NeverSample()}} {
		b.Run(sampler.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler.s), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
			opts := memoryOptions(nil)
			opts.TracerProvider = tp
			h, err := New(claim.NewStore(phaseScripter{}, "idem:", nil, claim.Tracing(tp)), opts)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				serve(b, h, "k")
			}
		})
	}
}

// BenchmarkHandlerReplayCachedTraced is BenchmarkHandlerReplayCached with
// every request sampled: a replay's server span, with its link to the
// recorded execution, batched to an exporter that discards it.
func BenchmarkHandlerReplayCachedTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
	rec := &claim.Record{Status: 201, Header: map[string][]string{
		"Content-Type": {"application/json"}, "Content-Length": {"200"},
	}, Body: []byte(upstreamBody)}
	opts := memoryOptions(nil)
	opts.TracerProvider = tp
	h, err := New(claim.NewStore(replayScripter{rec: string(rec.Encode()), trace: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}, "idem:", nil,
		claim.ReplayCache(1<<20, time.Minute), claim.Tracing(tp)), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		serve(b, h, "same")
	}
}
