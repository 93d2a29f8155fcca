package main

// Tests of redis.go and redislog.go: the go-redis client each REDIS_MODE
// gets (read timeouts, pipelining, a breaker per server), the embedded
// Redis, the settings read from Redis, and go-redis's own log lines.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"regexp"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestScripterChoice: automatic pipelining only where it is safe: not
// with WAIT (it must follow the script on its connection), not on Cluster
// (one slow master would stall every shard's batch), not when switched off.
func TestScripterChoice(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = plain.Close(); _ = cluster.Close() })
	tests := []struct {
		name     string
		client   redis.UniversalClient
		cfg      Config
		wantAuto bool
	}{
		{"standalone, default", plain, Config{RedisAutoPipeline: true}, true},
		{"switched off", plain, Config{RedisAutoPipeline: false}, false},
		{"with WAIT", plain, Config{RedisAutoPipeline: true, RedisWaitReplicas: 1}, false},
		{"cluster", cluster, Config{RedisAutoPipeline: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := (&store{client: tt.client}).scripter(&tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			ap, auto := got.(*redis.AutoPipeliner)
			if auto != tt.wantAuto {
				t.Errorf("got %T, want automatic pipelining %v", got, tt.wantAuto)
			}
			// go-redis pools 100-command queue slices; a larger batch size
			// allocates a new one per flush (4.8 KB of garbage each).
			if auto && ap.Config().MaxBatchSize > 100 {
				t.Errorf("MaxBatchSize %d, want at most 100", ap.Config().MaxBatchSize)
			}
		})
	}
}

// TestStartWarnsOnEvictionPolicy: a Redis that may evict records
// (maxmemory-policy other than noeviction) is named in the /readyz body and
// the log, and idemproxy_store_unsafe is 1.
func TestStartWarnsOnEvictionPolicy(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Client().ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy: %v", err)
	}
	up := newUpstream(t)
	a, logs := startProxy(t, up.URL, "REDIS_URL="+srv.URL())
	c := newClient(t)
	admin := adminURL(a, "")
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

// TestStoreOutageFailsFast: with Redis stalled (a partition: connections
// stay open, nothing answers), the first keyed requests wait one Redis read
// timeout and are then answered per FAIL_MODE (forwarded with open, 503
// with closed); from then on keyed requests are answered at once, without
// asking Redis, until it answers a probe, and then claimed again. Before,
// each request waited out its own read timeouts behind the autopipeliner's
// one batch stream: 15 to 40 seconds for a forward or a 503.
func TestStoreOutageFailsFast(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			a, logs := startProxy(t, up.URL, "REDIS_URL="+srv.URL()+"?read_timeout=300ms", "FAIL_MODE="+mode)
			c := newClient(t)
			url := proxyURL(a, "/v1/orders")
			want := http.StatusCreated
			if mode == "closed" {
				want = http.StatusServiceUnavailable
			}
			mustPost(t, c, url, "before", "{}")

			srv.Pause()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r := post(c, url, fmt.Sprint("first-", i), "{}"); r.status != want {
						t.Errorf("first requests of the outage: %d, want %d", r.status, want)
					}
				}()
			}
			wg.Wait()
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the first requests of the outage took %v, want about the read timeout (300ms)", took)
			}
			for i := range 5 {
				start := time.Now()
				if r := post(c, url, fmt.Sprint("later-", i), "{}"); r.status != want {
					t.Errorf("request during the outage: %d, want %d", r.status, want)
				}
				if took := time.Since(start); took > 100*time.Millisecond {
					t.Errorf("request %d during the outage took %v, want at once", i, took)
				}
			}
			if got := metric(t, c, a, "idemproxy_redis_unreachable"); got != 1 {
				t.Errorf("idemproxy_redis_unreachable = %v during the outage, want 1", got)
			}

			srv.Resume()
			testutil.Eventually(t, 5*time.Second, "keyed requests are claimed again", func() bool {
				return post(c, url, "after", "{}").status == http.StatusCreated &&
					post(c, url, "after", "{}").header.Get("Idempotent-Replayed") == "true"
			})
			if got := metric(t, c, a, "idemproxy_redis_unreachable"); got != 0 {
				t.Errorf("idemproxy_redis_unreachable = %v after the outage, want 0", got)
			}
			if !strings.Contains(logs.String(), "Redis unreachable: keyed requests get 503") || !strings.Contains(logs.String(), "Redis answers again") {
				t.Errorf("the outage's start and end are not logged:\n%s", logs)
			}
		})
	}
}

// TestWaitTimeoutAboveReadTimeout: with REDIS_WAIT_REPLICAS and a
// REDIS_WAIT_TIMEOUT above go-redis's default read timeout (5s), a claim that
// no replica acknowledges is ErrNotReplicated, not an i/o timeout: the
// client's read timeout is raised above the WAIT. Real redis-server, no
// replica.
func TestWaitTimeoutAboveReadTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const wait = 5500 * time.Millisecond
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=" + srv.URL(),
		"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=" + wait.String(), "SHUTDOWN_TIMEOUT=75s"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := openRedis(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.close)
	scripter, err := st.scripter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := claim.NewStore(scripter, cfg.KeyPrefix, nil, claim.WaitReplicas(cfg.RedisWaitReplicas, cfg.RedisWaitTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	begun := time.Now()
	lease, rec, err := s.Acquire(ctx, claim.NewKey([]string{""}, "wait-1"), claim.Fingerprint{1}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	took := time.Since(begun)
	if lease != nil || rec != nil || !errors.Is(err, claim.ErrNotReplicated) {
		t.Fatalf("claim with no replica and REDIS_WAIT_TIMEOUT=%v: got lease %v record %v err %v after %v; want ErrNotReplicated", wait, lease, rec, err, took)
	}
	if took < wait-200*time.Millisecond {
		t.Errorf("claim answered after %v, want about REDIS_WAIT_TIMEOUT=%v (WAIT ran its course)", took, wait)
	}
}

// TestWaitReadTimeoutOptions: the read timeout each client gets.
func TestWaitReadTimeoutOptions(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9"
	open := func(env ...string) redis.UniversalClient {
		t.Helper()
		// SHUTDOWN_TIMEOUT covers the claim's WAIT of 8s.
		cfg, err := loadConfig(append([]string{up, "SHUTDOWN_TIMEOUT=75s"}, env...))
		if err != nil {
			t.Fatal(err)
		}
		st, err := openRedis(cfg, zerolog.Nop(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.close)
		return st.client
	}
	readTimeout := func(c redis.UniversalClient) time.Duration {
		switch c := c.(type) {
		case *redis.Client:
			return c.Options().ReadTimeout
		case *redis.ClusterClient:
			return c.Options().ReadTimeout
		}
		t.Fatalf("client %T", c)
		return 0
	}
	tests := []struct {
		name string
		env  []string
		want time.Duration
	}{
		{"standalone without WAIT", []string{"REDIS_URL=redis://127.0.0.1:1/0"}, 5 * time.Second},
		{"standalone, WAIT 8s", []string{"REDIS_URL=redis://127.0.0.1:1/0", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
		{"standalone, WAIT 1s", []string{"REDIS_URL=redis://127.0.0.1:1/0", "REDIS_WAIT_REPLICAS=1"}, 5 * time.Second},
		{"standalone, explicit read_timeout kept", []string{"REDIS_URL=redis://127.0.0.1:1/0?read_timeout=20s", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 20 * time.Second},
		{"sentinel, WAIT 8s", []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:1", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
		{"cluster, WAIT 8s", []string{"REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:1", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := readTimeout(open(tt.env...)); got != tt.want {
				t.Errorf("read timeout: got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestEmbeddedRedisRequiresPassword: a local process that finds the embedded
// Redis's port cannot read or forge records: without the password the proxy
// drew at start, every command is refused. The proxy's own client works,
// the address is not logged, and the "embedded" warning is logged once.
func TestEmbeddedRedisRequiresPassword(t *testing.T) {
	up := newUpstream(t)
	a, logs := startProxy(t, up.URL)
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
	if r := mustPost(t, c, proxyURL(a, "/v1/orders"), "emb-1", `{"n":1}`); r.status != 201 {
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

// TestEmbeddedRedisExpiresRecords: the embedded miniredis never expires keys
// unless its clock is advanced: a record must stop replaying after TTL, as
// with a real Redis.
func TestEmbeddedRedisExpiresRecords(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	up := newUpstream(t)
	a, _ := startProxy(t, up.URL, "LOCK_TTL=1s", "UPSTREAM_TIMEOUT=500ms", "TTL="+ttl.String(), "ADMIN_ADDR=")
	c := newClient(t)
	u := proxyURL(a, "/v1/orders")

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

// TestRedisLibraryLogsAsJSON: with Redis unreachable, go-redis's own log
// lines come out through the proxy's logger as JSON, not as plain text.
func TestRedisLibraryLogsAsJSON(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) // nothing listens there
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=redis://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	st, err := openRedis(cfg, newLogger(cfg, logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := st.client.Ping(ctx).Err(); err == nil {
		t.Fatalf("PING %s answered; want it unreachable", addr)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if entry["component"] == "go-redis" && strings.Contains(entry["message"].(string), addr) {
			found = true
		}
	}
	if !found {
		t.Errorf("no go-redis line naming %s in the log:\n%s", addr, logs)
	}
}

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
