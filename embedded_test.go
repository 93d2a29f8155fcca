package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestEmbeddedRedisRequiresPassword: a local process that finds the embedded
// Redis's port cannot read or forge records: without the password the proxy
// drew at start, every command is refused. The proxy's own client works,
// the address is not logged, and the "embedded" warning is logged once.
func TestEmbeddedRedisRequiresPassword(t *testing.T) {
	up := newUpstream(t)
	a, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	if a.store.embedded == nil {
		t.Fatal("REDIS_URL empty: want the embedded Redis")
	}
	addr := a.store.embedded.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	intruder := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = intruder.Close() })
	err := intruder.Set(ctx, "idem:forged", "x", 0).Err()
	if err == nil || !strings.Contains(strings.ToUpper(err.Error()), "NOAUTH") {
		t.Errorf("SET without the password: got %v, want a NOAUTH error", err)
	}
	if err := intruder.Do(ctx, "AUTH", "guess").Err(); err == nil {
		t.Errorf("AUTH with a wrong password: got nil, want an error")
	}
	if _, err := intruder.Keys(ctx, "*").Result(); err == nil {
		t.Errorf("KEYS without the password: got nil error, want one")
	}
	if err := a.store.client.Ping(ctx).Err(); err != nil {
		t.Errorf("the proxy's own client: PING %v, want PONG", err)
	}
	c := newClient(t)
	if r := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/orders", "emb-1", `{"n":1}`); r.status != 201 {
		t.Errorf("POST through the proxy: got %v %q, want 201", r.status, r.body)
	}

	_, port, _ := strings.Cut(addr, ":")
	if got := logs.String(); strings.Contains(got, addr) || strings.Contains(got, ":"+port+`"`) {
		t.Errorf("log shows the embedded Redis's address %s:\n%s", addr, got)
	}
	if n := strings.Count(logs.String(), "embedded in-process Redis"); n != 1 {
		t.Errorf("embedded-Redis warning logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestEmbeddedRedisPasswordPerStart: two stores draw different passwords,
// so one's password opens nothing of the other's.
func TestEmbeddedRedisPasswordPerStart(t *testing.T) {
	var pw []string
	for range 2 {
		st, err := openRedis(&Config{RedisMode: "standalone"}, zerolog.Nop(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.close)
		p := st.client.(*redis.Client).Options().Password
		if len(p) < 32 {
			t.Fatalf("embedded Redis password %q: want at least 32 characters", p)
		}
		pw = append(pw, p)
	}
	if pw[0] == pw[1] {
		t.Errorf("two starts drew the same password")
	}
}

// The embedded miniredis never expires keys unless its clock is advanced:
// a record must stop replaying after TTL, as with a real Redis.
func TestEmbeddedRedisExpiresRecords(t *testing.T) {
	const ttl = 2 * time.Second
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=",
		"LOCK_TTL=1s", "UPSTREAM_TIMEOUT=500ms", "TTL="+ttl.String())
	c := newClient(t)
	u := "http://" + a.proxyAddr.String() + "/v1/orders"

	first := mustPost(t, c, u, "ttl-1", `{"n":1}`)
	completed := time.Now()
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: got %v, want %v", first.status, http.StatusCreated)
	}
	if r := mustPost(t, c, u, "ttl-1", `{"n":1}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat POST: got status %v replayed=%q, want a replay", r.status, r.header.Get("Idempotent-Replayed"))
	}
	testutil.Eventually(t, 5*time.Second, "a POST after the TTL executes again (201, not replayed)", func() bool {
		r := mustPost(t, c, u, "ttl-1", `{"n":1}`)
		return r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == ""
	})
	if got := time.Since(completed); got < ttl-300*time.Millisecond {
		t.Errorf("record expired after %v, want about %v", got, ttl)
	}
	if got := up.Calls.Load(); got != 2 {
		t.Errorf("upstream calls: got %v, want 2", got)
	}
}
