package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

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
// wait route does, rather than 409 at once (review67).
func TestLargeReplayWaitRouteAfterRecordChanged(t *testing.T) {
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
// logged "MAX_BUFFERED_BYTES reached", the budget being empty (review67).
func TestLargeReplayChangingRecordIsNotOverload(t *testing.T) {
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
// proxy had just seen completed (review67).
func TestLargeReplayNoFailOpenAfterLarge(t *testing.T) {
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
