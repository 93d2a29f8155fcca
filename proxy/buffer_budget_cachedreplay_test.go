package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

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
// nothing in MAX_BUFFERED_BYTES. (Found by review: it counted its record's
// size for as long as its client took to read it, so two ~90-byte requests
// that never read a cached 6 MiB record locked a 12 MiB budget, and every
// other keyed request of every tenant got 503.)
func TestBufferBudgetCachedReplaysCountNothing(t *testing.T) {
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
		c, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
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
