package main

// End-to-end tests through start(): the proxy and its admin listener as
// production wires them, on the embedded Redis or a redis-server that the
// test kills and restarts.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestStartWarnsOnEvictionPolicy(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Client().ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy: %v", err)
	}
	up := newUpstream(t)
	a, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "REDIS_URL="+srv.URL())
	c := newClient(t)
	admin := "http://" + a.adminAddr.String()
	body := waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
	if !strings.Contains(body, "warning") || !strings.Contains(body, "allkeys-lru") {
		t.Errorf("/readyz body: got %q, want a warning naming allkeys-lru", body)
	}
	if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, "\nidemproxy_store_unsafe 1\n") {
		t.Errorf("/metrics: want idemproxy_store_unsafe 1; got:\n%v", grepLines(m, "idemproxy_store_unsafe"))
	}
	if !strings.Contains(logs.String(), "allkeys-lru") {
		t.Errorf("log: got %q, want a warning naming allkeys-lru", logs.String())
	}
}
