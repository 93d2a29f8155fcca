package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
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

// TestReplayCacheOnFollowsTheSubscription: the gauge goes back to 0 when
// a verified subscription fails (Redis gone), and to 1 once a new one is
// verified (review64).
func TestReplayCacheOnFollowsTheSubscription(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	c := newClient(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	cachedAnswer(t, c, a, "follow")
	srv.Kill()
	testutil.Eventually(t, 5*time.Second, "idemproxy_replay_cache_on 0 once Redis is gone (the cache no longer answers)", func() bool {
		return metric(t, c, a, "idemproxy_replay_cache_on") == 0
	})
	srv.Restart()
	waitReplayCacheOn(t, c, a)
}
