package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// budgetOptions: MAX_BUFFERED_BYTES of 64 KiB, records of up to 48 KiB,
// and an upstream call that may be held at a gate for seconds.
func budgetOptions(o *proxy.Options) { budgetSizes(o, 64<<10, 48<<10, 10*time.Second) }

// budgetSizes sets MAX_BUFFERED_BYTES and MAX_STORED_RESPONSE_BYTES, and
// gives the upstream long enough to be held (the lock twice that).
func budgetSizes(o *proxy.Options, budget, stored int64, upstream time.Duration) {
	o.MaxBufferedBytes = budget
	o.MaxStoredBytes = stored
	o.UpstreamTimeout = upstream
	o.Default.LockTTL = 2 * upstream
}

// budgetEnv is an env on backend with budgetSizes.
func budgetEnv(t *testing.T, backend string, budget, stored int64, upstream time.Duration) *env {
	return newEnv(t, backend, func(o *proxy.Options) { budgetSizes(o, budget, stored, upstream) })
}

// holdOne sends a keyed request with a body of n bytes to /held, which the
// gate keeps at the upstream, and returns once it is there (its body is
// then buffered, and counted). The returned channel gets its answer once
// the gate opens.
func holdOne(t *testing.T, e *env, g *gate, key string, n int) <-chan response {
	t.Helper()
	done := make(chan response, 1)
	go func() {
		r, err := e.send(context.Background(), e.srv, req{path: "/held", key: key, body: strings.Repeat("h", n)})
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		done <- r
	}()
	g.wait(t)
	return done
}

// gatedHeld holds requests to /held at g and answers every other with
// e.created at once.
func gatedHeld(e *env, g *gate) http.HandlerFunc {
	held := g.handler(e.created)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			held(w, r)
			return
		}
		e.created(w, r)
	}
}

// liveHeap is the heap in use after two collections.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// heapWithinCount fails t when the live heap grew since before (liveHeap)
// by more than idemproxy_buffered_bytes counts, with 4 MiB of slack for the
// connections, their goroutines and ReverseProxy's 32 KiB copy buffers.
// what says what is held; why, what it means when it fails.
func heapWithinCount(t *testing.T, e *env, before int64, what, why string) {
	t.Helper()
	grown := liveHeap() - before
	counted := bufferedBytes(t, e)
	t.Logf("%s: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB (MAX_BUFFERED_BYTES=%d)", what, counted, float64(grown)/(1<<20), e.opts.MaxBufferedBytes)
	if grown > int64(counted)+4<<20 {
		t.Errorf("%s: live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: %s", what, float64(grown)/(1<<20), counted, why)
	}
}

func bufferedBytes(t *testing.T, e *env) float64 {
	t.Helper()
	return counter(t, e.reg, "idemproxy_buffered_bytes", nil)
}

// TestBufferBudgetRefusesBodiesBeyondIt: bodies are counted byte for byte
// as they arrive. With MAX_BUFFERED_BYTES mostly taken by a request in
// flight, a keyed request whose body does not fit gets 503 with Retry-After
// before anything is claimed or forwarded, while a small one still fits;
// with the budget full none is let in; once the held requests have ended
// their bytes are free again and the refused request, retried with its
// key, executes.
func TestBufferBudgetRefusesBodiesBeyondIt(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))

		first := holdOne(t, e, g, "held", 40<<10)
		if got := bufferedBytes(t, e); got != 40<<10 {
			t.Errorf("idemproxy_buffered_bytes with the first held: %v, want %d", got, 40<<10)
		}

		// 30 KiB does not fit in the 24 left.
		big := strings.Repeat("b", 30<<10)
		r := e.do(req{key: "big", body: big})
		if r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("body beyond the budget: status %d %s, want 503", r.StatusCode, r.body)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:overloaded" || !strings.Contains(fmt.Sprint(p["detail"]), "MAX_BUFFERED_BYTES=65536") {
			t.Errorf("problem %v, want type overloaded naming MAX_BUFFERED_BYTES=65536", p)
		}
		if ra := r.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1 (the held request only)", got)
		}
		if keys := e.redisKeys(); len(keys) != 1 {
			t.Errorf("Redis keys %v, want the held request's only (nothing claimed for the refused one)", keys)
		}

		// A small body still fits beside the held one.
		if r := e.do(req{key: "small", body: "tiny"}); r.StatusCode != http.StatusCreated {
			t.Errorf("small body: status %d %s, want 201", r.StatusCode, r.body)
		}

		// A second held request fills the budget; then no keyed request is
		// let in, with a body or without.
		second := holdOne(t, e, g, "held-2", 24<<10)
		if got := bufferedBytes(t, e); got != 64<<10 {
			t.Errorf("idemproxy_buffered_bytes with two held: %v, want %d", got, 64<<10)
		}
		for _, body := range []string{"tiny", ""} {
			if r := e.do(req{key: "refused-" + body, body: body}); r.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("body %q with the budget full: status %d %s, want 503", body, r.StatusCode, r.body)
			}
		}

		g.open()
		for _, held := range []<-chan response{first, second} {
			if r := <-held; r.StatusCode != http.StatusCreated {
				t.Fatalf("held request: status %d %s", r.StatusCode, r.body)
			}
		}
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", nil); got != 3 {
			t.Errorf("buffer_full_total %v, want 3", got)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "overloaded"}); got != 3 {
			t.Errorf("requests_total{outcome=overloaded} %v, want 3", got)
		}

		r = e.do(req{key: "big", body: big})
		if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), fmt.Sprintf(`"body_len":%d`, len(big))) {
			t.Errorf("refused request retried with its key: status %d %s, want it executed (201, its whole body)", r.StatusCode, r.body)
		}
	})
}

// TestBufferBudgetChunkedBody: a body without Content-Length is counted as
// it arrives and refused at the read that does not fit.
func TestBufferBudgetChunkedBody(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		first := holdOne(t, e, g, "held", 40<<10)

		hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", io.MultiReader(strings.NewReader(strings.Repeat("c", 30<<10))))
		hr.Header.Set("Idempotency-Key", "chunked")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("chunked body beyond the budget: status %d, Retry-After %q; want 503, 1", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
	})
}

// TestBufferBudgetObserveForwards: in observe mode a body that finds no
// room is forwarded whole, unbuffered, as a proxy without idempotency
// would, and counted under its outcome, but not in
// idemproxy_buffer_full_total, which (with the IdemproxyBufferFull alert)
// counts requests answered 503, nothing executed (found by review).
func TestBufferBudgetObserveForwards(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.Default.Observe = true
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		first := holdOne(t, e, g, "held", 40<<10)

		big := strings.Repeat("o", 40<<10)
		r := e.do(req{key: "observed", body: big})
		if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), fmt.Sprintf(`"body_len":%d`, len(big))) {
			t.Errorf("observe mode, body beyond the budget: status %d %s, want the upstream's 201 with the whole body", r.StatusCode, r.body)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "overloaded"}); got != 1 {
			t.Errorf("requests_total{outcome=overloaded} %v, want 1", got)
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", nil); got != 0 {
			t.Errorf("idemproxy_buffer_full_total %v after a request that was forwarded and executed (observe mode), want 0: "+
				"the series (and IdemproxyBufferFull) say 503 and nothing executed", got)
		}
	})
}

// TestBufferBudgetAnswerRecordedWhole: an answer is counted while it is
// recorded but never cut for the budget: admitted with room, the request
// has executed, and its answer is replayed byte for byte even when it took
// the count past MAX_BUFFERED_BYTES.
func TestBufferBudgetAnswerRecordedWhole(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		answer := bytes.Repeat([]byte("a"), 40<<10)
		held := g.handler(e.created)
		rest := make(chan struct{})
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/held" {
				held(w, r)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(answer); i += 4 << 10 { // in pieces, as a stream
				_, _ = w.Write(answer[i : i+4<<10])
				if i == len(answer)-8<<10 {
					w.(http.Flusher).Flush()
					select { // the last piece waits for the test
					case <-rest:
					case <-time.After(5 * time.Second):
					}
				}
			}
		})
		first := holdOne(t, e, g, "held", 40<<10) // 40 of the 64 KiB
		done := make(chan response, 1)
		go func() {
			r, err := e.send(context.Background(), e.srv, req{key: "large-answer", body: "x"})
			if err != nil {
				t.Errorf("first: %v", err)
			}
			done <- r
		}()
		// 40 KiB of body and 36 of the answer's copy: past the budget, counted.
		eventually(t, 5*time.Second, "the answer's copy counted past MAX_BUFFERED_BYTES", func() bool { return bufferedBytes(t, e) > 64<<10 })
		close(rest)
		r := <-done
		if r.StatusCode != http.StatusCreated || !bytes.Equal(r.body, answer) {
			t.Fatalf("first: status %d, %d bytes; want 201 and the whole %d-byte answer", r.StatusCode, len(r.body), len(answer))
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		r = e.do(req{key: "large-answer", body: "x"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, answer) {
			t.Fatalf("retry: status %d replayed %q, %d bytes; want the recorded 201, byte for byte", r.StatusCode, r.Header.Get("Idempotent-Replayed"), len(r.body))
		}
		if got := e.calls.Load(); got != 2 {
			t.Errorf("upstream calls %d, want 2 (the held request and the first)", got)
		}
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", nil); got != 0 {
			t.Errorf("buffer_full_total %v, want 0", got)
		}
	})
}

// TestBufferBudgetReplayWaitsForRoom: a replay holds its record while the
// client reads it, so it needs room too: with the budget full it gets 503
// with Retry-After (nothing executed), and once there is room the record,
// byte for byte.
func TestBufferBudgetReplayWaitsForRoom(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		orig := e.do(req{key: "recorded", body: "x"})
		if orig.StatusCode != http.StatusCreated {
			t.Fatalf("first: status %d %s", orig.StatusCode, orig.body)
		}
		first := holdOne(t, e, g, "held", 40<<10)
		second := holdOne(t, e, g, "held-2", 24<<10)
		r := e.do(req{key: "recorded", body: "x"})
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "1" || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("replay with the budget full: status %d, Retry-After %q, replayed %q; want 503, 1, none", r.StatusCode, r.Header.Get("Retry-After"), r.Header.Get("Idempotent-Replayed"))
		} else if p := r.problem(t); p["type"] != "urn:idemproxy:problem:overloaded" {
			t.Errorf("problem %v, want overloaded", p)
		}
		g.open()
		<-first
		<-second
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		r = e.do(req{key: "recorded", body: "x"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, orig.body) {
			t.Errorf("replay with room: status %d replayed %q %s; want the recorded %s", r.StatusCode, r.Header.Get("Idempotent-Replayed"), r.body, orig.body)
		}
		if got := e.calls.Load(); got != 3 {
			t.Errorf("upstream calls %d, want 3 (the first and the two held)", got)
		}
	})
}
