package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestLargeRecordReplay: a record above what a claim's reply carries (16
// KiB) is replayed byte for byte, read by a second claim once counted; in
// observe mode its duplicate is forwarded and counted would_replay without
// the record being read.
func TestLargeRecordReplay(t *testing.T) {
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
