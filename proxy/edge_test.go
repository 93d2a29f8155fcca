package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestExpectContinueNotForwarded: the body is buffered already; an upstream
// that never sends "100 Continue" must not delay a keyed request.
func TestExpectContinueNotForwarded(t *testing.T) {
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
