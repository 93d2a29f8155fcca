package main

import (
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestFailOpenDoesNotReexecuteAfterOneKilledRedisConnection: with
// FAIL_MODE=open, Redis closing one of the proxy's connections under a
// command (CLIENT KILL: Sentinel sends CLIENT KILL TYPE normal to every
// instance it reconfigures; client-output-buffer limits; an operator) while
// it goes on answering must not let a retry of a completed request reach
// the upstream again. FAIL_MODE=open forwards without guarantee only while
// Redis is unreachable; here it never was (go-redis's own retry on a new
// connection succeeds), so the retry is a replay and the upstream runs the
// order once.
func TestFailOpenDoesNotReexecuteAfterOneKilledRedisConnection(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(),
		"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "FAIL_MODE=open")
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	if r := mustPost(t, c, url, "order-1", `{}`); r.status != http.StatusCreated {
		t.Fatalf("first request: %d", r.status)
	}

	// Another keyed request is in flight when Redis kills the proxy's
	// connections; Redis itself never stops answering.
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan response, 1)
	go func() { done <- post(c, url, "order-2", `{}`) }()
	pending := regexp.MustCompile(`qbuf=[1-9]`)
	testutil.Eventually(t, 2*time.Second, "a claim waits in CLIENT PAUSE", func() bool {
		list, err := admin.ClientList(ctx).Result()
		return err == nil && pending.MatchString(list)
	})
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	<-done

	r := mustPost(t, c, url, "order-1", `{}`)
	if n := up.KeyCalls("order-1"); n != 1 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of a completed order after one killed Redis connection (Redis answering): status %d, Idempotent-Replayed %q, upstream executed it %d times, want a replay and 1",
			r.status, r.header.Get("Idempotent-Replayed"), n)
	}
}
