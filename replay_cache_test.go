package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReplayCacheOnMetric: idemproxy_replay_cache_on is 1 once the cache
// answers, and not exported with REPLAY_CACHE_BYTES=0, whose replays are
// all read from Redis.
func TestReplayCacheOnMetric(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	c := newClient(t)
	on, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	cachedAnswer(t, c, on, "on") // waits for the metric at 1, and checks the cache answers

	off, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0",
		"REPLAY_CACHE_BYTES=0")
	url := "http://" + off.proxyAddr.String() + "/v1/orders"
	for range 3 {
		if r := mustPost(t, c, url, "off", `{}`); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %q", r.status, r.body)
		}
	}
	if m := getBody(t, c, "http://"+off.adminAddr.String()+"/metrics"); strings.Contains(m, "idemproxy_replay_cache_on") {
		t.Errorf("idemproxy_replay_cache_on exported with REPLAY_CACHE_BYTES=0 (an alert on 0 would fire for a cache turned off on purpose)")
	}
	if v := metric(t, c, off, "idemproxy_replay_cache_hits_total"); v != 0 {
		t.Errorf("replay cache hits with REPLAY_CACHE_BYTES=0: %v, want 0", v)
	}
}
