package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview84ObserveForwardHoldsCachedRecord (review 84): in observe mode a
// duplicate of a completed key (would_replay) is forwarded, not replayed;
// the record Acquire returned is used for its status only. But the handler
// releases it in a defer that runs when the request ends, so every such
// forward holds its record in the replay cache for as long as the upstream
// answers: for a stream that flows (never cut), for ever. The README says a
// record stays counted "while replays still write it to clients"; these are
// no replays, yet records held this way fill REPLAY_CACHE_BYTES and the
// cache keeps nothing more while they last (every replay then reads Redis).
func TestReview84ObserveForwardHoldsCachedRecord(t *testing.T) {
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
