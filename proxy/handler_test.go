package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
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
