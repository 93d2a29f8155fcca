package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/scripts"
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
	t.Parallel()
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
	t.Parallel()
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
// counts requests answered 503, nothing executed.
func TestBufferBudgetObserveForwards(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// cachedProxy starts a Handler on e's Redis with a replay cache (as main
// does with REPLAY_CACHE_BYTES, default 16 MiB), e.opts otherwise.
func cachedProxy(t *testing.T, e *env) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	return storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(e.rdb, "idem:", m.ObserveScript, claim.ReplayCache(64<<20, time.Minute))
	})
}

// storeProxy starts a Handler with opts on the store newStore makes, its
// metrics in a registry of their own and its log in e's.
func storeProxy(t *testing.T, e *env, opts proxy.Options, newStore func(*proxy.Metrics) *claim.Store) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Metrics = proxy.NewMetrics(reg)
	opts.Logger = zerolog.New(e.logs).With().Timestamp().Logger()
	h, err := proxy.New(newStore(opts.Metrics), opts)
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, reg
}

// TestBufferBudgetCachedReplaysCountNothing: a replay from the replay cache
// writes the cache's own slice and holds no memory of its own, so it counts
// nothing in MAX_BUFFERED_BYTES. (Before the fix: it counted its record's
// size for as long as its client took to read it, so two ~90-byte requests
// that never read a cached 6 MiB record locked a 12 MiB budget, and every
// other keyed request of every tenant got 503.)
func TestBufferBudgetCachedReplaysCountNothing(t *testing.T) {
	t.Parallel()
	const size = 6 << 20 // above what the kernel's send buffer takes on loopback
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.MaxBodyBytes = 64 << 10
		o.MaxStoredBytes = size
		o.MaxBufferedBytes = 2 * size // >= 64 KiB + 6 MiB + 16 KiB, as config requires
		o.UpstreamTimeout = 10 * time.Second
		o.Default.LockTTL = 20 * time.Second
	})
	big := bytes.Repeat([]byte("r"), size)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			_, _ = w.Write(big)
			return
		}
		e.created(w, r)
	})
	srv, reg := cachedProxy(t, e)

	// The attacker's one execution, and one replay read in full: the
	// record is now in the replay cache.
	for i := range 2 {
		if r := e.doTo(srv, req{path: "/big", key: "big"}); r.StatusCode != http.StatusOK || len(r.body) != size {
			t.Fatalf("request %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 2 {
		c := dialServer(t, srv)
		conns = append(conns, c)
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		if _, err := fmt.Fprint(c, "POST /big HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\nContent-Length: 0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "two unread replays from the cache", func() bool {
		return counter(t, reg, "idemproxy_replay_cache_hits_total", nil) >= 2
	})
	hits := counter(t, reg, "idemproxy_replay_cache_hits_total", nil)
	if got := counter(t, reg, "idemproxy_buffered_bytes", nil); got != 0 {
		t.Errorf("idemproxy_buffered_bytes %v with two replays of a cached record in flight, want 0 (the cache holds it, once)", got)
	}

	// Another client, another key, a 1-byte body.
	r := e.doTo(srv, req{key: "legit", body: "x", header: http.Header{"Authorization": {"Bearer other-tenant"}}})
	t.Logf("replay cache hits %v; idemproxy_buffered_bytes %v while the process holds one %d-byte record (the cache's)",
		hits, counter(t, reg, "idemproxy_buffered_bytes", nil), size)
	if r.StatusCode != http.StatusCreated {
		t.Errorf("legitimate keyed request while two ~90-byte replay requests of a cached record sit unread: status %d %s; "+
			"want 201 (two requests that cost the proxy no memory lock MAX_BUFFERED_BYTES for UPSTREAM_TIMEOUT)", r.StatusCode, r.body)
	}
}

// TestBufferBudgetDroppedCopyFreed: an answer that streams past
// MAX_STORED_RESPONSE_BYTES drops its copy, and the copy's memory goes with
// it, not when the stream ends (up to UPSTREAM_TIMEOUT later). Twelve such
// streams stay open after their copies are dropped; the live heap must not
// hold their 12 MiB while idemproxy_buffered_bytes reads 0. (Before the fix:
// the copy was Reset, which keeps its capacity.)
func TestBufferBudgetDroppedCopyFreed(t *testing.T) {
	const (
		streams = 12
		max     = 1 << 20
		budget  = 4 << 20
	)
	e := budgetEnv(t, miniBackend, budget, max, 15*time.Second)
	piece := bytes.Repeat([]byte("s"), 32<<10)
	release := newGate() // (opened before the streams are waited for, below)
	past := make(chan struct{}, streams)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		for n := 0; n <= max; n += len(piece) { // one piece past the limit
			_, _ = w.Write(piece)
			w.(http.Flusher).Flush()
		}
		select { // the stream stays open
		case <-release.release:
		case <-time.After(12 * time.Second):
		}
	})

	before := liveHeap()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer release.open()
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			signalled := false
			ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
			defer cancel()
			hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/stream", nil)
			hr.Header.Set("Idempotency-Key", "stream-"+string(rune('a'+i)))
			resp, err := e.srv.Client().Do(hr)
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 32<<10)
			var got int
			for {
				n, err := resp.Body.Read(buf)
				got += n
				if got > max && !signalled {
					// The proxy wrote past the limit to the client: its copy was dropped first.
					signalled = true
					past <- struct{}{}
				}
				if err != nil {
					return
				}
			}
		}()
		select { // one at a time: each copy grows to 1 MiB alone, well within the budget
		case <-past:
		case <-time.After(5 * time.Second):
			t.Fatalf("stream %d: the client did not get past the limit", i)
		}
		eventually(t, 5*time.Second, "the dropped copy given back", func() bool { return bufferedBytes(t, e) == 0 })
	}

	heapWithinCount(t, e, before, "streams past MAX_STORED_RESPONSE_BYTES, copies dropped", "dropped answer copies keep their memory, uncounted")
	release.open()
}

// TestBufferBudgetEmptyReplayAlwaysFits: a replay of an empty body holds no
// memory and is never refused, even with the count past MAX_BUFFERED_BYTES
// (where a recorded answer may take it). A WAIT_TIMEOUT waiter let in with
// room waits; another request's answer takes the count past the limit; the
// first completes with an empty body, and the waiter gets its replay.
// (Before the fix: it got 503.)
func TestBufferBudgetEmptyReplayAlwaysFits(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.Default.Wait = 8 * time.Second
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		rest := newGate() // ends the stream
		defer rest.open()
		gatedEmpty := g.handler(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/empty":
				gatedEmpty(w, r)
			case "/stream":
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte(strings.Repeat("s", 36<<10)))
				w.(http.Flusher).Flush()
				select {
				case <-rest.release:
				case <-time.After(8 * time.Second):
				}
				_, _ = w.Write([]byte("end"))
			default:
				e.created(w, r)
			}
		})
		send := func(r req) <-chan response {
			ch := make(chan response, 1)
			go func() {
				resp, err := e.send(context.Background(), e.srv, r)
				if err != nil {
					t.Errorf("%s: %v", r.key, err)
				}
				ch <- resp
			}()
			return ch
		}
		first := send(req{path: "/empty", key: "k", body: "x"})
		g.wait(t)
		waiter := send(req{path: "/empty", key: "k", body: "x"})
		eventually(t, 5*time.Second, "the waiter let in (its byte counted)", func() bool { return bufferedBytes(t, e) == 2 })

		stream := send(req{path: "/stream", key: "s", body: strings.Repeat("b", 30<<10)})
		eventually(t, 5*time.Second, "an answer counted past the limit", func() bool { return bufferedBytes(t, e) > 64<<10 })

		g.open()
		if r := <-first; r.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", r.StatusCode)
		}
		w := <-waiter
		rest.open()
		<-stream
		if w.StatusCode != http.StatusCreated || w.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("waiter for an empty answer: status %d %s; want the 201 replayed (it holds no bytes)", w.StatusCode, w.body)
		}
	})
}

// TestBufferBudgetIdleHeadersHoldNothing: MAX_BUFFERED_BYTES counts the body
// bytes that have arrived, never what a client declares. Four connections
// send the headers of keyed requests (two declaring 16 KiB, two 1 MiB) and
// not one byte of body; a legitimate keyed request with a 4-byte body is
// still served. (Before the fix: chunks were taken before they were read
// into, so about 2048 idle connections held the default budget and every
// keyed request with a body got 503.)
func TestBufferBudgetIdleHeadersHoldNothing(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.RequestReadTimeout = 5 * time.Second
	}, func(t *testing.T, e *env) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for i, length := range []int{proxy.BodyChunk, proxy.BodyChunk, 1 << 20, 1 << 20} {
			c := dialProxy(t, e)
			conns = append(conns, c)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			// Headers only: not one byte of the body is ever sent.
			if _, err := fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: idle-%d\r\nContent-Length: %d\r\n\r\n", i, length); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 3*time.Second, "the four idle requests in the handler", func() bool {
			return counter(t, e.reg, "idemproxy_inflight_requests", nil) >= 4
		})
		time.Sleep(100 * time.Millisecond) // and in readBody
		t.Logf("idemproxy_buffered_bytes with 4 connections that sent 0 body bytes: %v (MAX_BUFFERED_BYTES=%d)",
			bufferedBytes(t, e), 4*proxy.BodyChunk)

		r := e.do(req{key: "legit", body: "tiny"})
		if r.StatusCode != http.StatusCreated {
			t.Errorf("legitimate keyed request with a 4-byte body while 4 clients sent headers and no body: status %d %s; want 201 "+
				"(connections that sent nothing must not hold MAX_BUFFERED_BYTES)", r.StatusCode, r.body)
		}
	})
}

// TestBufferBudgetPooledCopiesBounded: a keyed request in flight whose
// upstream has not answered yet holds no answer buffer, so memory does not
// grow with concurrency beyond what idemproxy_buffered_bytes counts. One P
// (GOMAXPROCS=1) makes sync.Pool hand on the buffer a 1 MiB answer just
// returned; sixteen requests are then held at the upstream. (Before the fix:
// each took a pooled buffer grown by an earlier answer at once,
// uncounted: 10 to 16 MiB against a 4 MiB budget.)
func TestBufferBudgetPooledCopiesBounded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const (
		rounds = 16
		max    = 1 << 20
		budget = 4 << 20
	)
	// redis-server, not miniredis: the twelve 1 MiB records must not sit in
	// this process's heap.
	e := budgetEnv(t, realBackend, budget, max, 15*time.Second)
	big := bytes.Repeat([]byte("b"), max)
	g := newGate()
	defer g.open()
	held := g.handler(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/held" {
			held(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		_, _ = w.Write(big)
	})

	before := liveHeap()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer g.open()
	for i := range rounds {
		if r := e.do(req{path: "/big", key: fmt.Sprintf("big-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != max {
			t.Fatalf("big %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
			defer cancel()
			if _, err := e.send(ctx, e.srv, req{path: "/held", key: fmt.Sprintf("held-%d", i)}); err != nil {
				t.Errorf("held %d: %v", i, err)
			}
		}()
		g.wait(t)
	}
	heapWithinCount(t, e, before, "keyed requests in flight with empty bodies", "pooled answer buffers keep an earlier answer's capacity, uncounted")
	g.open()
}

// TestBufferBudgetSmallAnswerCountsSmall: the copy is counted by its
// buffer's capacity, so a buffer grown by a large answer must not be handed
// to the next one from the pool: a small answer would count (and keep out
// other requests) as much as the largest before it.
func TestBufferBudgetSmallAnswerCountsSmall(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: the pool hands back what was just put
	e := newEnv(t, miniBackend, budgetOptions)
	large := bytes.Repeat([]byte("l"), 40<<10)
	rest := newGate() // ends the small answer
	defer rest.open()
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/large" {
			_, _ = w.Write(large)
			return
		}
		_, _ = io.WriteString(w, "small")
		w.(http.Flusher).Flush()
		select { // the answer is being recorded while the test looks
		case <-rest.release:
		case <-time.After(5 * time.Second):
		}
	})
	for i := range 3 {
		if r := e.do(req{path: "/large", key: fmt.Sprintf("large-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != len(large) {
			t.Fatalf("large %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := e.send(context.Background(), e.srv, req{path: "/small", key: "small"}); err != nil {
			t.Errorf("small: %v", err)
		}
	}()
	eventually(t, 5*time.Second, "the small answer's copy counted", func() bool { return bufferedBytes(t, e) > 0 })
	if got := bufferedBytes(t, e); got > 16<<10 {
		t.Errorf("a 5-byte answer being recorded counts %v bytes, want at most 16 KiB (a buffer a 40 KiB answer grew was handed on)", got)
	}
	rest.open()
	<-done
}

// completeGate holds every complete script at a gate: it reports each, with
// its encoding's length and capacity (complete.lua's second argument), on
// reached, then waits for the gate to open.
type completeGate struct {
	redis.Scripter
	sha     string
	reached chan [2]int
	open    chan struct{}
	once    *sync.Once
}

func (g completeGate) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if sha == g.sha {
		enc, _ := args[1].([]byte)
		g.reached <- [2]int{len(enc), cap(enc)}
		<-g.open
	}
	return g.Scripter.EvalSha(ctx, sha, keys, args...)
}

// release opens the gate (once; later calls do nothing).
func (g completeGate) release() { g.once.Do(func() { close(g.open) }) }

// await waits for n complete scripts at the gate and returns the sums of
// their encodings' lengths and capacities.
func (g completeGate) await(t *testing.T, n int) (lens, caps int) {
	t.Helper()
	for i := range n {
		select {
		case lc := <-g.reached:
			lens += lc[0]
			caps += lc[1]
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d completions reached Redis", i, n)
		}
	}
	return lens, caps
}

// gatedCompletesProxy starts a Handler on e's Redis whose complete scripts
// wait at a gate, up to n at once. The gate opens when the test ends at the
// latest (before the server closes, which waits for the handlers).
func gatedCompletesProxy(t *testing.T, e *env, n int) (*httptest.Server, *prometheus.Registry, completeGate) {
	t.Helper()
	sum := sha1.Sum([]byte(scripts.Complete)) //nolint:gosec // see the import
	g := completeGate{Scripter: e.rdb, sha: hex.EncodeToString(sum[:]), reached: make(chan [2]int, n), open: make(chan struct{}), once: new(sync.Once)}
	srv, reg := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(g, "idem:", m.ObserveScript)
	})
	t.Cleanup(g.release)
	return srv, reg, g
}

// answerWith has e's upstream answer every request 200 with body, its
// length announced.
func answerWith(e *env, body []byte) {
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	})
}

// sendDropped sends n keyed requests to srv at once (keys prefix-0 to
// prefix-<n-1>), each answer read and dropped, so that this process holds
// nothing of it; each must be 200 with size bytes. wg waits for them.
func sendDropped(t *testing.T, wg *sync.WaitGroup, srv *httptest.Server, prefix string, n, size int) {
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			r, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/orders", nil)
			if err != nil {
				t.Error(err)
				return
			}
			r.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
			resp, err := srv.Client().Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if got, _ := io.Copy(io.Discard, resp.Body); resp.StatusCode != http.StatusOK || got != int64(size) {
				t.Errorf("request %s-%d: status %d, %d bytes, want 200 and %d", prefix, i, resp.StatusCode, got, size)
			}
		}()
	}
}

// TestBufferBudgetRecordingCounted: while Redis takes an answer's record
// (up to claim.CompleteBudget with retries), the record's encoding holds the
// answer. MAX_BUFFERED_BYTES counts it, and the answer's copy, which it
// replaces, goes: four 3 MiB answers whose completions Redis has not taken
// yet grow the live heap by no more than idemproxy_buffered_bytes counts,
// and the count is the encodings', not the copies' and the encodings'.
// (Left out of the count until 2026-11-25: each held both, half of it
// uncounted.)
func TestBufferBudgetRecordingCounted(t *testing.T) {
	const (
		n    = 4
		size = 3 << 20
	)
	for _, backend := range bothBackends { // one at a time: the heap is the process's
		t.Run(backend, func(t *testing.T) {
			e := budgetEnv(t, backend, 64<<20, 4<<20, 10*time.Second)
			answerWith(e, bytes.Repeat([]byte("a"), size))
			srv, reg, g := gatedCompletesProxy(t, e, n)

			before := liveHeap()
			var wg sync.WaitGroup
			defer wg.Wait()
			defer g.release() // first: the handlers wait for it
			sendDropped(t, &wg, srv, "recorded", n, size)
			g.await(t, n)

			grown := liveHeap() - before
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d completions of %d MiB answers held back: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB", n, size>>20, counted, float64(grown)/(1<<20))
			if grown > int64(counted)+4<<20 {
				t.Errorf("live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: records being written to Redis are held uncounted", float64(grown)/(1<<20), counted)
			}
			if counted > n*(size+256<<10) {
				t.Errorf("idemproxy_buffered_bytes %v for %d records of %d MiB being written: the answer's copy is counted beside its encoding (or kept)", counted, n, size>>20)
			}

			g.release()
			wg.Wait()
			got := counter(t, reg, "idemproxy_buffered_bytes", nil)
			for deadline := time.Now().Add(2 * time.Second); got != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				got = counter(t, reg, "idemproxy_buffered_bytes", nil)
			}
			if got != 0 {
				t.Errorf("idemproxy_buffered_bytes %v once recorded, want 0", got)
			}
			for i := range n {
				if r := e.doTo(srv, req{key: fmt.Sprintf("recorded-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != size || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry %d: status %d, %d bytes, replayed %q: want the recorded answer", i, r.StatusCode, len(r.body), r.Header.Get("Idempotent-Replayed"))
				}
			}
		})
	}
}

// TestBufferBudgetReplaysCounted: a replay holds its record while the client
// reads it (up to UPSTREAM_TIMEOUT per write), so it is counted in
// MAX_BUFFERED_BYTES and refused when there is no room. Eight clients ask for
// replays of 6 MiB records (distinct keys, so the replay cache shares
// nothing; above what the kernel's send buffer takes off the heap) and read
// nothing: the live heap may not grow beyond what idemproxy_buffered_bytes
// counts. Records are in redis-server, not in this process. (Before the fix:
// replays were neither counted nor limited in number.)
func TestBufferBudgetReplaysCounted(t *testing.T) {
	const (
		keys   = 8
		max    = 6 << 20 // above what the kernel's send buffer (4 MiB at most) takes off the heap
		budget = 8 << 20
	)
	e := budgetEnv(t, realBackend, budget, max, 10*time.Second)
	big := bytes.Repeat([]byte("r"), max)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		_, _ = w.Write(big)
	})
	for i := range keys {
		if r := e.do(req{key: fmt.Sprintf("replayed-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != max {
			t.Fatalf("recording %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
	}

	before := liveHeap()
	out, err := redistest.OutputBytes(context.Background(), e.rdb)
	if err != nil {
		t.Fatal(err)
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range keys {
		c := dialProxy(t, e)
		conns = append(conns, c)
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: replayed-%d\r\nContent-Length: 0\r\n\r\n", i); err != nil {
			t.Fatal(err)
		}
	}
	// Until every replay has read its record and been admitted (it then
	// blocks in its first write, counted) or refused (503, its record
	// dropped). Bounded well within the writes' 10 s deadline (after it the
	// blocked replays end and free their records), so that replays never
	// counted still fail below.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		admitted := int(bufferedBytes(t, e)) / max
		if admitted+int(counter(t, e.reg, "idemproxy_buffer_full_total", nil)) == keys &&
			int(counter(t, e.reg, "idemproxy_inflight_requests", nil)) == admitted {
			break
		}
	}

	// A replay is counted before its record is read (readLarge), so the
	// count says nothing of where it is: each has written its status line
	// once its record is read and decoded, or answered 503.
	for i, c := range conns {
		var line [12]byte // "HTTP/1.1 200", or 503
		if _, err := io.ReadFull(c, line[:]); err != nil {
			t.Fatalf("replay %d: status line: %v", i, err)
		}
	}
	heapWithinCount(t, e, before, "replays of 6 MiB records to clients that do not read", "replays are held in memory, unbounded in number and uncounted")

	// Only the replays let in read their records: a refused one was told
	// the record's size, not sent it (else each held up to a record,
	// uncounted, until it was refused).
	sent, err := redistest.OutputBytes(context.Background(), e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	admitted := int64(bufferedBytes(t, e)) / max
	if refused := counter(t, e.reg, "idemproxy_buffer_full_total", nil); refused == 0 || admitted == 0 {
		t.Fatalf("%v replays refused, %d let in: want some of each, or this shows nothing", refused, admitted)
	}
	if sent -= out; sent > admitted*max+1<<20 {
		t.Errorf("Redis sent %d MiB for %d replays of which %d were let in: the refused ones read their %d MiB records too", sent>>20, keys, admitted, max>>20)
	}
}

// TestBufferBudgetLargeReplayNotStarved: a replay is let in under a new
// request's rule (the count below MAX_BUFFERED_BYTES), then counts its
// record, so a retry of a completed request is never refused where a new
// execution of the same size gets in. (Before the fix: a replay had to fit
// whole, and a 40 KiB replay got 503 while a new request with the same
// 40 KiB answer was executed, so under steady load large replays starved.)
func TestBufferBudgetLargeReplayNotStarved(t *testing.T) {
	t.Parallel()
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		answer := bytes.Repeat([]byte("a"), 40<<10)
		held := g.handler(e.created)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/held":
				held(w, r)
			case "/large":
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
				_, _ = w.Write(answer)
			default:
				e.created(w, r)
			}
		})
		body := strings.Repeat("b", 30<<10)
		if r := e.do(req{path: "/large", key: "done", body: body}); r.StatusCode != http.StatusOK {
			t.Fatalf("first: status %d", r.StatusCode)
		}
		eventually(t, 5*time.Second, "nothing held", func() bool { return bufferedBytes(t, e) == 0 })

		first := holdOne(t, e, g, "held", 30<<10) // 30 of the 64 KiB

		fresh := e.do(req{path: "/large", key: "fresh", body: body})
		retry := e.do(req{path: "/large", key: "done", body: body})
		t.Logf("new request: %d (%d bytes); retry of the completed one: %d %s",
			fresh.StatusCode, len(fresh.body), retry.StatusCode, retry.Header.Get("Retry-After"))
		if fresh.StatusCode != http.StatusOK {
			t.Fatalf("new request: status %d (the scenario needs it admitted)", fresh.StatusCode)
		}
		if retry.StatusCode != http.StatusOK || retry.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry of a completed request (40 KiB record) refused with %d while a new request with the same body and answer was executed: "+
				"large replays are starved by the admission rule (new: used < max; replay: used+len <= max)", retry.StatusCode)
		}
		g.open()
		<-first
	})
}

// TestBufferBudgetFullRefusesBodilessRequests: with MAX_BUFFERED_BYTES full,
// a keyed request without a body is either refused before anything is
// claimed (503, and its retry executes) or executed and its answer replayed
// byte for byte; never executed and then unreplayable. (Before the fix: it
// took nothing at the body stage, was executed, and its 43-byte answer
// found no room and was recorded without its body.)
func TestBufferBudgetFullRefusesBodilessRequests(t *testing.T) {
	t.Parallel()
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		// The whole budget held by two requests at the upstream.
		first := holdOne(t, e, g, "held-1", 40<<10)
		second := holdOne(t, e, g, "held-2", 24<<10)
		if got := bufferedBytes(t, e); got != 64<<10 {
			t.Fatalf("idemproxy_buffered_bytes %v, want the full %d", got, 64<<10)
		}

		orig := e.do(req{key: "no-body", body: ""})
		g.open()
		<-first
		<-second

		retry := e.do(req{key: "no-body", body: ""})
		switch orig.StatusCode {
		case http.StatusServiceUnavailable:
			// Refused before claiming: the retry must execute.
			if retry.StatusCode != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("refused first, then retry: status %d replayed %q %s; want a fresh 201", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), retry.body)
			}
		case http.StatusCreated:
			t.Logf("first (budget full, no body): %d %s", orig.StatusCode, orig.body)
			t.Logf("retry: %d replayed=%q %s", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), retry.body)
			if retry.StatusCode != http.StatusCreated || !bytes.Equal(retry.body, orig.body) {
				t.Errorf("a %d-byte answer executed while MAX_BUFFERED_BYTES was full is not replayable: retry got %d %s, want the recorded %s byte for byte",
					len(orig.body), retry.StatusCode, retry.body, orig.body)
			}
		default:
			t.Fatalf("first: status %d %s", orig.StatusCode, orig.body)
		}
	})
}

// TestBufferBudgetRecordingCountsEncodingCapacity: while Redis takes a record,
// what the process holds is the encoding's allocation, cap(enc), not
// len(enc): Record.Encode allocates an over-estimate (10 bytes per header
// value, 20 per name, 43 more) and the allocator rounds it up (to a size
// class, or to whole 8 KiB pages above 32 KiB). The copy the encoding
// replaces was counted by its capacity; the encoding is counted by its
// length. For answers just above 32 KiB that is ~20 % uncounted per
// recording (up to 8 KiB each), more for answers with many short header
// values, which the upstream chooses.
func TestBufferBudgetRecordingCountsEncodingCapacity(t *testing.T) {
	t.Parallel()
	const (
		n    = 4
		size = 32<<10 + 1
	)
	for _, backend := range bothBackends {
		t.Run(backend, func(t *testing.T) {
			e := budgetEnv(t, backend, 4<<20, 1<<20, 10*time.Second)
			answerWith(e, bytes.Repeat([]byte("c"), size))
			srv, reg, g := gatedCompletesProxy(t, e, n)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer g.release() // first: the handlers wait for it
			sendDropped(t, &wg, srv, "enccap", n, size)
			lens, caps := g.await(t, n)
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d encodings held: len %d, cap %d; idemproxy_buffered_bytes=%v", n, lens, caps, counted)
			if counted < float64(caps) {
				t.Errorf("idemproxy_buffered_bytes %v while %d encodings of %d bytes' capacity (%d long) are held: %d bytes held uncounted", counted, n, caps, lens, caps-int(counted))
			}
			g.release()
			wg.Wait()
			eventually(t, 2*time.Second, "idemproxy_buffered_bytes back to 0", func() bool { return counter(t, reg, "idemproxy_buffered_bytes", nil) == 0 })
		})
	}
}

// TestBufferBudgetRecordingHeadersCounted: an answer's headers are held while
// Redis takes its record as its body is, by the upstream's header map
// (net/http lets an upstream send up to 10 MiB of them; the proxy's
// Transport sets no MaxResponseHeaderBytes) besides the encoding, which
// is counted. Four answers with about 6 MB of headers each (150 values of 40 KiB), whose completions
// Redis has not taken yet, must not grow the live heap past what
// idemproxy_buffered_bytes counts. (Not introduced by 33a36ae, which made
// it better: before it neither the headers nor their encoding counted.)
func TestBufferBudgetRecordingHeadersCounted(t *testing.T) {
	const (
		n      = 4
		values = 150
		each   = 40 << 10 // 150 x 40 KiB = 6 MiB of headers per answer
	)
	e := budgetEnv(t, realBackend, 64<<20, 1<<20, 10*time.Second)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		for i := range values {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), key+strings.Repeat("h", each-len(key))) // whole pages
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	srv, reg, g := gatedCompletesProxy(t, e, n)
	before := liveHeap()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer g.release() // first: the handlers wait for it
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A raw connection, read and dropped: the test process keeps
			// nothing of the answer (a net/http client would hold its
			// headers until the body ends, after the completion).
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URL, "http://"), 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(15 * time.Second))
			fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hdr-%d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", i)
			_, _ = io.Copy(io.Discard, c)
		}()
	}
	g.await(t, n)
	grown := liveHeap() - before
	counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
	t.Logf("%d answers with %d MiB of headers being recorded: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB", n, values*each>>20, counted, float64(grown)/(1<<20))
	if grown > int64(counted)+4<<20 {
		t.Errorf("live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: answers' headers held uncounted while recorded", float64(grown)/(1<<20), counted)
	}
	g.release()
}

// deterministicBody is the deterministic body of (key, n bytes): every answer
// differs, so a pooled buffer reused too early would show in a replay.
func deterministicBody(key string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(i*7+len(key)*13+int(key[len(key)-1]))%36]
	}
	copy(b, key)
	return b
}

// TestBufferBudgetReturnsToZeroAcrossPaths (soundness check, passes on
// HEAD): every way an executed answer ends (large and small copies, a body
// the upstream aborts, one past MAX_STORED_RESPONSE_BYTES, 103 then the
// answer, trailers, 204, a released 5xx, an event stream, a client that
// leaves mid-answer) run concurrently, several rounds, on both backends:
// MAX_BUFFERED_BYTES returns to 0, and every stored answer replays byte for
// byte (no pooled copy reused while it still held another's answer).
func TestBufferBudgetReturnsToZeroAcrossPaths(t *testing.T) {
	t.Parallel()
	const rounds = 6
	for _, backend := range bothBackends {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, func(o *proxy.Options) {
				budgetSizes(o, 4<<20, 64<<10, 5*time.Second)
			})
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				key := r.Header.Get("Idempotency-Key")
				fl := w.(http.Flusher)
				switch {
				case strings.HasPrefix(r.URL.Path, "/big"), strings.HasPrefix(r.URL.Path, "/leave"):
					b := deterministicBody(key, 40000+len(key))
					w.Header().Set("Content-Length", fmt.Sprint(len(b)))
					_, _ = w.Write(b)
				case strings.HasPrefix(r.URL.Path, "/small"):
					b := deterministicBody(key, 3000)
					for i := 0; i < len(b); i += 1000 {
						_, _ = w.Write(b[i : i+1000])
						fl.Flush()
					}
				case strings.HasPrefix(r.URL.Path, "/abort"):
					w.Header().Set("Content-Length", "10000")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write(deterministicBody(key, 5000))
					fl.Flush()
					panic(http.ErrAbortHandler)
				case strings.HasPrefix(r.URL.Path, "/toolarge"):
					b := deterministicBody(key, 100<<10)
					for i := 0; i < len(b); i += 10 << 10 {
						_, _ = w.Write(b[i : i+10<<10])
						fl.Flush()
					}
				case strings.HasPrefix(r.URL.Path, "/early"):
					w.Header().Set("Link", "</a.css>; rel=preload")
					w.WriteHeader(http.StatusEarlyHints)
					w.Header().Del("Link")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write(deterministicBody(key, 20000))
				case strings.HasPrefix(r.URL.Path, "/trailer"):
					w.Header().Set("Trailer", "X-Sum")
					_, _ = w.Write(deterministicBody(key, 30000))
					w.Header().Set("X-Sum", "sum-"+key)
				case strings.HasPrefix(r.URL.Path, "/nobody"):
					w.WriteHeader(http.StatusNoContent)
				case strings.HasPrefix(r.URL.Path, "/fail"):
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = w.Write(deterministicBody(key, 20000))
				case strings.HasPrefix(r.URL.Path, "/sse"):
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: one\n\n")
					fl.Flush()
					_, _ = io.WriteString(w, "data: two\n\n")
				}
			})
			paths := []string{"/big", "/small", "/abort", "/toolarge", "/early", "/trailer", "/nobody", "/fail", "/sse", "/leave"}
			type first struct {
				status  int
				body    []byte
				trailer string
				ok      bool // read to its end without error
			}
			var (
				mu     sync.Mutex
				firsts = map[string]first{}
				wg     sync.WaitGroup
			)
			for round := range rounds {
				for _, p := range paths {
					key := fmt.Sprintf("paths-%s-%d", p[1:], round)
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+p, strings.NewReader("body-"+key))
						hr.Header.Set("Idempotency-Key", key)
						resp, err := e.srv.Client().Do(hr)
						if err != nil {
							t.Errorf("%s: %v", key, err)
							return
						}
						defer resp.Body.Close()
						if p == "/leave" { // the client leaves after the first bytes
							_, _ = io.ReadFull(resp.Body, make([]byte, 100))
							return
						}
						b, err := io.ReadAll(resp.Body)
						mu.Lock()
						firsts[key] = first{status: resp.StatusCode, body: b, trailer: resp.Trailer.Get("X-Sum"), ok: err == nil}
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			eventually(t, 5*time.Second, "idemproxy_buffered_bytes back to 0", func() bool { return bufferedBytes(t, e) == 0 })

			for round := range rounds {
				for _, p := range paths {
					key := fmt.Sprintf("paths-%s-%d", p[1:], round)
					f := firsts[key]
					r := e.doTo(e.srv, req{path: p, key: key, body: "body-" + key})
					switch p {
					case "/big", "/small", "/early", "/trailer", "/leave":
						want := deterministicBody(key, map[string]int{"/big": 40000 + len(key), "/leave": 40000 + len(key), "/small": 3000, "/early": 20000, "/trailer": 30000}[p])
						if p != "/leave" && (!f.ok || !bytes.Equal(f.body, want)) {
							t.Errorf("%s first: %d bytes (ok %v), not the upstream's %d", key, len(f.body), f.ok, len(want))
						}
						if r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, want) {
							t.Errorf("%s replay: status %d replayed %q, %d bytes, equal %v", key, r.StatusCode, r.Header.Get("Idempotent-Replayed"), len(r.body), bytes.Equal(r.body, want))
						}
						if p == "/trailer" && (f.trailer != "sum-"+key || r.Trailer.Get("X-Sum") != "sum-"+key) {
							t.Errorf("%s trailer: first %q, replay %q", key, f.trailer, r.Trailer.Get("X-Sum"))
						}
					case "/nobody":
						if r.StatusCode != http.StatusNoContent || r.Header.Get("Idempotent-Replayed") != "true" {
							t.Errorf("%s replay: %d", key, r.StatusCode)
						}
					case "/abort", "/toolarge", "/sse":
						if r.Header.Get("Idempotent-Replayed") != "true" {
							t.Errorf("%s replay: %d, not replayed", key, r.StatusCode)
						}
					}
				}
			}
			eventually(t, 5*time.Second, "idemproxy_buffered_bytes back to 0 after the replays", func() bool { return bufferedBytes(t, e) == 0 })
		})
	}
}

// TestBufferBudgetEvictedCachedReplaysCounted: a replay answered from the
// replay cache counts nothing in MAX_BUFFERED_BYTES, on the grounds that
// "the cache holds it, once" (README, MAX_BUFFERED_BYTES). That holds only
// while the entry stays in the cache. Once the cache evicts it (the oldest
// goes first when newer records come in), the record is held by nobody but
// the replays still writing it to clients that do not read, for up to
// UPSTREAM_TIMEOUT each, and it is counted nowhere: neither in
// REPLAY_CACHE_BYTES (no longer cached) nor in MAX_BUFFERED_BYTES. A client
// that records answers under many keys in its own scope and asks for each
// replay without reading it holds any amount of memory, past the README's
// sizing (about twice MAX_BUFFERED_BYTES plus REPLAY_CACHE_BYTES), while
// idemproxy_buffered_bytes reads 0 and no request is ever refused.
func TestBufferBudgetEvictedCachedReplaysCounted(t *testing.T) {
	const (
		size  = 6 << 20 // above what the kernel's send buffer takes on loopback
		cache = 64 << 20
		keys  = 22 // 10 fit in the cache; 12 are evicted while their replays are unread
	)
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.MaxBodyBytes = 64 << 10
		o.MaxStoredBytes = size
		o.MaxBufferedBytes = 2 * size
		o.UpstreamTimeout = 20 * time.Second
		o.Default.LockTTL = 40 * time.Second
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(size))
		_, _ = w.Write(bytes.Repeat([]byte{r.URL.Path[len(r.URL.Path)-1]}, size))
	})
	srv, reg := cachedProxy(t, e) // REPLAY_CACHE_BYTES=64 MiB: records up to 8 MiB are kept
	before := liveHeap()

	var conns []net.Conn
	var replaying, refused int
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for i := range keys {
		if time.Now().After(deadline) {
			t.Fatal("setup took too long")
		}
		path := fmt.Sprintf("/export/%c", 'a'+i)
		key := fmt.Sprintf("k%d", i)
		r := e.doTo(srv, req{path: path, key: key})
		if r.StatusCode == http.StatusServiceUnavailable {
			// MAX_BUFFERED_BYTES is full of what the unread replays hold:
			// the bound at work (before the fix, nothing was ever refused).
			t.Logf("first request %d: 503, MAX_BUFFERED_BYTES full", i)
			refused++
			break
		}
		if r.StatusCode != http.StatusOK || len(r.body) != size {
			t.Fatalf("first request %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
		eventually(t, 10*time.Second, "answer recorded", func() bool {
			ks, _ := e.rdb.Keys(context.Background(), "idem:*").Result()
			n := 0
			for _, k := range ks {
				if st, _ := e.rdb.HGet(context.Background(), k, "st").Result(); st == "c" {
					n++
				}
			}
			return n == i+1
		})
		// One replay read in full: it reads the record from Redis and
		// caches it (the oldest entry goes once the cache is full). Then
		// one never read, answered from the cache.
		if r := e.doTo(srv, req{path: path, key: key}); r.StatusCode == http.StatusServiceUnavailable {
			t.Logf("replay %d: 503, MAX_BUFFERED_BYTES full", i)
			refused++
			break
		} else if r.StatusCode != http.StatusOK || len(r.body) != size || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
		c := dialServer(t, srv)
		conns = append(conns, c)
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 0\r\n\r\n", path, key); err != nil {
			t.Fatal(err)
		}
		// Its answer has begun (a replay, from the cache or read from
		// Redis, now blocked on the unread socket), or it was refused.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReaderSize(c, 64).ReadString('\n')
		switch {
		case err != nil:
			t.Fatalf("unread replay %d: no status line: %v", i, err)
		case strings.HasPrefix(line, "HTTP/1.1 200"):
			replaying++
		case strings.HasPrefix(line, "HTTP/1.1 503"):
			refused++ // MAX_BUFFERED_BYTES full: bounded, as it should be
		default:
			t.Fatalf("unread replay %d: %q", i, line)
		}
	}
	t.Logf("unread replays: %d answering, %d refused (503); replay cache hits %v", replaying, refused,
		counter(t, reg, "idemproxy_replay_cache_hits_total", nil))
	grown := liveHeap() - before
	counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
	t.Logf("%d unread replays of distinct %d MiB records: live heap grew by %.0f MiB; idemproxy_buffered_bytes=%v; REPLAY_CACHE_BYTES=%d MiB, MAX_BUFFERED_BYTES=%d MiB",
		replaying, size>>20, float64(grown)/(1<<20), counted, cache>>20, e.opts.MaxBufferedBytes>>20)
	if limit := int64(cache) + int64(counted) + 8<<20; grown > limit {
		t.Errorf("live heap grew by %.0f MiB, past REPLAY_CACHE_BYTES (%d MiB) + idemproxy_buffered_bytes (%.0f MiB): "+
			"records evicted from the replay cache while their replays are unread are held and counted nowhere",
			float64(grown)/(1<<20), cache>>20, counted/(1<<20))
	}
}

// TestObserveForwardDoesNotHoldCachedRecord: in observe mode a
// duplicate of a completed key (would_replay) is forwarded, not replayed;
// the record Acquire returned is used for its status only. But the handler
// releases it in a defer that runs when the request ends, so every such
// forward holds its record in the replay cache for as long as the upstream
// answers: for a stream that flows (never cut), for ever. The README says a
// record stays counted "while replays still write it to clients"; these are
// no replays, yet records held this way fill REPLAY_CACHE_BYTES and the
// cache keeps nothing more while they last (every replay then reads Redis).
func TestObserveForwardDoesNotHoldCachedRecord(t *testing.T) {
	t.Parallel()
	const (
		bodySize   = 14 << 10 // under 16 KiB: observe reads it with the claim
		cacheBytes = 128 << 10
		streams    = 8 // 8 records of ~14.7 KiB leave less than one free
	)
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Default.Observe = true
		o.UpstreamTimeout = 10 * time.Second
	})
	done := make(chan struct{})
	var blocked atomic.Int32
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Stream") == "" {
			_, _ = w.Write(bytes.Repeat([]byte("x"), bodySize))
			return
		}
		// A long download that keeps flowing.
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		blocked.Add(1)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for range 400 { // at most 20 s
			select {
			case <-done:
				return
			case <-r.Context().Done():
				return
			case <-tick.C:
				_, _ = w.Write([]byte("."))
				w.(http.Flusher).Flush()
			}
		}
	})
	srv, reg := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(e.rdb, "idem:", m.ObserveScript, claim.ReplayCache(cacheBytes, time.Minute))
	})
	recorded := func(n int) {
		eventually(t, 10*time.Second, "answers recorded", func() bool {
			ks, _ := e.rdb.Keys(context.Background(), "idem:*").Result()
			c := 0
			for _, k := range ks {
				if st, _ := e.rdb.HGet(context.Background(), k, "st").Result(); st == "c" {
					c++
				}
			}
			return c >= n
		})
	}
	for i := range streams {
		if r := e.doTo(srv, req{path: fmt.Sprintf("/o/%d", i), key: fmt.Sprintf("k%d", i)}); r.StatusCode != http.StatusOK {
			t.Fatalf("first request %d: %d", i, r.StatusCode)
		}
	}
	recorded(streams)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { close(done); cancel(); wg.Wait() }()
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.send(ctx, srv, req{path: fmt.Sprintf("/o/%d", i), key: fmt.Sprintf("k%d", i),
				header: http.Header{"X-Stream": {"1"}}})
		}()
	}
	eventually(t, 10*time.Second, "observe forwards streaming", func() bool { return blocked.Load() == streams })

	// A new key, replayed twice while those downloads flow: the first
	// replay reads Redis and should be kept, the second answered from the
	// cache.
	if r := e.doTo(srv, req{path: "/o/fresh", key: "fresh"}); r.StatusCode != http.StatusOK {
		t.Fatalf("fresh: %d", r.StatusCode)
	}
	recorded(streams + 1)
	hits := counter(t, reg, "idemproxy_replay_cache_hits_total", nil)
	for i := range 2 {
		if r := e.doTo(srv, req{path: "/o/fresh", key: "fresh"}); r.StatusCode != http.StatusOK {
			t.Fatalf("fresh duplicate %d: %d", i, r.StatusCode)
		}
	}
	if got := counter(t, reg, "idemproxy_replay_cache_hits_total", nil) - hits; got < 1 {
		t.Errorf("replay cache hits for a fresh key's duplicates: %v, want 1: the %d observe-mode forwards of other "+
			"keys (no replays) hold their records in REPLAY_CACHE_BYTES=%d for as long as their upstream answers stream, "+
			"and the cache keeps nothing more", got, streams, cacheBytes)
	}
}

// TestLargeRecordReplay: a record above what a claim's reply carries (16
// KiB) is replayed byte for byte, read by a second claim once counted; in
// observe mode its duplicate is forwarded and counted would_replay without
// the record being read.
func TestLargeRecordReplay(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) { o.MaxBufferedBytes = 32 << 20 }, func(t *testing.T, e *env) {
		big := bytes.Repeat([]byte("L"), 100<<10)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(big)
		})
		first := e.do(req{key: "large", body: "b"})
		if first.StatusCode != http.StatusCreated || !bytes.Equal(first.body, big) {
			t.Fatalf("first: %d, %d bytes", first.StatusCode, len(first.body))
		}
		for i := range 2 {
			r := e.do(req{key: "large", body: "b"})
			if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, big) {
				t.Fatalf("replay %d: %d replayed %q, %d bytes; want the first answer byte for byte", i, r.StatusCode, r.Header.Get("Idempotent-Replayed"), len(r.body))
			}
		}
		if n := counter(t, e.reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "large"}); n != 2 {
			t.Errorf("claims answered with the record's size only: %v, want 2 (one per replay)", n)
		}
		if n := counter(t, e.reg, "idemproxy_buffered_bytes", nil); n != 0 {
			t.Errorf("idemproxy_buffered_bytes %v after the replays, want 0 (every count given back)", n)
		}
		if n := e.calls.Load(); n != 1 {
			t.Errorf("upstream calls %d, want 1", n)
		}

		obs := e.opts
		obs.Default.Observe = true
		_, srv, reg := e.newProxy(obs)
		if r := e.doTo(srv, req{key: "large", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("observe: %d replayed %q, want the upstream's own answer", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
		if n := counter(t, reg, "idemproxy_requests_total", map[string]string{"outcome": "would_replay"}); n != 1 {
			t.Errorf("observe: would_replay %v, want 1", n)
		}
		if n := counter(t, reg, "idemproxy_redis_script_duration_seconds", map[string]string{"script": "claim", "result": "replay"}); n != 0 {
			t.Errorf("observe: %v claims read the record, want 0 (its size tells enough)", n)
		}
		if n := e.calls.Load(); n != 2 {
			t.Errorf("upstream calls %d, want 2 (observe forwards the duplicate)", n)
		}
	})
}

// largeHookProxy starts a Handler on e's Redis whose store calls onLarge,
// synchronously, each time a claim is answered 'large' (between the first
// claim and readLarge's second one).
func largeHookProxy(t *testing.T, e *env, opts proxy.Options, onLarge func(n int)) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	var n atomic.Int32
	return storeProxy(t, e, opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(e.rdb, "idem:", func(ev claim.Event) {
			m.ObserveScript(ev)
			if ev.Op == claim.OpClaim && ev.Result == "large" {
				onLarge(int(n.Add(1)))
			}
		})
	})
}

// TestLargeReplayWaitRouteAfterRecordChanged: on a wait= route, the record
// expires (or is purged) between the 'large' claim and readLarge's second
// claim, and a new execution of the same request claims it. The duplicate
// that then finds the key in flight waits for it, as any duplicate on a
// wait route does, rather than 409 at once.
func TestLargeReplayWaitRouteAfterRecordChanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.MaxBufferedBytes = 32 << 20; o.Default.Wait = 5 * time.Second })
	big := bytes.Repeat([]byte("L"), 100<<10)
	var calls atomic.Int32
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) > 1 {
			time.Sleep(300 * time.Millisecond)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(big)
	})
	if r := e.do(req{key: "k", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("first: %d", r.StatusCode)
	}
	var other sync.WaitGroup
	srv, _ := largeHookProxy(t, e, e.opts, func(n int) {
		if n != 1 {
			return
		}
		// The record expires; the same request, sent again elsewhere, claims the key.
		if err := e.rdb.FlushAll(context.Background()).Err(); err != nil {
			t.Error(err)
		}
		other.Add(1)
		go func() { defer other.Done(); e.do(req{key: "k", body: "b"}) }()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if keys, _ := e.rdb.Keys(context.Background(), "idem:*").Result(); len(keys) > 0 {
				return
			}
		}
		t.Error("the other request never claimed the key")
	})
	r := e.doTo(srv, req{key: "k", body: "b"})
	other.Wait()
	if r.StatusCode != http.StatusCreated || !bytes.Equal(r.body, big) {
		t.Errorf("duplicate on a wait route, key found in flight by the second claim: %d (%d bytes), want it to wait and get the replay (201)", r.StatusCode, len(r.body))
	}
}

// TestLargeReplayChangingRecordIsNotOverload: a record that is larger at each
// of readLarge's claims (three tries) is answered 503 and never executed,
// but not as overloaded: neither counted in idemproxy_buffer_full_total nor
// logged "MAX_BUFFERED_BYTES reached", the budget being empty.
func TestLargeReplayChangingRecordIsNotOverload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.MaxBufferedBytes = 32 << 20 })
	recordLarge(t, e, "k")
	keys, err := e.rdb.Keys(context.Background(), "idem:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v %v", keys, err)
	}
	srv, reg := largeHookProxy(t, e, e.opts, func(int) {
		// The record grows between claims (stands for a purge and a new execution each time).
		ctx := context.Background()
		rec, err := e.rdb.HGet(ctx, keys[0], "rec").Result()
		if err != nil {
			t.Error(err)
			return
		}
		e.rdb.HSet(ctx, keys[0], "rec", rec+"x")
	})
	r := e.doTo(srv, req{key: "k", body: "b"})
	full := counter(t, reg, "idemproxy_buffer_full_total", nil)
	used := counter(t, reg, "idemproxy_buffered_bytes", nil)
	if r.StatusCode == http.StatusServiceUnavailable && full > 0 {
		t.Errorf("record changing at each claim: %d, idemproxy_buffer_full_total %v with idemproxy_buffered_bytes %v (limit %d): counted and logged as MAX_BUFFERED_BYTES reached though nothing was full", r.StatusCode, full, used, e.opts.MaxBufferedBytes)
	}
	if bytes.Contains([]byte(e.logs.String()), []byte("MAX_BUFFERED_BYTES reached")) {
		t.Errorf("log says MAX_BUFFERED_BYTES reached; the budget was empty")
	}
}

// TestLargeReplayNoFailOpenAfterLarge: the first claim proves the key completed
// ('large'); Redis then fails before the second claim. Even with fail_open
// the request is not forwarded: the upstream would execute a request the
// proxy had just seen completed.
func TestLargeReplayNoFailOpenAfterLarge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.MaxBufferedBytes = 32 << 20; o.Default.FailOpen = true })
	recordLarge(t, e, "k")
	srv, _ := largeHookProxy(t, e, e.opts, func(int) { e.mr.Close() })
	r := e.doTo(srv, req{key: "k", body: "b"})
	if n := e.calls.Load(); n != 1 {
		t.Errorf("upstream calls %d (answer %d, replayed %q), want 1: the key was seen completed, then executed again (fail open on readLarge's claim)", n, r.StatusCode, r.Header.Get("Idempotent-Replayed"))
	}
}

// recordLarge records a 100 KiB answer (above what a claim's reply
// carries) for key with the body "b".
func recordLarge(t *testing.T, e *env, key string) {
	t.Helper()
	big := bytes.Repeat([]byte("L"), 100<<10)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(big)
	})
	if r := e.do(req{key: key, body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("first: %d", r.StatusCode)
	}
}

// TestLargeReplayCountedTwiceWhileDecoded: while readLarge's second claim
// brings a large record back and it is decoded, the reply and the decoded
// record are both held: MAX_BUFFERED_BYTES counts the record twice then, and
// once after (the replay holds it while the client reads).
func TestLargeReplayCountedTwiceWhileDecoded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.MaxBufferedBytes = 32 << 20 })
	recordLarge(t, e, "k")
	ctx := context.Background()
	keys, err := e.rdb.Keys(ctx, "idem:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v %v", keys, err)
	}
	size, err := e.rdb.HStrLen(ctx, keys[0], "rec").Result()
	if err != nil || size < 100<<10 {
		t.Fatalf("record size %d %v", size, err)
	}
	var (
		reg          *prometheus.Registry
		mu           sync.Mutex
		whileDecoded []float64
	)
	srv, r := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(e.rdb, "idem:", func(ev claim.Event) {
			m.ObserveScript(ev)
			// The claim's reply is in, not yet decoded.
			if ev.Op == claim.OpClaim && ev.Result == "replay" {
				mu.Lock()
				whileDecoded = append(whileDecoded, counter(t, reg, "idemproxy_buffered_bytes", nil))
				mu.Unlock()
			}
		})
	})
	reg = r
	resp := e.doTo(srv, req{key: "k", body: "b"})
	if resp.StatusCode != http.StatusCreated || len(resp.body) != 100<<10 {
		t.Fatalf("replay: %d, %d bytes", resp.StatusCode, len(resp.body))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(whileDecoded) != 1 {
		t.Fatalf("replay claims seen %d, want 1 (readLarge's second claim)", len(whileDecoded))
	}
	if got := whileDecoded[0]; got < float64(2*size) {
		t.Errorf("idemproxy_buffered_bytes %v while the %d-byte record was decoded, want at least %d: the reply and the record are both held", got, size, 2*size)
	}
	// The handler gives the count back as it returns, after the client's read.
	got := counter(t, reg, "idemproxy_buffered_bytes", nil)
	for deadline := time.Now().Add(2 * time.Second); got != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		got = counter(t, reg, "idemproxy_buffered_bytes", nil)
	}
	if got != 0 {
		t.Errorf("idemproxy_buffered_bytes %v after the replay, want 0", got)
	}
}

// TestBudgetNeverExceeded: accounts taking and giving back concurrently
// never hold more than the budget together, and give it all back.
func TestBudgetNeverExceeded(t *testing.T) {
	t.Parallel()
	b := proxy.NewBudget(10_000)
	var peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				a := b.Account()
				for j := range 5 {
					if a.Take(int64(100 + (g*7+i+j)%900)) {
						if u := b.Used(); u > peak.Load() {
							peak.Store(u)
						}
					}
				}
				a.Give(50)
				a.Close()
				a.Close() // twice gives nothing more
			}
		}()
	}
	wg.Wait()
	if u := b.Used(); u != 0 {
		t.Errorf("used after every account closed: %d, want 0", u)
	}
	if p := peak.Load(); p > b.Max() || p == 0 {
		t.Errorf("peak %d, want above 0 and at most %d", p, b.Max())
	}
	if b.Take(b.Max()+1) || b.Used() != 0 {
		t.Errorf("a take above the budget succeeded or left bytes taken")
	}
	var none proxy.Account // a nil account bounds nothing
	if !none.Take(1 << 40) {
		t.Error("nil account refused")
	}
	none.Give(1)
	none.Close()
}
