package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// The tests below follow the rows of the contract's "HTTP behaviour" table.
// Each runs against miniredis and against a real redis-server.

func forBoth(t *testing.T, mutate func(*proxy.Options), test func(t *testing.T, e *env)) {
	for _, b := range bothBackends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, b, mutate))
		})
	}
}

func TestNoKeyIsForwardedAndNotStored(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		for i := range 2 {
			r := e.do(req{body: "x"})
			if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("request %d: status %d, replayed %q; want a fresh 201", i, r.StatusCode, r.Header.Get("Idempotent-Replayed"))
			}
		}
		if got := e.calls.Load(); got != 2 {
			t.Errorf("upstream calls %d, want 2", got)
		}
		if keys := e.redisKeys(); len(keys) != 0 {
			t.Errorf("Redis keys %v, want none", keys)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "no_key"}); got != 2 {
			t.Errorf("no_key count %v, want 2", got)
		}
	})
}

func TestKeyRequired(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.Required = true }, func(t *testing.T, e *env) {
		r := e.do(req{body: "x"})
		if r.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", r.StatusCode)
		}
		p := r.problem(t)
		if p["title"] != "Idempotency-Key is missing" || p["type"] != "urn:idemproxy:problem:key-missing" {
			t.Errorf("problem %v", p)
		}
		// Methods that are not covered are still passed through.
		if r := e.do(req{method: http.MethodGet}); r.StatusCode != http.StatusCreated {
			t.Errorf("GET without key: status %d, want the upstream's 201", r.StatusCode)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1 (the GET)", got)
		}
	})
}

func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.MaxKeyLength = 8 }, func(t *testing.T, e *env) {
		cases := map[string]http.Header{
			"empty":       {"Idempotency-Key": {""}},
			"too long":    {"Idempotency-Key": {"123456789"}},
			"not ascii":   {"Idempotency-Key": {"clé"}},
			"inner space": {"Idempotency-Key": {"a b"}},
			"repeated":    {"Idempotency-Key": {"a", "b"}},
			"comma":       {"Idempotency-Key": {"a,b"}},
			"bad sf":      {"Idempotency-Key": {`"abc`}},
		}
		for name, h := range cases {
			r := e.do(req{header: h, body: "x"})
			if r.StatusCode != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400", name, r.StatusCode)
				continue
			}
			if p := r.problem(t); p["type"] != "urn:idemproxy:problem:key-invalid" {
				t.Errorf("%s: problem %v", name, p)
			}
		}
		if got := e.calls.Load(); got != 0 {
			t.Errorf("upstream calls %d, want 0", got)
		}
		// A quoted sf-string and the bare token are the same key.
		if r := e.do(req{key: `"k1"`, body: "x"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("quoted key: status %d", r.StatusCode)
		}
		if r := e.do(req{key: "k1", body: "x"}); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("bare form of a quoted key was not replayed (status %d)", r.StatusCode)
		}
	})
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.MaxBodyBytes = 10 }, func(t *testing.T, e *env) {
		r := e.do(req{key: "big", body: strings.Repeat("x", 11)})
		if r.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", r.StatusCode)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:body-too-large" {
			t.Errorf("problem %v", p)
		}
		// Chunked (no Content-Length): counted while reading.
		hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", io.MultiReader(strings.NewReader(strings.Repeat("y", 20))))
		hr.Header.Set("Idempotency-Key", "big2")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked: status %d, want 413", resp.StatusCode)
		}
		// Without a key, a large body streams through untouched.
		if r := e.do(req{body: strings.Repeat("z", 1000)}); r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), `"body_len":1000`) {
			t.Errorf("keyless large body: status %d body %s", r.StatusCode, r.body)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
		if keys := e.redisKeys(); len(keys) != 0 {
			t.Errorf("413 left Redis keys %v", keys)
		}
	})
}

func TestFirstIsRecordedAndReplayed(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		first := e.do(req{key: "order-1", body: `{"amount":100}`})
		if first.StatusCode != http.StatusCreated {
			t.Fatalf("first: status %d", first.StatusCode)
		}
		if first.Header.Get("Idempotency-Key") != "order-1" || first.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("first: echo %q replayed %q", first.Header.Get("Idempotency-Key"), first.Header.Get("Idempotent-Replayed"))
		}
		if first.Header.Get("X-Hop") != "" {
			t.Errorf("hop-by-hop X-Hop reached the client")
		}
		for i := range 3 {
			again := e.do(req{key: "order-1", body: `{"amount":100}`})
			if again.StatusCode != http.StatusCreated || !bytes.Equal(again.body, first.body) {
				t.Fatalf("replay %d: %d %s, want %d %s", i, again.StatusCode, again.body, first.StatusCode, first.body)
			}
			if again.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay %d lacks Idempotent-Replayed: true", i)
			}
			if again.Header.Get("Idempotency-Key") != "order-1" {
				t.Errorf("replay %d: echo %q", i, again.Header.Get("Idempotency-Key"))
			}
			for _, h := range []string{"Content-Type", "X-Custom", "Set-Cookie", "Date"} {
				if again.Header.Get(h) != first.Header.Get(h) {
					t.Errorf("replay %d: %s = %q, want %q", i, h, again.Header.Get(h), first.Header.Get(h))
				}
			}
			if again.Header.Get("X-Hop") != "" || again.Header.Get("Connection") == "X-Hop" {
				t.Errorf("replay %d carries hop-by-hop headers", i)
			}
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "replayed", "route": "default"}); got != 3 {
			t.Errorf("replayed count %v, want 3", got)
		}
	})
}

func TestBinaryBodiesReplayByteExact(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		payload := make([]byte, 64<<10)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			in, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(append(in, payload...))
		})
		reqBody := string([]byte{0, 0xff, '\r', '\n', 0x80, 0})
		first := e.do(req{key: "bin", body: reqBody})
		again := e.do(req{key: "bin", body: reqBody})
		want := append([]byte(reqBody), payload...)
		if !bytes.Equal(first.body, want) || !bytes.Equal(again.body, want) {
			t.Fatalf("bodies differ: first %d bytes, replay %d bytes, want %d", len(first.body), len(again.body), len(want))
		}
		if again.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
			t.Errorf("replayed=%q calls=%d", again.Header.Get("Idempotent-Replayed"), e.calls.Load())
		}
	})
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Methods = []string{"POST", "PATCH"} }, func(t *testing.T, e *env) {
		if r := e.do(req{key: "m", path: "/v1/orders?a=1&b=2", body: "one"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", r.StatusCode)
		}
		variants := map[string]req{
			"body":         {key: "m", path: "/v1/orders?a=1&b=2", body: "two"},
			"path":         {key: "m", path: "/v1/other?a=1&b=2", body: "one"},
			"query":        {key: "m", path: "/v1/orders?a=1&b=3", body: "one"},
			"query order":  {key: "m", path: "/v1/orders?b=2&a=1", body: "one"},
			"method":       {key: "m", method: http.MethodPatch, path: "/v1/orders?a=1&b=2", body: "one"},
			"no query":     {key: "m", path: "/v1/orders", body: "one"},
			"escaped path": {key: "m", path: "/v1/ord%65rs?a=1&b=2", body: "one"},
		}
		for name, v := range variants {
			r := e.do(v)
			if r.StatusCode != http.StatusUnprocessableEntity {
				t.Errorf("%s: status %d, want 422", name, r.StatusCode)
				continue
			}
			if p := r.problem(t); p["title"] != "Idempotency-Key is already used" {
				t.Errorf("%s: problem %v", name, p)
			}
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
	})
}

func TestInFlight(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.handler(e.created))
		done := make(chan response, 1)
		go func() { done <- e.do(req{key: "slow", body: "b"}) }()
		g.wait(t)

		dup := e.do(req{key: "slow", body: "b"})
		if dup.StatusCode != http.StatusConflict || dup.Header.Get("Retry-After") != "1" {
			t.Fatalf("duplicate in flight: status %d Retry-After %q, want 409 and 1", dup.StatusCode, dup.Header.Get("Retry-After"))
		}
		if p := dup.problem(t); p["title"] != "A request is outstanding for this Idempotency-Key" {
			t.Errorf("problem %v", p)
		}
		// A different body while in flight: 422 wins over 409.
		if r := e.do(req{key: "slow", body: "other"}); r.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("mismatch while in flight: status %d, want 422", r.StatusCode)
		}
		g.open()
		if first := <-done; first.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", first.StatusCode)
		}
		if r := e.do(req{key: "slow", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("after completion: status %d, not replayed", r.StatusCode)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
	})
}

func TestWaitReplaysWhenFirstCompletes(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.Wait = 5 * time.Second }, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.handler(e.created))
		first := make(chan response, 1)
		go func() { first <- e.do(req{key: "w", body: "b"}) }()
		g.wait(t)
		waiter := make(chan response, 1)
		go func() { waiter <- e.do(req{key: "w", body: "b"}) }()
		// The waiter is polling; let the first finish.
		eventually(t, 5*time.Second, "waiter polls Redis", func() bool {
			return counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "inflight"}) >= 2
		})
		g.open()
		f, w := <-first, <-waiter
		if f.StatusCode != http.StatusCreated || w.StatusCode != http.StatusCreated || !bytes.Equal(f.body, w.body) {
			t.Fatalf("first %d %s, waiter %d %s", f.StatusCode, f.body, w.StatusCode, w.body)
		}
		if w.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
			t.Errorf("waiter replayed=%q, upstream calls %d; want a replay and 1 call", w.Header.Get("Idempotent-Replayed"), e.calls.Load())
		}
	})
}

func TestWaitClaimsWhenFirstIsReleased(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.Wait = 5 * time.Second }, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.first(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, e.created))
		first := make(chan response, 1)
		go func() { first <- e.do(req{key: "w5", body: "b"}) }()
		g.wait(t)
		waiter := make(chan response, 1)
		go func() { waiter <- e.do(req{key: "w5", body: "b"}) }()
		eventually(t, 5*time.Second, "waiter polls Redis", func() bool {
			return counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "inflight"}) >= 1
		})
		g.open()
		if f := <-first; f.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("first: %d, want the upstream's 503", f.StatusCode)
		}
		w := <-waiter
		if w.StatusCode != http.StatusCreated || w.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("waiter: %d replayed=%q, want a fresh 201 (it took over the released key)", w.StatusCode, w.Header.Get("Idempotent-Replayed"))
		}
		if got := e.calls.Load(); got != 2 {
			t.Errorf("upstream calls %d, want 2", got)
		}
	})
}

func TestWaitRunsOut(t *testing.T) {
	forBoth(t, func(o *proxy.Options) { o.Default.Wait = 150 * time.Millisecond }, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.handler(e.created))
		go e.do(req{key: "w2", body: "b"})
		g.wait(t)
		start := time.Now()
		r := e.do(req{key: "w2", body: "b"})
		if r.StatusCode != http.StatusConflict || r.Header.Get("Retry-After") != "1" {
			t.Fatalf("status %d, want 409 with Retry-After", r.StatusCode)
		}
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Errorf("answered after %v, before the 150ms wait ran out", took)
		}
		g.open()
	})
}

func TestRedisDownFailClosed(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.stopRedis()
		r := e.do(req{key: "down", body: "b"})
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", r.StatusCode, r.Header.Get("Retry-After"))
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:store-unavailable" {
			t.Errorf("problem %v", p)
		}
		if e.calls.Load() != 0 {
			t.Errorf("upstream called while failing closed")
		}
		// Requests without a key are not affected.
		if r := e.do(req{body: "b"}); r.StatusCode != http.StatusCreated {
			t.Errorf("keyless request with Redis down: %d", r.StatusCode)
		}
	})
}

func TestRedisDownFailOpen(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.FailOpen = true }, func(t *testing.T, e *env) {
		e.stopRedis()
		for range 2 {
			r := e.do(req{key: "open", body: "body-bytes"})
			if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), `"body_len":10`) {
				t.Fatalf("status %d body %s, want the upstream's 201 with the whole body", r.StatusCode, r.body)
			}
		}
		if e.calls.Load() != 2 {
			t.Errorf("upstream calls %d, want 2 (no guarantee when failing open)", e.calls.Load())
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "fail_open"}); got != 2 {
			t.Errorf("fail_open count %v, want 2", got)
		}
		if !strings.Contains(e.logs.String(), "fail open") {
			t.Errorf("fail-open forward not logged as a warning")
		}
	})
}

func (e *env) stopRedis() {
	if e.mr != nil {
		e.mr.Close()
		return
	}
	e.redis.Kill()
}

func TestDialErrorReleases(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		opts := e.opts
		opts.Upstream.Host = addr
		_, srv, reg := e.newProxy(opts)

		r := e.doTo(srv, req{key: "dial", body: "b"})
		if r.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", r.StatusCode)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:upstream-unreachable" {
			t.Errorf("problem %v", p)
		}
		if got := counter(t, reg, "idemproxy_requests_total", map[string]string{"outcome": "released"}); got != 1 {
			t.Errorf("released count %v, want 1", got)
		}
		// Released at once: the key is free, so the retry is forwarded (and
		// fails the same way) instead of getting 409.
		if r := e.doTo(srv, req{key: "dial", body: "b"}); r.StatusCode != http.StatusBadGateway {
			t.Errorf("retry: status %d, want 502 again (not 409)", r.StatusCode)
		}
		if keys := e.redisKeys(); len(keys) != 0 {
			t.Errorf("released claim left keys %v", keys)
		}
	})
}

func TestUpstream5xx(t *testing.T) {
	t.Parallel()
	fail := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "boom")
	}
	t.Run("release", func(t *testing.T) {
		forBoth(t, nil, func(t *testing.T, e *env) {
			e.setUpstream(fail)
			r := e.do(req{key: "5", body: "b"})
			if r.StatusCode != http.StatusInternalServerError || string(r.body) != "boom" {
				t.Fatalf("first: %d %s, want the upstream's 500", r.StatusCode, r.body)
			}
			e.setUpstream(e.created)
			if r := e.do(req{key: "5", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %d, want a fresh execution", r.StatusCode)
			}
			if e.calls.Load() != 2 {
				t.Errorf("upstream calls %d, want 2", e.calls.Load())
			}
		})
	})
	t.Run("store", func(t *testing.T) {
		forBoth(t, func(o *proxy.Options) { o.Default.Store5xx = true }, func(t *testing.T, e *env) {
			e.setUpstream(fail)
			e.do(req{key: "5", body: "b"})
			e.setUpstream(e.created)
			r := e.do(req{key: "5", body: "b"})
			if r.StatusCode != http.StatusInternalServerError || string(r.body) != "boom" || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d %s replayed=%q, want the recorded 500", r.StatusCode, r.body, r.Header.Get("Idempotent-Replayed"))
			}
			if e.calls.Load() != 1 {
				t.Errorf("upstream calls %d, want 1", e.calls.Load())
			}
		})
	})
}

// TestUpstreamTimeoutKeepsClaim: the outcome is unknown, so retries get 409
// until the lock TTL; then one takes over and executes.
func TestUpstreamTimeoutKeepsClaim(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		o.UpstreamTimeout = 100 * time.Millisecond
		o.Default.LockTTL = 300 * time.Millisecond
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.first(e.created, e.created))
		r := e.do(req{key: "t", body: "b"})
		if r.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("status %d, want 504", r.StatusCode)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:upstream-timeout" {
			t.Errorf("problem %v", p)
		}
		if r := e.do(req{key: "t", body: "b"}); r.StatusCode != http.StatusConflict {
			t.Errorf("retry within the lock TTL: %d, want 409", r.StatusCode)
		}
		e.advance(400 * time.Millisecond)
		r = e.do(req{key: "t", body: "b"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after the lock TTL: %d, want a takeover that executes", r.StatusCode)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "takeover"}); got != 1 {
			t.Errorf("takeover count %v, want 1", got)
		}
		if got := counter(t, e.reg, "idemproxy_takeover_claim_age_seconds", nil); got != 1 {
			t.Errorf("takeover age samples %v, want 1", got)
		}
		if r := e.do(req{key: "t", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("after takeover: not replayed")
		}
		g.open()
	})
}

// TestBrokenAnswerKeepsClaim: the upstream got the request and then dropped
// the connection (reset before answering, or mid-body): outcome unknown.
func TestBrokenAnswerKeepsClaim(t *testing.T) {
	t.Parallel()
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	midBody := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "partial")
		_ = http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	t.Run("before answer", func(t *testing.T) {
		forBoth(t, nil, func(t *testing.T, e *env) {
			e.setUpstream(hangUp)
			r := e.do(req{key: "reset", body: "b"})
			if r.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", r.StatusCode)
			}
			if p := r.problem(t); p["type"] != "urn:idemproxy:problem:upstream-failed" {
				t.Errorf("problem %v", p)
			}
			if r := e.do(req{key: "reset", body: "b"}); r.StatusCode != http.StatusConflict {
				t.Errorf("retry: %d, want 409 (claim kept)", r.StatusCode)
			}
			if e.calls.Load() != 1 {
				t.Errorf("upstream calls %d, want 1", e.calls.Load())
			}
		})
	})
	t.Run("mid body", func(t *testing.T) {
		forBoth(t, nil, func(t *testing.T, e *env) {
			e.setUpstream(midBody)
			_, err := e.send(context.Background(), e.srv, req{key: "mid", body: "b"})
			if err == nil {
				t.Fatalf("client got a complete answer from a broken upstream body")
			}
			// The status arrived, so the upstream executed: the retry gets
			// that status, recorded without its body, and no second call.
			r := e.do(req{key: "mid", body: "b"})
			if r.StatusCode != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry: %d replayed %q, want the recorded 200", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
			} else if p := r.problem(t); p["type"] != "urn:idemproxy:problem:response-not-stored" {
				t.Errorf("retry problem %v", p)
			}
			if e.calls.Load() != 1 {
				t.Errorf("upstream calls %d, want 1", e.calls.Load())
			}
			if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "upstream_error"}); got != 1 {
				t.Errorf("upstream_error count %v, want 1", got)
			}
		})
	})
}

func TestLockExpiryTakeover(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		o.Default.LockTTL = 300 * time.Millisecond
		o.UpstreamTimeout = 200 * time.Millisecond
	}, func(t *testing.T, e *env) {
		// A claim written by a proxy that then died: no completion ever comes.
		key := claim.NewKey([]string{""}, "orphan")
		store := claim.NewStore(e.rdb, "idem:", nil)
		fp := fingerprintOf(http.MethodPost, "/v1/orders", "", "b")
		if _, _, err := store.Acquire(context.Background(), key, fp, claim.Terms{LockTTL: 300 * time.Millisecond, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if r := e.do(req{key: "orphan", body: "b"}); r.StatusCode != http.StatusConflict {
			t.Fatalf("while claimed: %d, want 409", r.StatusCode)
		}
		if e.calls.Load() != 0 {
			t.Fatalf("upstream called while the key was claimed")
		}
		e.advance(400 * time.Millisecond)
		if r := e.do(req{key: "orphan", body: "b"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("after lock TTL: %d, want an execution", r.StatusCode)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "takeover"}); got != 1 {
			t.Errorf("takeover count %v, want 1", got)
		}
		if r := e.do(req{key: "orphan", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
			t.Errorf("after takeover: replayed=%q calls=%d, want a replay and 1 call", r.Header.Get("Idempotent-Replayed"), e.calls.Load())
		}
	})
}

func TestLargeResponseNotStored(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789"), 200) // 2000 bytes
	forBoth(t, func(o *proxy.Options) { o.MaxStoredBytes = 1000 }, func(t *testing.T, e *env) {
		for name, upstream := range map[string]http.HandlerFunc{
			"with length": func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "/files/1")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(big)
			},
			"chunked": func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusCreated)
				for i := 0; i < len(big); i += 100 {
					_, _ = w.Write(big[i : i+100])
					_ = http.NewResponseController(w).Flush()
				}
			},
			"event stream": func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "data: small\n\n")
			},
		} {
			key := "big-" + strings.ReplaceAll(name, " ", "-")
			t.Run(name, func(t *testing.T) {
				e.setUpstream(upstream)
				before := e.calls.Load()
				first := e.do(req{key: key, body: "b"})
				if first.StatusCode != http.StatusCreated {
					t.Fatalf("first: %d", first.StatusCode)
				}
				if name != "event stream" && !bytes.Equal(first.body, big) {
					t.Fatalf("first caller got %d bytes, want all %d", len(first.body), len(big))
				}
				r := e.do(req{key: key, body: "b"})
				if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry: %d replayed=%q, want the recorded 201 replayed", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
				}
				if p := r.problem(t); p["type"] != "urn:idemproxy:problem:response-not-stored" {
					t.Errorf("problem %v", p)
				}
				if e.calls.Load() != before+1 {
					t.Errorf("upstream called again for a response too large to store")
				}
			})
		}
	})
}

func TestScope(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		alice := http.Header{"Authorization": {"Bearer alice"}}
		bob := http.Header{"Authorization": {"Bearer bob"}}
		a1 := e.do(req{key: "same", header: alice, body: "b"})
		b1 := e.do(req{key: "same", header: bob, body: "b"})
		if a1.Header.Get("Idempotent-Replayed") != "" || b1.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("one caller got another's answer")
		}
		a2 := e.do(req{key: "same", header: alice, body: "b"})
		if a2.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a2.body, a1.body) {
			t.Errorf("alice's retry was not alice's replay")
		}
		// No scope header: one shared anonymous scope, apart from both.
		n1 := e.do(req{key: "same", body: "b"})
		n2 := e.do(req{key: "same", body: "b"})
		if n1.Header.Get("Idempotent-Replayed") != "" || n2.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("anonymous scope: first replayed=%q second replayed=%q", n1.Header.Get("Idempotent-Replayed"), n2.Header.Get("Idempotent-Replayed"))
		}
		if e.calls.Load() != 3 {
			t.Errorf("upstream calls %d, want 3", e.calls.Load())
		}
		// Neither the key nor the token is stored in clear.
		for _, k := range e.redisKeys() {
			if strings.Contains(k, "same") || strings.Contains(k, "alice") {
				t.Errorf("Redis key %q shows the key or the scope", k)
			}
		}
	})
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	routes, err := proxy.ParseRoutes(`POST /v1/webhooks/* off; POST /v1/payments/* required lock=3s; PUT /v1/items/{id} ttl=1m; POST /v1/short ttl=200ms`)
	if err != nil {
		t.Fatal(err)
	}
	forBoth(t, func(o *proxy.Options) { o.Routes = routes }, func(t *testing.T, e *env) {
		// off: plain pass-through, even with a key.
		for range 2 {
			if r := e.do(req{key: "wh", path: "/v1/webhooks/stripe", body: "b"}); r.Header.Get("Idempotent-Replayed") != "" || r.StatusCode != http.StatusCreated {
				t.Errorf("off route: %d replayed=%q", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
			}
		}
		// required on this route only.
		if r := e.do(req{path: "/v1/payments/p1", body: "b"}); r.StatusCode != http.StatusBadRequest {
			t.Errorf("required route without key: %d, want 400", r.StatusCode)
		}
		if r := e.do(req{path: "/v1/orders", body: "b"}); r.StatusCode != http.StatusCreated {
			t.Errorf("default route without key: %d, want 201", r.StatusCode)
		}
		// A rule covers its method even though METHODS is POST only.
		e.do(req{method: http.MethodPut, key: "put", path: "/v1/items/7", body: "b"})
		if r := e.do(req{method: http.MethodPut, key: "put", path: "/v1/items/7", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("PUT rule: not replayed (status %d)", r.StatusCode)
		}
		// ... while other PUTs pass through.
		e.do(req{method: http.MethodPut, key: "put2", path: "/v1/other", body: "b"})
		if r := e.do(req{method: http.MethodPut, key: "put2", path: "/v1/other", body: "b"}); r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("uncovered PUT was replayed")
		}
		// Per-route TTL: the record expires with it.
		e.do(req{key: "short", path: "/v1/short", body: "b"})
		if r := e.do(req{key: "short", path: "/v1/short", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("short TTL route: not replayed before expiry")
		}
		e.advance(300 * time.Millisecond)
		if r := e.do(req{key: "short", path: "/v1/short", body: "b"}); r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("short TTL route: replayed after its ttl=200ms")
		}
		// Route labels are patterns, never raw paths (bounded cardinality).
		for i := range 5 {
			e.do(req{key: fmt.Sprint("pay", i), path: fmt.Sprintf("/v1/payments/%d", i), body: "b"})
		}
		for _, route := range labelValues(t, e.reg, "idemproxy_requests_total", "route") {
			if route != "default" && !strings.HasPrefix(route, "/v1/webhooks/*") && route != "/v1/payments/*" && route != "/v1/items/{id}" && route != "/v1/short" {
				t.Errorf("route label %q is not a ROUTES pattern", route)
			}
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/v1/payments/*", "outcome": "executed"}); got != 5 {
			t.Errorf("payments executed %v, want 5", got)
		}
	})
}

// TestClientDisconnectStillRecords: the client gives up mid-request; the
// upstream call runs to its end and is recorded, so the retry replays.
func TestClientDisconnectStillRecords(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.handler(e.created))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := e.send(ctx, e.srv, req{key: "gone", body: "b"})
			errc <- err
		}()
		g.wait(t)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("client error %v, want context.Canceled", err)
		}
		g.open()
		eventually(t, 5*time.Second, "the abandoned request is recorded", func() bool {
			return counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "executed"}) == 1
		})
		r := e.do(req{key: "gone", body: "b"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d replayed=%q, want the recorded 201", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
		if e.calls.Load() != 1 {
			t.Errorf("upstream calls %d, want 1", e.calls.Load())
		}
	})
}

// TestClientGoneMidBody: the client stops reading while a large body is
// being copied; the copy goes on and the answer is recorded.
func TestClientGoneMidBody(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) {
		o.MaxStoredBytes = 8 << 20
		// Copying 4 MiB under -race on a loaded 2-core machine can take over a second.
		o.UpstreamTimeout, o.Default.LockTTL = 5*time.Second, 10*time.Second
	}, func(t *testing.T, e *env) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		sent := make(chan struct{})
		e.setUpstream(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			for i := range 64 { // 4 MiB, more than socket buffers hold
				_, _ = w.Write(chunk)
				if i == 0 {
					_ = http.NewResponseController(w).Flush()
					close(sent)
				}
			}
		})
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: midbody\r\nContent-Length: 1\r\n\r\nb")
		<-sent
		conn.Close() // read nothing, leave
		eventually(t, 10*time.Second, "the answer is recorded", func() bool {
			return counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "executed"}) == 1
		})
		r := e.do(req{key: "midbody", body: "b"})
		if r.Header.Get("Idempotent-Replayed") != "true" || len(r.body) != 64*len(chunk) {
			t.Fatalf("retry: replayed=%q, %d bytes; want the full recorded answer", r.Header.Get("Idempotent-Replayed"), len(r.body))
		}
	})
}

// TestConcurrentSameKey: N concurrent requests with one key reach the
// upstream once; the others get 409 (or, once it completed, the replay).
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		const n = 50
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond) // widen the window
			e.created(w, r)
		})
		// A second replica on the same Redis takes half the load.
		_, srv2, _ := e.newProxy(e.opts)
		for round := range 3 {
			key := fmt.Sprint("race-", round)
			var wg sync.WaitGroup
			var created, conflict, replayed, other atomic.Int64
			start := make(chan struct{})
			for i := range n {
				srv := e.srv
				if i%2 == 1 {
					srv = srv2
				}
				wg.Go(func() {
					<-start
					r, err := e.send(context.Background(), srv, req{key: key, body: "same"})
					switch {
					case err != nil:
						other.Add(1)
					case r.StatusCode == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
						replayed.Add(1)
					case r.StatusCode == http.StatusCreated:
						created.Add(1)
					case r.StatusCode == http.StatusConflict:
						conflict.Add(1)
					default:
						other.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if created.Load() != 1 || other.Load() != 0 || created.Load()+conflict.Load()+replayed.Load() != n {
				t.Fatalf("round %d: created %d, 409 %d, replayed %d, other %d; want exactly one execution",
					round, created.Load(), conflict.Load(), replayed.Load(), other.Load())
			}
		}
		if e.calls.Load() != 3 {
			t.Errorf("upstream calls %d, want 3 (one per key)", e.calls.Load())
		}
	})
}

// TestFencedCompletion: the claim is deleted by hand while the first request
// runs; a second request executes; the first's late completion must not
// overwrite the second's record.
func TestFencedCompletion(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		var n atomic.Int64
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				g.handler(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "first")
				})(w, r)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "second")
		})
		first := make(chan response, 1)
		go func() { first <- e.do(req{key: "fence", body: "b"}) }()
		g.wait(t)
		for _, k := range e.redisKeys() {
			e.rdb.Del(context.Background(), k)
		}
		if r := e.do(req{key: "fence", body: "b"}); string(r.body) != "second" {
			t.Fatalf("second: %d %s", r.StatusCode, r.body)
		}
		g.open()
		if f := <-first; string(f.body) != "first" {
			t.Fatalf("first: %d %s", f.StatusCode, f.body)
		}
		r := e.do(req{key: "fence", body: "b"})
		if string(r.body) != "second" || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %q replayed=%q, want the second's record", r.body, r.Header.Get("Idempotent-Replayed"))
		}
		if !strings.Contains(e.logs.String(), "taken over before completion") {
			t.Errorf("the fenced completion was not logged")
		}
	})
}

// fingerprintOf is the contract's fingerprint: SHA-256 over method, path,
// raw query and body, as the proxy computes it.
func fingerprintOf(method, path, query, body string) claim.Fingerprint {
	return claim.Fingerprint(sha256.Sum256([]byte(method + "\x00" + path + "\x00" + query + "\x00" + body)))
}

// TestRedisRestartAndNoScript: a real Redis that restarts (empty, no
// scripts loaded) is used again without restarting the proxy; the claim
// falls back from EVALSHA to EVAL on NOSCRIPT.
func TestRedisRestartAndNoScript(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, nil)
	if r := e.do(req{key: "before", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("before: %d", r.StatusCode)
	}
	e.redis.Kill()
	if r := e.do(req{key: "during", body: "b"}); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("Redis down: %d, want 503", r.StatusCode)
	}
	e.redis.Restart()
	eventually(t, 5*time.Second, "the proxy uses the restarted Redis", func() bool {
		return e.do(req{key: "after", body: "b"}).StatusCode == http.StatusCreated
	})
	if r := e.do(req{key: "after", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after restart: not replayed")
	}
	if err := e.rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if r := e.do(req{key: "flushed", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("after SCRIPT FLUSH: %d", r.StatusCode)
	}
	if r := e.do(req{key: "flushed", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after SCRIPT FLUSH: not replayed")
	}
	if e.calls.Load() != 3 {
		t.Errorf("upstream calls %d, want 3", e.calls.Load())
	}
}

// TestExpectContinueNotForwarded: the body is buffered already; an upstream
// that never sends "100 Continue" must not delay a keyed request.
func TestExpectContinueNotForwarded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for range 10 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				r, err := http.ReadRequest(bufio.NewReader(c)) // never sends 100 Continue
				if err != nil {
					return
				}
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\nX-Saw-Expect: %s\r\nX-Len: %d\r\n\r\n", r.Header.Get("Expect"), len(b))
			}(c)
		}
	}()
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Upstream, _ = url.Parse("http://" + ln.Addr().String())
		o.UpstreamTimeout = 3 * time.Second
		o.Default.LockTTL = 5 * time.Second
	})
	hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", strings.NewReader(strings.Repeat("a", 2000)))
	hr.Header.Set("Idempotency-Key", "exp")
	hr.Header.Set("Expect", "100-continue")
	start := time.Now()
	resp, err := e.srv.Client().Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Saw-Expect") != "" || resp.Header.Get("X-Len") != "2000" {
		t.Errorf("status %d, upstream saw Expect=%q and %s body bytes; want 201, no Expect, 2000", resp.StatusCode, resp.Header.Get("X-Saw-Expect"), resp.Header.Get("X-Len"))
	}
	if took > 800*time.Millisecond {
		t.Errorf("took %v: the proxy waited for a 100 Continue", took)
	}
}

// TestUnreadableRecord: a record this version cannot decode is a 500 and
// never a re-execution, even when failing open.
func TestUnreadableRecord(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.FailOpen = true }, func(t *testing.T, e *env) {
		key := claim.NewKey([]string{""}, "garbled")
		redisKey := "idem:{" + fmt.Sprintf("%x", key[:]) + "}"
		fp := fingerprintOf(http.MethodPost, "/v1/orders", "", "b")
		if err := e.rdb.HSet(context.Background(), redisKey, "st", "c", "fp", string(fp[:]), "rec", "not a record").Err(); err != nil {
			t.Fatal(err)
		}
		r := e.do(req{key: "garbled", body: "b"})
		if r.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", r.StatusCode)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:record-unreadable" {
			t.Errorf("problem %v", p)
		}
		if e.calls.Load() != 0 {
			t.Errorf("upstream called %d times for a completed key", e.calls.Load())
		}
	})
}

// TestStopWaiting: on shutdown a waiting duplicate answers 409 at once
// instead of holding SHUTDOWN_TIMEOUT.
func TestStopWaiting(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.Default.Wait = 30 * time.Second }, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(g.handler(e.created))
		go e.do(req{key: "sw", body: "b"})
		g.wait(t)
		waiter := make(chan response, 1)
		go func() { waiter <- e.do(req{key: "sw", body: "b"}) }()
		eventually(t, 5*time.Second, "waiter polls Redis", func() bool {
			return counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "inflight"}) >= 1
		})
		start := time.Now()
		e.h.StopWaiting()
		select {
		case w := <-waiter:
			if w.StatusCode != http.StatusConflict || w.Header.Get("Retry-After") != "1" {
				t.Errorf("waiter: %d Retry-After %q, want 409 with Retry-After", w.StatusCode, w.Header.Get("Retry-After"))
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("waiter still waiting 2s after StopWaiting")
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("waiter answered %v after StopWaiting", took)
		}
		g.open()
	})
}

// TestEarlyHintsKeepProxyHeaders: ReverseProxy clears the header map after
// relaying a 1xx; the final answer still carries the key echo.
func TestEarlyHintsKeepProxyHeaders(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			e.created(w, r)
		})
		for _, path := range []string{"/v1/orders", "/v1/orders?keyed=no"} {
			key := "hints"
			if strings.Contains(path, "keyed=no") {
				key = ""
			}
			r := e.do(req{key: key, path: path, body: "b"})
			if r.StatusCode != http.StatusCreated {
				t.Fatalf("%s: status %d", path, r.StatusCode)
			}
			if r.Header.Get("X-Request-Id") == "" {
				t.Errorf("%s: X-Request-Id lost after a 103", path)
			}
			if key != "" && r.Header.Get("Idempotency-Key") != key {
				t.Errorf("%s: echo %q after a 103, want %q", path, r.Header.Get("Idempotency-Key"), key)
			}
		}
	})
}

// TestSlowDialIsUnreachable: a request that never got a connection is 502
// "unreachable" and released, even when it was the timeout that ended it.
func TestSlowDialIsUnreachable(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		o.UpstreamTimeout = 200 * time.Millisecond
		o.Transport = testutil.RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done() // a dial that hangs until the deadline
			return nil, r.Context().Err()
		})
	}, func(t *testing.T, e *env) {
		r := e.do(req{key: "slowdial", body: "b"})
		if r.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", r.StatusCode)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:upstream-unreachable" {
			t.Errorf("problem %v", p)
		}
		if keys := e.redisKeys(); len(keys) != 0 {
			t.Errorf("claim not released: keys %v", keys)
		}
	})
}

// TestClaimExpiredBeforeCompletion: when the lock expired before the answer
// could be recorded and nobody took over, the answer is recorded all the
// same (the upstream did execute): the retry replays it.
func TestClaimExpiredBeforeCompletion(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Default.LockTTL = 150 * time.Millisecond // below UPSTREAM_TIMEOUT: config refuses this, Options do not
		o.UpstreamTimeout = 2 * time.Second
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(400 * time.Millisecond)
		e.created(w, r)
	})
	r := e.do(req{key: "late", body: "b"})
	if r.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want the upstream's 201", r.StatusCode)
	}
	if got := counter(t, e.reg, "idemproxy_record_failures_total", nil); got != 0 {
		t.Errorf("record failures %v, want 0", got)
	}
	if got := counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "complete", "result": "late"}); got != 1 {
		t.Errorf("late completions %v, want 1", got)
	}
	if !strings.Contains(e.logs.String(), "answer recorded all the same") {
		t.Errorf("not logged as a recreated record")
	}
	again := e.do(req{key: "late", body: "b"})
	if again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(r.body) {
		t.Errorf("retry: %d replayed %q %s, want the recorded answer", again.StatusCode, again.Header.Get("Idempotent-Replayed"), again.body)
	}
	if other := e.do(req{key: "late", body: "other"}); other.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("other body: %d, want 422 (the fingerprint was recorded)", other.StatusCode)
	}
	if e.calls.Load() != 1 {
		t.Errorf("upstream calls %d, want 1", e.calls.Load())
	}
}

// TestLostCompletionCounted: our claim expired and another request took the
// key over before we could record: the key ran twice, and that is counted
// and logged with outcome "lost".
func TestLostCompletionCounted(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Default.LockTTL = 150 * time.Millisecond
		o.UpstreamTimeout = 2 * time.Second
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() { first <- e.do(req{key: "twice", body: "b"}) }()
	g.wait(t)
	time.Sleep(300 * time.Millisecond) // past the 150ms lock TTL (real Redis PX expiry)
	second := make(chan response, 1)
	go func() { second <- e.do(req{key: "twice", body: "b"}) }()
	g.wait(t) // the takeover reached the upstream
	g.open()
	for _, ch := range []chan response{first, second} {
		select {
		case r := <-ch:
			if r.StatusCode != http.StatusCreated {
				t.Errorf("status %d, want 201", r.StatusCode)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10s")
		}
	}
	if got := counter(t, e.reg, "idemproxy_double_executions_total", nil); got != 1 {
		t.Errorf("double executions %v, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "lost"}); got != 1 {
		t.Errorf("lost outcomes %v, want 1", got)
	}
	if e.calls.Load() != 2 {
		t.Errorf("upstream calls %d, want 2", e.calls.Load())
	}
}

// TestTrailersReplayed: trailers are part of the answer; the replay sends
// them as the first answer had them.
func TestTrailersReplayed(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "payload")
			w.Header().Set("X-Checksum", "abc123")
		})
		first := e.do(req{key: "tr", body: "b"})
		again := e.do(req{key: "tr", body: "b"})
		if first.Trailer.Get("X-Checksum") != "abc123" {
			t.Fatalf("first answer trailer %v, want X-Checksum: abc123", first.Trailer)
		}
		if again.Header.Get("Idempotent-Replayed") != "true" || string(again.body) != "payload" {
			t.Fatalf("replay: %d %q", again.StatusCode, again.body)
		}
		if again.Trailer.Get("X-Checksum") != "abc123" {
			t.Errorf("replay trailer %v, want X-Checksum: abc123", again.Trailer)
		}
	})
}

// TestFailOpenOnlyWhenUnreachable: a Redis that answers but refuses writes
// (OOM under noeviction) is not an outage: fail open must not forward
// without a guarantee; the answer is 503.
func TestFailOpenOnlyWhenUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Default.FailOpen = true })
	ctx := context.Background()
	if err := e.rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	r := e.do(req{key: "oom", body: "b"})
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("OOM with FAIL_MODE=open: status %d, want 503", r.StatusCode)
	}
	if e.calls.Load() != 0 {
		t.Errorf("upstream called %d times while Redis refused writes", e.calls.Load())
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	e.redis.Kill()
	if r := e.do(req{key: "down", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Errorf("Redis down with FAIL_MODE=open: status %d, want the forwarded 201", r.StatusCode)
	}
}

// TestDeploymentsBoundToTheirUpstream: two deployments in front of
// different APIs share one Redis and the default KEY_PREFIX. A key sent to
// both is executed by the first and refused (422) by the second: neither
// replays the other's answer.
func TestDeploymentsBoundToTheirUpstream(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		serviceB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "service B")
		}))
		defer serviceB.Close()
		newDeployment := func(upstream string) *httptest.Server {
			opts := e.opts
			opts.Upstream = mustURL(t, upstream)
			reg := prometheus.NewRegistry()
			opts.Metrics = proxy.NewMetrics(reg)
			opts.Logger = zerolog.New(e.logs)
			h, err := proxy.New(claim.NewStore(e.rdb, "idem:", nil, claim.Upstream(upstream)), opts)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			return srv
		}
		a, b := newDeployment(e.upstream.URL), newDeployment(serviceB.URL)
		if r := e.doTo(a, req{key: "shared", body: "x"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("service A: %d", r.StatusCode)
		}
		r := e.doTo(b, req{key: "shared", body: "x"})
		if r.StatusCode != http.StatusUnprocessableEntity || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("service B with A's key: %d %s, want 422 (never A's answer)", r.StatusCode, r.body)
		}
		if again := e.doTo(a, req{key: "shared", body: "x"}); again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("service A retry: %d, want the replay", again.StatusCode)
		}
		if e.calls.Load() != 1 {
			t.Errorf("service A called %d times, want 1", e.calls.Load())
		}
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// hold configures ON_UNKNOWN=hold with a lock far shorter than the key's
// TTL, so that every test also shows the lock's expiry changes nothing.
func hold(o *proxy.Options) {
	o.Default.Hold = true
	o.UpstreamTimeout = 300 * time.Millisecond
	o.Default.LockTTL = 400 * time.Millisecond
}

// wantUnknown checks the answer to a request whose key's outcome is
// unknown: the first answer's status, outcome-unknown, replayed, no
// Retry-After.
func wantUnknown(t *testing.T, r response, status int) {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("status %d (%s), want %d outcome-unknown", r.StatusCode, r.body, status)
	}
	p := r.problem(t)
	if p["type"] != "urn:idemproxy:problem:outcome-unknown" || p["title"] != "Outcome of the original request is unknown" {
		t.Errorf("problem %v, want outcome-unknown", p)
	}
	if r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Retry-After") != "" {
		t.Errorf("Idempotent-Replayed %q Retry-After %q, want true and none", r.Header.Get("Idempotent-Replayed"), r.Header.Get("Retry-After"))
	}
}

// TestHoldUpstreamTimeout is case (a): the upstream timed out after the
// request was sent. The caller gets 504 as before; from that moment every
// retry gets 504 outcome-unknown without reaching the upstream, past the
// lock TTL too, until the key is purged; then exactly one executes.
func TestHoldUpstreamTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, hold)
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	r := e.do(req{key: "pay-1", body: "b"})
	if r.StatusCode != http.StatusGatewayTimeout || r.problem(t)["type"] != "urn:idemproxy:problem:upstream-timeout" {
		t.Fatalf("first: %d %s, want 504 upstream-timeout", r.StatusCode, r.body)
	}
	if !strings.Contains(r.problem(t)["detail"].(string), "purges") {
		t.Errorf("detail %q does not say the key is held for an operator", r.problem(t)["detail"])
	}
	wantUnknown(t, e.do(req{key: "pay-1", body: "b"}), http.StatusGatewayTimeout)
	e.advance(600 * time.Millisecond) // past LOCK_TTL
	wantUnknown(t, e.do(req{key: "pay-1", body: "b"}), http.StatusGatewayTimeout)
	if r := e.do(req{key: "pay-1", body: "other"}); r.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("other body: %d, want 422", r.StatusCode)
	}
	if got := e.calls.Load(); got != 1 {
		t.Fatalf("upstream calls %d, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "upstream_timeout"}); got != 1 {
		t.Errorf("unknown outcomes (upstream_timeout) %v, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "unknown"}); got != 2 {
		t.Errorf("requests with outcome unknown %v, want 2", got)
	}
	if !strings.Contains(e.logs.String(), `"outcome":"unknown"`) {
		t.Errorf("access log lacks outcome unknown")
	}

	purge(t, e, "pay-1")
	g.open()
	if r := e.do(req{key: "pay-1", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after purge: %d, want an execution", r.StatusCode)
	}
	if r := e.do(req{key: "pay-1", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after purge, retry: %d, want the replay", r.StatusCode)
	}
	if got := e.calls.Load(); got != 2 {
		t.Errorf("upstream calls %d, want 2 (one before, one after the purge)", got)
	}
}

// purge deletes a header key's record as `idemproxy keys purge` does.
func purge(t *testing.T, e *env, key string) {
	t.Helper()
	k := claim.NewKey([]string{""}, key) // the tests send no Authorization
	if n, err := e.rdb.Del(context.Background(), claim.RecordKey("idem:", k)).Result(); err != nil || n != 1 {
		t.Fatalf("purge: %d keys deleted, %v", n, err)
	}
}

// TestHoldConnectionResetAfterSend is case (b): the connection broke after
// the request was sent, before a status line: 502, and 502 outcome-unknown
// for every retry.
func TestHoldConnectionResetAfterSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, hold)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	r := e.do(req{key: "reset", body: "b"})
	if r.StatusCode != http.StatusBadGateway {
		t.Fatalf("first: %d, want 502", r.StatusCode)
	}
	e.advance(600 * time.Millisecond)
	wantUnknown(t, e.do(req{key: "reset", body: "b"}), http.StatusBadGateway)
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
	if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "upstream_failed"}); got != 1 {
		t.Errorf("unknown outcomes (upstream_failed) %v, want 1", got)
	}
}

// TestHoldAbandonedClaim is case (c): a claim whose proxy died (here: a
// claim made and never completed) turns unknown when a request finds its
// lock expired, and is never executed.
func TestHoldAbandonedClaim(t *testing.T) {
	t.Parallel()
	forBoth(t, hold, func(t *testing.T, e *env) {
		dead := claim.NewStore(e.rdb, "idem:", nil)
		terms := claim.Terms{LockTTL: 400 * time.Millisecond, TTL: time.Hour, Hold: true}
		if _, _, err := dead.Acquire(context.Background(), claim.NewKey([]string{""}, "orphan"), fingerprintOf(http.MethodPost, "/v1/orders", "", "b"), terms); err != nil {
			t.Fatal(err)
		}
		if r := e.do(req{key: "orphan", body: "b"}); r.StatusCode != http.StatusConflict {
			t.Fatalf("within the lock: %d, want 409", r.StatusCode)
		}
		e.advance(600 * time.Millisecond)
		wantUnknown(t, e.do(req{key: "orphan", body: "b"}), http.StatusGatewayTimeout)
		wantUnknown(t, e.do(req{key: "orphan", body: "b"}), http.StatusGatewayTimeout)
		if got := e.calls.Load(); got != 0 {
			t.Errorf("upstream calls %d, want 0", got)
		}
		if got := counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": "lock_expired"}); got != 1 {
			t.Errorf("unknown outcomes (lock_expired) %v, want 1", got)
		}
	})
}

// TestHoldSlowOriginalWins: the original proxy was slow, not dead. Its lock
// expired and a retry held the key as unknown; the original's answer then
// arrives, and its token still matches: the real answer is recorded over
// the unknown state, and later retries replay it.
func TestHoldSlowOriginalWins(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Default.Hold = true
		o.UpstreamTimeout = 3 * time.Second
		o.Default.LockTTL = 200 * time.Millisecond // below UPSTREAM_TIMEOUT: config refuses this, Options do not
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "slow", body: "b"})
		first <- r
	}()
	g.wait(t)
	time.Sleep(300 * time.Millisecond) // past the lock, on Redis's clock
	wantUnknown(t, e.do(req{key: "slow", body: "b"}), http.StatusGatewayTimeout)
	g.open()
	if r := <-first; r.StatusCode != http.StatusCreated {
		t.Fatalf("original: %d, want 201", r.StatusCode)
	}
	r := e.do(req{key: "slow", body: "b"})
	if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the original answered: %d %s, want its 201 replayed", r.StatusCode, r.body)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
}

// TestExpireIsUnchanged: without hold the contract's Part 1 holds: a timed
// out key is retried after its lock TTL.
func TestExpireIsUnchanged(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		hold(o)
		o.Routes = mustRoutes(t, "POST /v1/expire/* unknown=expire")
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("first: %d, want 504", r.StatusCode)
	}
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusConflict {
		t.Fatalf("within the lock: %d, want 409", r.StatusCode)
	}
	e.advance(600 * time.Millisecond)
	if r := e.do(req{path: "/v1/expire/1", key: "x", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("after the lock: %d, want a takeover", r.StatusCode)
	}
}

// TestUnknownCountedOncePerKey: idemproxy_unknown_outcomes_total
// counts "keys that entered the state unknown". Here one key enters it
// once: its claim's lock expires on Redis's clock while the first request
// is still waiting for the upstream (Redis's clock jumped ahead, e.g. a
// failover to a replica whose clock is ahead; equally a Lease.Hold that is
// retried past the lock), a retry finds it and holds it as unknown
// (lock_expired, counted); then the first request's upstream times out and
// Lease.Hold finds the record already unknown. complete.lua answers a plain
// "ok" for that (cur[1] == ARGV[6]), and hold() counts upstream_timeout a
// second time for the same key: alerts on the counter see two unknown keys
// where an operator will find one.
func TestUnknownCountedOncePerKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, hold) // UPSTREAM_TIMEOUT 300ms, LOCK_TTL 400ms
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "twice", body: "b"})
		first <- r
	}()
	g.wait(t)
	e.advance(time.Second) // Redis's clock: past the lock
	wantUnknown(t, e.do(req{key: "twice", body: "b"}), http.StatusGatewayTimeout)
	select {
	case r := <-first:
		if r.Response == nil || r.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("first request: %+v, want its 504", r.Response)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first request did not finish within 5s")
	}
	total := 0.0
	byCause := map[string]float64{}
	for _, c := range []string{"upstream_timeout", "upstream_failed", "lock_expired"} {
		byCause[c] = counter(t, e.reg, "idemproxy_unknown_outcomes_total", map[string]string{"cause": c})
		total += byCause[c]
	}
	if total != 1 {
		t.Errorf("idemproxy_unknown_outcomes_total %v in all (%v) for one key that entered unknown once, want 1", total, byCause)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
}

// TestHoldSlowOriginalReleaseWins: the README's rule "a known
// answer is strictly better than unknown" (script result late) covers a
// slow original that completes, not one that releases. The original's
// lock expires (here: Redis's clock jumps), a retry holds the key as
// unknown, then the upstream answers 503. With ON_5XX=release that answer
// means "nothing happened: retry with the same key", and the first caller
// is told so; but release.lua only deletes an in-flight record, so it
// answers lost and the key stays unknown: the caller's retry gets 504
// outcome-unknown until an operator purges a key whose outcome is known.
// release.lua should accept its own token on a 'u' record as complete.lua
// does.
func TestHoldSlowOriginalReleaseWins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Default.Hold = true
		o.UpstreamTimeout = 2 * time.Second
		o.Default.LockTTL = 3 * time.Second
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, e.created))
	first := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "rel", body: "b"})
		first <- r
	}()
	g.wait(t)
	e.advance(5 * time.Second) // Redis's clock: past the lock
	wantUnknown(t, e.do(req{key: "rel", body: "b"}), http.StatusGatewayTimeout)
	g.open()
	select {
	case r := <-first:
		if r.Response == nil || r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("original: %+v, want the upstream's 503", r.Response)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("original did not finish within 5s")
	}
	r := e.do(req{key: "rel", body: "b"})
	if r.StatusCode != http.StatusCreated {
		t.Errorf("retry after the original's 503 (released: nothing happened): %d %s; want it executed (201)", r.StatusCode, r.body)
	}
}

// TestRequestIDOnEveryAnswerAndLogLine: every answer, whichever path wrote
// it, carries one new X-Request-Id (the proxy's, over an upstream's), and
// every log line of that request carries the same id as request_id: the
// access-log line and the warnings of a failed forward alike.
func TestRequestIDOnEveryAnswerAndLogLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "upstream-id") // as Rails' ActionDispatch::RequestId
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	})
	// A second replica whose upstream refuses connections: its failures are
	// logged on the pass-through path (plainError) and on the keyed one.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	opts := e.opts
	opts.Upstream, _ = url.Parse(closed)
	opts.Default.Hold = false
	_, down, _ := e.newProxy(opts)

	steps := []struct {
		name string
		srv  string
		r    req
		want int
		line string // a log line of this request besides the access log
	}{
		{name: "executed", r: req{key: "rid-1", body: "b"}, want: http.StatusCreated},
		{name: "replayed", r: req{key: "rid-1", body: "b"}, want: http.StatusCreated},
		{name: "pass-through", r: req{method: http.MethodGet}, want: http.StatusCreated},
		{name: "problem", r: req{key: strings.Repeat("k", 300), body: "b"}, want: http.StatusBadRequest},
		{name: "pass-through failed", srv: "down", r: req{method: http.MethodGet}, want: http.StatusBadGateway, line: "upstream request failed"},
		{name: "keyed failed", srv: "down", r: req{key: "rid-2", body: "b"}, want: http.StatusBadGateway},
	}
	ids := map[string]string{} // request id -> step
	for _, s := range steps {
		srv := e.srv
		if s.srv == "down" {
			srv = down
		}
		r := e.doTo(srv, s.r)
		if r.StatusCode != s.want {
			t.Fatalf("%s: status %d, want %d: %s", s.name, r.StatusCode, s.want, r.body)
		}
		got := r.Header.Values(proxy.RequestIDHeader)
		if len(got) != 1 || len(got[0]) != 20 {
			t.Fatalf("%s: X-Request-Id %q, want one 20-character xid", s.name, got)
		}
		if prev, dup := ids[got[0]]; dup {
			t.Fatalf("%s: request id %q already given to %s", s.name, got[0], prev)
		}
		ids[got[0]] = s.name
	}

	accessLines := map[string]int{} // step -> access-log lines
	otherLines := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(e.logs.String()))
	for sc.Scan() {
		var line struct {
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		if line.RequestID == "" {
			if line.Message == "request" || line.Message == "upstream request failed" {
				t.Errorf("a request's log line without request_id: %s", sc.Bytes())
			}
			continue
		}
		step, ok := ids[line.RequestID]
		if !ok {
			t.Errorf("log line with a request_id that no answer carried: %s", sc.Bytes())
			continue
		}
		if line.Message == "request" {
			accessLines[step]++
		} else {
			otherLines[step] = append(otherLines[step], line.Message)
		}
	}
	for _, s := range steps {
		if accessLines[s.name] != 1 {
			t.Errorf("%s: %d access-log lines with its request_id, want 1", s.name, accessLines[s.name])
		}
		if s.line != "" && !slices.Contains(otherLines[s.name], s.line) {
			t.Errorf("%s: no %q line with its request_id (lines: %q)", s.name, s.line, otherLines[s.name])
		}
	}
	if len(otherLines["keyed failed"]) == 0 {
		t.Errorf("keyed failed: no warning with its request_id besides the access log")
	}
}

// TestRequestAboveInfoLevel: with LOG_LEVEL=warn the access-log line is not
// written (finish returns before building it), but the request is still
// counted, its answer still carries its id, and its warnings still carry
// that id as request_id.
func TestRequestAboveInfoLevel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, nil)
	logs := &testutil.SyncBuffer{}
	reg := prometheus.NewRegistry()
	opts := e.opts
	opts.Logger = zerolog.New(logs).Level(zerolog.WarnLevel)
	opts.Metrics = proxy.NewMetrics(reg)
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", opts.Metrics.ObserveScript), opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	for range 2 {
		if r := e.doTo(srv, req{key: "warn-1", body: "b"}); r.StatusCode != http.StatusCreated || len(r.Header.Values(proxy.RequestIDHeader)) != 1 {
			t.Fatalf("status %d, X-Request-Id %q", r.StatusCode, r.Header.Values(proxy.RequestIDHeader))
		}
	}
	if got := counter(t, reg, "idemproxy_requests_total", map[string]string{"outcome": "replayed"}); got != 1 {
		t.Errorf("replayed requests counted %v, want 1", got)
	}
	if got := counter(t, reg, "idemproxy_responses_total", map[string]string{"code": "201"}); got != 2 {
		t.Errorf("201 responses counted %v, want 2", got)
	}
	if strings.Contains(logs.String(), `"message":"request"`) {
		t.Errorf("an access-log line at LOG_LEVEL=warn:\n%s", logs)
	}

	e.setUpstream(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
	r := e.doTo(srv, req{method: http.MethodGet})
	if r.StatusCode != http.StatusBadGateway {
		t.Fatalf("failed pass-through: status %d, want 502", r.StatusCode)
	}
	id := r.Header.Get(proxy.RequestIDHeader)
	if !strings.Contains(logs.String(), `"request_id":"`+id+`"`) || !strings.Contains(logs.String(), "upstream request failed") {
		t.Errorf("the failed pass-through's warning does not carry its request_id %q:\n%s", id, logs)
	}
}

// logLines parses the proxy's JSON log.
func logLines(t *testing.T, logs *testutil.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		out = append(out, m)
	}
	return out
}

// accessLogID is the request_id of the (only) access-log line, once
// it is written.
func accessLogID(t *testing.T, logs *testutil.SyncBuffer) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, l := range logLines(t, logs) {
			if l["message"] == "request" {
				id, _ := l["request_id"].(string)
				return id
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access-log line:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKeyedEarlyHintsThenFailureKeepsRequestID: the upstream sends
// 103 Early Hints, then breaks off before a final answer. ReverseProxy
// clears the header map after relaying a 1xx; the keyed path restores the
// proxy's headers only in exchange.WriteHeader, and execute writes the
// failure's problem (502) straight to the client's writer: the answer
// carries no X-Request-Id (and no Idempotency-Key echo), so the client
// cannot name the request whose outcome is now unknown.
func TestKeyedEarlyHintsThenFailureKeepsRequestID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		fmt.Fprint(brw, "HTTP/1.1 103 Early Hints\r\nLink: </app.css>; rel=preload\r\n\r\n")
		_ = brw.Flush()
		conn.Close() // no final answer: the 103 is read first, then EOF
	})
	r := e.do(req{key: "rl-hints-1", body: `{"amount":1}`})
	if r.StatusCode < 500 {
		t.Fatalf("status %d, want the upstream failure's 5xx: %s", r.StatusCode, r.body)
	}
	id := accessLogID(t, e.logs)
	if got := r.Header.Values(proxy.RequestIDHeader); len(got) != 1 || got[0] != id {
		t.Errorf("%d answer after a 103: X-Request-Id %q, want [%q] (the access-log line's request_id)", r.StatusCode, got, id)
	}
	if got := r.Header.Values("Idempotency-Key"); len(got) != 1 || got[0] != "rl-hints-1" {
		t.Errorf("%d answer after a 103: Idempotency-Key echo %q, want [rl-hints-1]", r.StatusCode, got)
	}
}

// TestUpgradeReplacesUpstreamRequestID: a 101 is written by
// ReverseProxy itself on the hijacked connection (handleUpgradeResponse
// adds the upstream's headers to the proxy's and never calls WriteHeader),
// so statusWriter never restores the proxy's id: an upstream that sends
// X-Request-Id on its 101 (most frameworks do on every answer) gives the
// client two ids.
func TestUpgradeReplacesUpstreamRequestID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "GET /ws upgrade") })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Request-Id: upstream-id\r\n\r\n")
		_ = brw.Flush()
		_, _ = brw.ReadString('\n')
	})
	c := dialProxy(t, e)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "bye\n")
	c.Close() // the tunnel ends; the access line follows
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	id := accessLogID(t, e.logs)
	if got := resp.Header.Values(proxy.RequestIDHeader); len(got) != 1 || got[0] != id {
		t.Errorf("101: X-Request-Id %q, want [%q] (the access-log line's request_id only)", got, id)
	}
}

// startStringReplica starts a second replica on e's Redis, as
// RECORD_FORMAT=string wires it (main.go: claim.StringRecords).
func startStringReplica(e *env, opts proxy.Options) *httptest.Server {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	metrics := proxy.NewMetrics(reg)
	logger := zerolog.New(e.logs).With().Timestamp().Logger()
	opts.Logger, opts.Metrics = logger, metrics
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", metrics.ObserveScript, claim.StringRecords(true)), opts)
	if err != nil {
		e.t.Fatalf("proxy.New: %v", err)
	}
	srv := httptest.NewServer(h)
	e.t.Cleanup(srv.Close)
	return srv
}

// TestStringReplicaReplaysHashRecordWhileWritesRefused: the README's step 2 of the
// record format rollout (set RECORD_FORMAT=string with a rolling restart;
// hash records stay for one TTL). A payment was executed and recorded by a
// hash replica. Redis then refuses writes but answers and still has every
// record: min-replicas-to-write is not met (a replica link drops), or the
// proxies still talk to the old master that a failover demoted (read-only;
// the README: fail open applies to a Redis "failing over or read-only"). A
// retry through the hash replica is replayed, as before this change.
// Through a string replica, claim.lua issues SET NX before it reads the
// hash; Redis refuses that write (NOREPLICAS, READONLY), which counts as an
// outage, and FAIL_MODE=open forwards the completed payment: it executes
// twice.
func TestStringReplicaReplaysHashRecordWhileWritesRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		refuse, allow func(context.Context, *env) error
	}{
		{"NOREPLICAS",
			func(ctx context.Context, e *env) error {
				return e.rdb.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
			},
			func(ctx context.Context, e *env) error {
				return e.rdb.ConfigSet(ctx, "min-replicas-to-write", "0").Err()
			}},
		{"READONLY (demoted master)",
			// Its new master is a port nobody listens on: no sync, so it
			// keeps its data and refuses writes.
			func(ctx context.Context, e *env) error {
				return e.rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(e.t)).Err()
			},
			func(ctx context.Context, e *env) error { return e.rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, realBackend, func(o *proxy.Options) { o.Default.FailOpen = true })
			str := startStringReplica(e, e.opts)
			ctx := context.Background()

			first := e.do(req{key: "pay-1", body: `{"amount":100}`})
			if first.StatusCode != http.StatusCreated || e.calls.Load() != 1 {
				t.Fatalf("first request through the hash replica: %d, upstream calls %d", first.StatusCode, e.calls.Load())
			}
			if err := tc.refuse(ctx, e); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tc.allow(ctx, e) })

			viaHash := e.do(req{key: "pay-1", body: `{"amount":100}`})
			if viaHash.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Fatalf("control, retry through the hash replica: %d replayed=%q, upstream calls %d; want a replay",
					viaHash.StatusCode, viaHash.Header.Get("Idempotent-Replayed"), e.calls.Load())
			}

			viaString := e.doTo(str, req{key: "pay-1", body: `{"amount":100}`})
			if viaString.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Errorf("retry through the string replica: status %d replayed=%q body %s, upstream calls %d; want the recorded answer replayed and 1 call",
					viaString.StatusCode, viaString.Header.Get("Idempotent-Replayed"), viaString.body, e.calls.Load())
			}
		})
	}
}

// TestStringReplicaReplaysHashRecordWithRedisFull: the same with Redis full under
// noeviction (FAIL_MODE=closed). The README: a full Redis refuses the claim
// of a first request (503); a retry of a recorded key is still answered
// from its record, by a hash replica. A string replica answers 503 to the
// retry of every key recorded as a hash.
func TestStringReplicaReplaysHashRecordWithRedisFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, nil)
	str := startStringReplica(e, e.opts)
	ctx := context.Background()

	if r := e.do(req{key: "pay-2", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %d", r.StatusCode)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.rdb.ConfigSet(ctx, "maxmemory", "0").Err() })

	if r := e.do(req{key: "pay-2", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("control, hash replica with Redis full: %d %s; want a replay", r.StatusCode, r.body)
	}
	if r := e.doTo(str, req{key: "pay-2", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("string replica with Redis full: status %d body %s; want the recorded answer replayed", r.StatusCode, r.body)
	}
}

// TestHalfClosedClientGetsNoFakeSuccess: a client that sends its
// whole request, half-closes (shutdown write: "I have nothing more to
// send") and waits for the answer is not told 200 OK for a forward that
// was abandoned. net/http cancels the request on the half-close (its
// background read sees EOF); plainError then returns without writing, and
// net/http finishes the request with its implicit "200 OK", Content-Length
// 0 -- a success, while the access log and idemproxy_responses_total say 499
// and the upstream (non-idempotent, no key) may have executed the request.
func TestHalfClosedClientGetsNoFakeSuccess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, req string }{
		{"HTTP/1.1 with a body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb"},
		{"HTTP/1.1 without a body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"},
		{"HTTP/1.0", "POST /v1/orders HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nb"},
		{"GET", "GET /v1/orders HTTP/1.1\r\nHost: x\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 5 * time.Second })
			arrived := make(chan struct{}, 1)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				arrived <- struct{}{}
				select { // the order is placed; the answer takes a moment
				case <-r.Context().Done():
				case <-time.After(2 * time.Second):
				}
				w.WriteHeader(http.StatusCreated)
			})
			c := dialProxy(t, e)
			defer c.Close()
			fmt.Fprint(c, tc.req)
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream did not get the request within 5 s")
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, _ := io.ReadAll(c)
			status := strings.SplitN(string(got), "\r\n", 2)[0]
			if strings.HasPrefix(status, "HTTP/1.1 2") || strings.HasPrefix(status, "HTTP/1.0 2") {
				t.Errorf("a half-closed client still waiting was told %q for a forward the proxy abandoned:\n%s", status, got)
			}
			line := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
			t.Logf("client read %q; access line %s", status, line)
		})
	}
}

// TestHalfClosedKeyedWaiterGetsNoFakeSuccess: the same for the
// keyed duplicate that waits (WAIT_TIMEOUT) for an in-flight first request,
// which the README's new paragraph also calls 499: its answer (typ "")
// writes nothing, and net/http's implicit 200 reaches a client that
// half-closed and is still reading. Pre-existing (claimAnswer's 499), but
// the same "499 writes nothing" that d340fa7 extends to pass-through.
func TestHalfClosedKeyedWaiterGetsNoFakeSuccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Default.Wait = 30 * time.Second })
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(e.created))
	first := make(chan response, 1)
	go func() { first <- e.do(req{key: "hc", body: "b"}) }()
	g.wait(t)
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hc\r\nContent-Length: 1\r\n\r\nb")
	eventually(t, 5*time.Second, "the duplicate polls Redis", func() bool {
		return counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "inflight"}) >= 1
	})
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	status := strings.SplitN(string(got), "\r\n", 2)[0]
	if strings.HasPrefix(status, "HTTP/1.1 2") {
		t.Errorf("a half-closed duplicate still waiting was told %q, though nothing was executed or replayed for it:\n%s", status, got)
	}
	g.open()
	<-first
}

// TestProblemAnswersHaveAWriteDeadline: a client pipelines requests
// that the proxy answers itself (here 400 key-invalid; equally 409, 422,
// 408, 503) and never reads. Only replays and pass-through writes carry a
// write deadline; writeProblem's answers do not, and main.go's http.Server
// has no WriteTimeout (it must not: streams). Once the socket buffers are
// full, the connection goroutine blocks in its final flush for ever: an
// attacker holds one goroutine and one socket per connection indefinitely
// (IdleTimeout does not apply to an active connection; SIGTERM then waits
// the whole SHUTDOWN_TIMEOUT).
//
// The server here is configured as main.go configures the real one.
//
// Correct: every answer the proxy writes itself goes out under a write
// deadline (UPSTREAM_TIMEOUT, as replays), so the connection is closed
// when the client stops reading.
func TestProblemAnswersHaveAWriteDeadline(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 300 * time.Millisecond })

	var mu sync.Mutex
	states := map[net.Conn]http.ConnState{}
	logger := zerolog.Nop() // thousands of access lines otherwise
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", nil), func() proxy.Options { o := e.opts; o.Logger = logger; return o }())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, // as main.go
		ConnState: func(c net.Conn, s http.ConnState) {
			mu.Lock()
			states[c] = s
			mu.Unlock()
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close() // closes every connection, unblocking the stuck flush

	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Pipelined keyed requests with a key over MAX_KEY_LENGTH: answered 400
	// by the proxy without Redis or upstream. Never read.
	one := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 0\r\n\r\n", strings.Repeat("k", 300))
	batch := []byte(strings.Repeat(one, 64))
	stalled := false
	end := time.Now().Add(10 * time.Second)
	for i := 0; i < 20000 && time.Now().Before(end); i++ {
		_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write(batch); err != nil {
			if isNetTimeout(err) {
				stalled = true
				break
			}
			t.Fatalf("write: %v", err)
		}
	}
	if !stalled {
		t.Skip("the proxy kept reading; socket buffers too large to stall it here")
	}

	// The proxy is now blocked writing an answer nobody reads. With a write
	// deadline of UPSTREAM_TIMEOUT (300ms) it would close the connection.
	closed := false
	var last http.ConnState
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); { // generous: a loaded machine
		mu.Lock()
		for _, s := range states {
			last = s
		}
		mu.Unlock()
		if last == http.StateClosed {
			closed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !closed {
		t.Errorf("a client that never reads the proxy's own 400 answers holds its connection (state %v) 10s later; "+
			"UPSTREAM_TIMEOUT is 300ms and no write deadline ended it", last)
	}
}

// TestTrailingSlashStillMatchesWildcardRule: path.Clean drops the trailing
// slash, so "/v1/payments/" no longer matches "POST /v1/payments/*" (chi's
// wildcard needs the slash). Before the change it matched. A PUT rule (PUT
// not in METHODS) then stops covering PUT /v1/orders/ entirely.
func TestTrailingSlashStillMatchesWildcardRule(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /v1/payments/* required; PUT /v1/orders/*") })
	r := e.do(req{path: "/v1/payments/", body: "x"}) // no key on a "required" route
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("POST /v1/payments/ without key: %d, want 400 (rule POST /v1/payments/* required)", r.StatusCode)
	}
	e.do(req{method: http.MethodPut, path: "/v1/orders/", key: "k", body: "x"})
	r = e.do(req{method: http.MethodPut, path: "/v1/orders/", key: "k", body: "x"})
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("PUT /v1/orders/ with a key executed twice (upstream calls %d): rule PUT /v1/orders/* not applied", e.calls.Load())
	}
}
