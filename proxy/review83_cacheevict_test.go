package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview83EvictedCachedReplaysUncounted (review 83): a replay answered from the
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
func TestReview83EvictedCachedReplaysUncounted(t *testing.T) {
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
		c, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
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
