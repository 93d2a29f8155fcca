package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// ---------------------------------------------------------------------------
// Configuration

// goFieldNames returns a pattern per exported Config field whose name differs
// from its variable: an operator must never see "LockTTL" in a message.
func goFieldNames(t *testing.T) map[string]*regexp.Regexp {
	t.Helper()
	out := map[string]*regexp.Regexp{}
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == f.Name {
			continue // TTL: the field and the variable share the name
		}
		out[f.Name] = regexp.MustCompile(`\b` + regexp.QuoteMeta(f.Name) + `\b`)
	}
	return out
}

func TestLoadConfigErrors(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	tests := []struct {
		name    string
		env     []string
		want    []string // substrings of the error
		notWant []string // substrings that must not appear
	}{
		{
			name: "malformed duration", env: []string{up, "LOCK_TTL=abc"},
			want: []string{`LOCK_TTL="abc"`},
			// A value the operator never wrote must not be quoted back.
			notWant: []string{`LOCK_TTL="0s"`},
		},
		{name: "negative duration", env: []string{up, "TTL=-1h"}, want: []string{`TTL="-1h`}},
		{name: "zero duration", env: []string{up, "SHUTDOWN_TIMEOUT=0s"}, want: []string{`SHUTDOWN_TIMEOUT="0s"`}},
		{name: "negative wait", env: []string{up, "WAIT_TIMEOUT=-1s"}, want: []string{`WAIT_TIMEOUT="-1s"`}},
		{
			name: "malformed int", env: []string{up, "MAX_KEY_LENGTH=x"},
			want:    []string{`MAX_KEY_LENGTH="x"`},
			notWant: []string{`MAX_KEY_LENGTH="0"`},
		},
		{name: "malformed int64", env: []string{up, "MAX_BODY_BYTES=1e3"}, want: []string{`MAX_BODY_BYTES="1e3"`}},
		{name: "malformed bool", env: []string{up, "REQUIRE_KEY=maybe"}, want: []string{`REQUIRE_KEY="maybe"`}},
		{name: "FAIL_MODE enum", env: []string{up, "FAIL_MODE=sideways"}, want: []string{`FAIL_MODE="sideways"`}},
		{name: "ON_5XX enum", env: []string{up, "ON_5XX=retry"}, want: []string{`ON_5XX="retry"`}},
		{name: "REDIS_MODE enum", env: []string{up, "REDIS_MODE=replica"}, want: []string{`REDIS_MODE="replica"`}},
		{name: "LOG_FORMAT enum", env: []string{up, "LOG_FORMAT=xml"}, want: []string{`LOG_FORMAT="xml"`}},
		{name: "LOG_LEVEL enum", env: []string{up, "LOG_LEVEL=loud"}, want: []string{`LOG_LEVEL="loud"`}},
		{name: "UPSTREAM_URL missing", env: []string{"LISTEN_ADDR=127.0.0.1:0"}, want: []string{"UPSTREAM_URL"}},
		{name: "UPSTREAM_URL empty", env: []string{"UPSTREAM_URL="}, want: []string{"UPSTREAM_URL"}},
		{name: "UPSTREAM_URL scheme", env: []string{"UPSTREAM_URL=ftp://127.0.0.1:21"}, want: []string{`UPSTREAM_URL="ftp://127.0.0.1:21"`, "scheme"}},
		{name: "UPSTREAM_URL no host", env: []string{"UPSTREAM_URL=http://"}, want: []string{`UPSTREAM_URL="http://"`}},
		{
			name: "UPSTREAM_TIMEOUT not below LOCK_TTL", env: []string{up, "UPSTREAM_TIMEOUT=45s", "LOCK_TTL=30s"},
			want: []string{`UPSTREAM_TIMEOUT="45s"`, `LOCK_TTL="30s"`},
		},
		{
			name: "UPSTREAM_TIMEOUT equal to LOCK_TTL", env: []string{up, "UPSTREAM_TIMEOUT=30s", "LOCK_TTL=30s"},
			want: []string{`UPSTREAM_TIMEOUT="30s"`, `LOCK_TTL="30s"`},
		},
		{
			name: "route lock below UPSTREAM_TIMEOUT", env: []string{up, "ROUTES=POST /v1/payments/* lock=10s"},
			want: []string{`ROUTES rule "POST /v1/payments/* lock=10s"`, "UPSTREAM_TIMEOUT"},
		},
		{
			name: "SHUTDOWN_TIMEOUT cannot cover UPSTREAM_TIMEOUT and recording", env: []string{up, "SHUTDOWN_TIMEOUT=30s", "UPSTREAM_TIMEOUT=30s"},
			want: []string{`SHUTDOWN_TIMEOUT="30s"`, `UPSTREAM_TIMEOUT="30s"`, "record", "40s"},
		},
		{
			name: "SHUTDOWN_TIMEOUT below the default UPSTREAM_TIMEOUT and recording", env: []string{up, "SHUTDOWN_TIMEOUT=39s"},
			want: []string{`SHUTDOWN_TIMEOUT="39s"`, `UPSTREAM_TIMEOUT="30s"`},
		},
		{name: "route unknown option", env: []string{up, "ROUTES=POST /v1/orders bogus"}, want: []string{`ROUTES rule "POST /v1/orders bogus"`}},
		{name: "route lower-case method", env: []string{up, "ROUTES=post /v1/orders"}, want: []string{`ROUTES rule "post /v1/orders"`}},
		{name: "route without pattern", env: []string{up, "ROUTES=POST"}, want: []string{`ROUTES rule "POST"`}},
		{name: "route pattern without slash", env: []string{up, "ROUTES=POST v1/orders"}, want: []string{`ROUTES rule "POST v1/orders"`}},
		{name: "route bad duration", env: []string{up, "ROUTES=POST /v1/orders ttl=soon"}, want: []string{`ROUTES rule "POST /v1/orders ttl=soon"`}},
		{name: "route bad fail", env: []string{up, "ROUTES=POST /v1/orders fail=maybe"}, want: []string{`ROUTES rule "POST /v1/orders fail=maybe"`}},
		{
			name: "route bad rule among good ones",
			env:  []string{up, "ROUTES=POST /v1/orders ttl=1h; POST /v1/webhooks/* off ttl=1h"},
			want: []string{`ROUTES rule "POST /v1/webhooks/* off ttl=1h"`},
		},
		{name: "sentinel without REDIS_ADDRS", env: []string{up, "REDIS_MODE=sentinel"}, want: []string{"REDIS_ADDRS", "sentinel"}},
		{name: "cluster without REDIS_ADDRS", env: []string{up, "REDIS_MODE=cluster"}, want: []string{"REDIS_ADDRS", "cluster"}},
		{name: "REDIS_ADDRS in standalone", env: []string{up, "REDIS_ADDRS=127.0.0.1:7000"}, want: []string{`REDIS_ADDRS="127.0.0.1:7000"`, "standalone"}},
		{
			name: "several problems at once",
			env:  []string{"LOCK_TTL=abc", "REQUIRE_KEY=maybe", "FAIL_MODE=sideways", "ROUTES=POST /v1/orders bogus", "REDIS_MODE=cluster"},
			want: []string{"UPSTREAM_URL", `LOCK_TTL="abc"`, `REQUIRE_KEY="maybe"`, `FAIL_MODE="sideways"`,
				`ROUTES rule "POST /v1/orders bogus"`, "REDIS_ADDRS"},
		},
	}
	fields := goFieldNames(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) = %+v, nil; want an error", tt.env, cfg)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not contain %s:\ngot %v", w, msg)
				}
			}
			for _, nw := range tt.notWant {
				if strings.Contains(msg, nw) {
					t.Errorf("error contains %s, a value not in the environment %q:\ngot %v", nw, tt.env, msg)
				}
			}
			for name, re := range fields {
				if re.MatchString(msg) {
					t.Errorf("error names the Go field %s instead of its variable:\ngot %v", name, msg)
				}
			}
		})
	}
}

func TestLoadConfigNeverShowsRedisPassword(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	const secret = "s3cretPW"
	tests := []struct {
		name string
		env  []string
	}{
		{"bad database", []string{up, "REDIS_URL=redis://user:" + secret + "@127.0.0.1:6379/abc"}},
		{"unknown option", []string{up, "REDIS_URL=redis://:" + secret + "@127.0.0.1:6379/0?bogus=1"}},
		{"bad scheme", []string{up, "REDIS_URL=http://user:" + secret + "@127.0.0.1:6379/0"}},
		{"unparseable port", []string{up, "REDIS_URL=redis://:" + secret + "@127.0.0.1:bad/0"}},
		{"bad escape", []string{up, "REDIS_URL=redis://user:" + secret + "%zz@127.0.0.1:6379/0"}},
		{"URL in sentinel mode", []string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_URL=redis://user:" + secret + "@127.0.0.1:6379/0"}},
		{"unparseable URL in cluster mode", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_URL=redis://:" + secret + "@127.0.0.1:bad/0"}},
		{"slash in password", []string{up, "REDIS_URL=redis://default:8842/" + secret + "@redis:6379/0"}},
		{"slash in password, port-like", []string{up, "REDIS_URL=redis://default:s3cr/etPW" + secret + "@redis:6379/0"}},
		{"hash in password", []string{up, "REDIS_URL=redis://default:ab#" + secret + "@redis:6379/0"}},
		{"question mark in password", []string{up, "REDIS_URL=redis://default:ab?" + secret + "@redis:6379/0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) = nil error; want one naming REDIS_URL", tt.env)
			}
			if got := err.Error(); strings.Contains(got, secret) {
				t.Errorf("error shows the Redis password:\ngot %v", got)
			}
			if got := err.Error(); !strings.Contains(got, "REDIS_URL") {
				t.Errorf("error does not name REDIS_URL:\ngot %v", got)
			}
		})
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000"})
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"LISTEN_ADDR", cfg.ListenAddr, ":8080"},
		{"ADMIN_ADDR", cfg.AdminAddr, ":9090"},
		{"REDIS_URL", cfg.RedisURL, ""},
		{"REDIS_MODE", cfg.RedisMode, "standalone"},
		{"REDIS_ADDRS", len(cfg.RedisAddrs), 0},
		{"REDIS_MASTER_NAME", cfg.RedisMasterName, "mymaster"},
		{"REDIS_USERNAME", cfg.RedisUsername, ""},
		{"REDIS_PASSWORD", cfg.RedisPassword, ""},
		{"REDIS_TLS", cfg.RedisTLS, false},
		{"REDIS_WAIT_REPLICAS", cfg.RedisWaitReplicas, 0},
		{"REDIS_WAIT_TIMEOUT", cfg.RedisWaitTimeout, time.Second},
		{"REDIS_AUTOPIPELINE", cfg.RedisAutoPipeline, true},
		{"REPLAY_CACHE_BYTES", cfg.ReplayCacheBytes, 16 << 20},
		{"KEY_PREFIX", cfg.KeyPrefix, "idem:"},
		{"IDEMPOTENCY_HEADER", cfg.IdempotencyHeader, "Idempotency-Key"},
		{"METHODS", cfg.Methods, []string{"POST"}},
		{"TTL", cfg.TTL, 24 * time.Hour},
		{"LOCK_TTL", cfg.LockTTL, 60 * time.Second},
		{"UPSTREAM_TIMEOUT", cfg.UpstreamTimeout, 30 * time.Second},
		{"REQUIRE_KEY", cfg.RequireKey, false},
		{"MAX_KEY_LENGTH", cfg.MaxKeyLength, 255},
		{"MAX_BODY_BYTES", cfg.MaxBodyBytes, int64(1048576)},
		{"MAX_STORED_RESPONSE_BYTES", cfg.MaxStoredResponseBytes, int64(1048576)},
		{"SCOPE_HEADERS", cfg.ScopeHeaders, []string{"Authorization"}},
		{"FAIL_MODE", cfg.FailMode, "closed"},
		{"WAIT_TIMEOUT", cfg.WaitTimeout, time.Duration(0)},
		{"ON_5XX", cfg.On5xx, "release"},
		{"ROUTES", cfg.Routes, ""},
		{"ROUTES parsed", len(cfg.routes), 0},
		{"LOG_LEVEL", cfg.LogLevel, "info"},
		{"LOG_LEVEL parsed", cfg.level, zerolog.InfoLevel},
		{"LOG_FORMAT", cfg.LogFormat, "json"},
		{"SHUTDOWN_TIMEOUT", cfg.ShutdownTimeout, 60 * time.Second},
		{"UPSTREAM_URL parsed", cfg.upstream.String(), "http://127.0.0.1:9000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestAdminAddrSetButEmptyDisablesAdmin(t *testing.T) {
	tests := []struct {
		name      string
		env       []string
		wantAddr  string
		wantAdmin bool
	}{
		{"unset", []string{"ADMIN_ADDR_UNRELATED=1"}, ":9090", true},
		{"set but empty", []string{"ADMIN_ADDR="}, "", false},
		{"blank", []string{"ADMIN_ADDR=  "}, "", false},
		{"loopback", []string{"ADMIN_ADDR=127.0.0.1:0"}, "127.0.0.1:0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR=127.0.0.1:0"}, tt.env...)
			cfg, err := loadConfig(env)
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			if got := cfg.AdminAddr; got != tt.wantAddr {
				t.Errorf("AdminAddr: got %q, want %q", got, tt.wantAddr)
			}
			if tt.wantAddr == ":9090" {
				return // do not bind a fixed port in a test
			}
			a := startApp(t, cfg)
			if got := a.adminAddr != nil; got != tt.wantAdmin {
				t.Errorf("admin listener: got %v (%v), want %v", got, a.adminAddr, tt.wantAdmin)
			}
			if a.proxyAddr == nil {
				t.Errorf("proxyAddr: got nil, want a bound address")
			}
		})
	}
}

// ---------------------------------------------------------------------------
// run

func TestRunVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	// No UPSTREAM_URL: --version must not need a configuration.
	err := run(context.Background(), []string{"idemproxy", "--version"}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run --version: got %v, want nil", err)
	}
	if got, want := stdout.String(), "idemproxy "+version; !strings.HasPrefix(got, want) {
		t.Errorf("stdout: got %q, want prefix %q", got, want)
	}
}

func TestRunBadConfigStartsNothing(t *testing.T) {
	listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR=" + listen, "ADMIN_ADDR=" + admin, "LOCK_TTL=abc"}
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), []string{"idemproxy"}, env, &stdout, &stderr) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("run with a bad config did not return within 10s: it must refuse to start")
	}
	if err == nil {
		t.Fatalf("run: got nil error, want one naming LOCK_TTL")
	}
	if got, want := err.Error(), `LOCK_TTL="abc"`; !strings.Contains(got, want) {
		t.Errorf("run error: got %v, want it to contain %s", got, want)
	}
	if got := stdout.String(); got != "" {
		t.Errorf("stdout: got %q, want nothing (no logger, nothing started)", got)
	}
	for _, addr := range []string{listen, admin} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("something listens on %s after a refused start", addr)
		}
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	up := newUpstream(t)
	listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	env := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=" + listen, "ADMIN_ADDR=" + admin, "UPSTREAM_TIMEOUT=5s", "SHUTDOWN_TIMEOUT=15s"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"idemproxy"}, env, &stdout, &stderr) }()
	c := newClient(t)
	waitStatus(t, c, "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)
	if r := mustPost(t, c, "http://"+listen+"/v1/orders", "run-1", `{"n":1}`); r.status != http.StatusCreated {
		t.Errorf("POST: got %v, want %v", r.status, http.StatusCreated)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel: got %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not return within 10s of ctx cancel")
	}
	if !strings.Contains(stdout.String(), "idemproxy started") {
		t.Errorf("log: got %q, want a start line", stdout.String())
	}
}

// ---------------------------------------------------------------------------
// End to end through start()

func TestStartEndToEnd(t *testing.T) {
	tests := []struct {
		name        string
		realRedis   bool
		wantWarning string // "" means no warning line at all
		wantUnsafe  string
	}{
		{name: "embedded miniredis", wantWarning: "embedded", wantUnsafe: "idemproxy_store_unsafe 1"},
		{name: "redis-server", realRedis: true, wantUnsafe: "idemproxy_store_unsafe 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			env := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0"}
			var srv *redistest.Server
			if tt.realRedis {
				srv = redistest.Start(t)
				env = append(env, "REDIS_URL="+srv.URL())
			}
			a, logs := startEnv(t, env...)
			c := newClient(t)
			admin := "http://" + a.adminAddr.String()
			proxyURL := "http://" + a.proxyAddr.String() + "/v1/orders"

			body := waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
			switch {
			case tt.wantWarning == "" && strings.Contains(body, "warning"):
				t.Errorf("/readyz body: got %q, want no warning", body)
			case tt.wantWarning != "" && !(strings.Contains(body, "warning") && strings.Contains(body, tt.wantWarning)):
				t.Errorf("/readyz body: got %q, want a warning about %q", body, tt.wantWarning)
			}
			if tt.wantWarning != "" && !strings.Contains(logs.String(), tt.wantWarning) {
				t.Errorf("log: got %q, want a warning about %q", logs.String(), tt.wantWarning)
			}
			if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, "\n"+tt.wantUnsafe+"\n") {
				t.Errorf("/metrics: want line %q; got:\n%v", tt.wantUnsafe, grepLines(m, "idemproxy_store_unsafe"))
			}
			if got := getStatus(t, c, admin+"/healthz"); got != http.StatusOK {
				t.Errorf("/healthz: got %v, want %v", got, http.StatusOK)
			}

			first := mustPost(t, c, proxyURL, "e2e-1", `{"amount":42}`)
			if first.status != http.StatusCreated {
				t.Fatalf("first POST: got %v, want %v (body %q)", first.status, http.StatusCreated, first.body)
			}
			if got := first.header.Get("Idempotent-Replayed"); got != "" {
				t.Errorf("first POST Idempotent-Replayed: got %q, want none", got)
			}
			second := mustPost(t, c, proxyURL, "e2e-1", `{"amount":42}`)
			if second.status != http.StatusCreated {
				t.Errorf("repeat POST: got %v, want %v", second.status, http.StatusCreated)
			}
			if got := second.header.Get("Idempotent-Replayed"); got != "true" {
				t.Errorf("repeat POST Idempotent-Replayed: got %q, want %q", got, "true")
			}
			if second.body != first.body {
				t.Errorf("replayed body: got %q, want %q", second.body, first.body)
			}
			if got, want := second.header.Get("Location"), first.header.Get("Location"); got != want {
				t.Errorf("replayed Location: got %q, want %q", got, want)
			}
			if got := up.calls.Load(); got != 1 {
				t.Errorf("upstream calls: got %v, want 1", got)
			}
			const replayed = `idemproxy_requests_total{outcome="replayed",route="default"} 1`
			if m := getBody(t, c, admin+"/metrics"); !strings.Contains(m, replayed+"\n") {
				t.Errorf("/metrics: want %q; got:\n%v", replayed, grepLines(m, "idemproxy_requests_total"))
			}
			if srv == nil {
				return
			}

			// Redis goes away: not ready, and keyed requests fail closed.
			srv.Kill()
			waitStatus(t, c, admin+"/readyz", http.StatusServiceUnavailable, 10*time.Second)
			down := mustPost(t, c, proxyURL, "e2e-2", `{"amount":7}`)
			if down.status != http.StatusServiceUnavailable {
				t.Errorf("POST with Redis down: got %v, want %v", down.status, http.StatusServiceUnavailable)
			}
			checkProblem(t, down, http.StatusServiceUnavailable)
			if down.header.Get("Retry-After") == "" {
				t.Errorf("POST with Redis down: got no Retry-After, want one")
			}
			if got := up.calls.Load(); got != 1 {
				t.Errorf("upstream calls with Redis down: got %v, want 1", got)
			}

			// Redis comes back: the same proxy recovers by itself.
			srv.Restart()
			waitStatus(t, c, admin+"/readyz", http.StatusOK, 10*time.Second)
			var again response
			eventually(t, 10*time.Second, func() (bool, string) {
				again = mustPost(t, c, proxyURL, "e2e-3", `{"amount":8}`)
				return again.status == http.StatusCreated && again.header.Get("Idempotent-Replayed") == "",
					fmt.Sprintf("POST after Redis restart: got %v %q", again.status, again.body)
			})
			replay := mustPost(t, c, proxyURL, "e2e-3", `{"amount":8}`)
			if got := replay.header.Get("Idempotent-Replayed"); got != "true" || replay.body != again.body {
				t.Errorf("repeat after restart: got replayed=%q body %q, want replayed=true body %q", got, replay.body, again.body)
			}
			if got := up.calls.Load(); got != 2 {
				t.Errorf("upstream calls after restart: got %v, want 2", got)
			}
		})
	}
}

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
	eventually(t, 5*time.Second, func() (bool, string) {
		r := mustPost(t, c, u, "ttl-1", `{"n":1}`)
		return r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "",
			fmt.Sprintf("POST %v after the TTL: got %v replayed=%q, want a fresh execution",
				time.Since(completed).Round(time.Millisecond), r.status, r.header.Get("Idempotent-Replayed"))
	})
	if got := time.Since(completed); got < ttl-300*time.Millisecond {
		t.Errorf("record expired after %v, want about %v", got, ttl)
	}
	if got := up.calls.Load(); got != 2 {
		t.Errorf("upstream calls: got %v, want 2", got)
	}
}

// ---------------------------------------------------------------------------
// The real binary and signals

func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("SIGTERM finishes and records the in-flight request", func(t *testing.T) {
		srv := redistest.Start(t)
		up := newBlockingUpstream(t, 20*time.Second)
		listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		p := startBinary(t, bin, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(),
			"LISTEN_ADDR="+listen, "ADMIN_ADDR="+admin, "UPSTREAM_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=20s")
		c := newClient(t)
		waitStatus(t, c, "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)

		result := make(chan response, 1)
		go func() { result <- post(c, "http://"+listen+"/v1/payments", "sig-1", `{"amount":5}`) }()
		select {
		case <-up.received:
		case <-time.After(10 * time.Second):
			t.Fatalf("upstream did not receive the request within 10s")
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		eventually(t, 5*time.Second, func() (bool, string) {
			conn, err := net.DialTimeout("tcp", listen, 500*time.Millisecond)
			if err == nil {
				conn.Close()
				return false, "proxy still accepts connections after SIGTERM"
			}
			return errors.Is(err, syscall.ECONNREFUSED), fmt.Sprintf("dial after SIGTERM: got %v, want connection refused", err)
		})
		select {
		case <-p.done:
			t.Fatalf("process exited before its in-flight request finished (code %d)", p.cmd.ProcessState.ExitCode())
		default:
		}
		up.release()

		var r response
		select {
		case r = <-result:
		case <-time.After(10 * time.Second):
			t.Fatalf("in-flight request got no answer within 10s")
		}
		if r.err != nil || r.status != http.StatusCreated {
			t.Fatalf("in-flight POST: got %v %v %q, want %v", r.status, r.err, r.body, http.StatusCreated)
		}
		if got := p.wait(t, 10*time.Second); got != 0 {
			t.Errorf("exit code: got %v, want 0\nstderr: %s", got, p.stderr.String())
		}

		// A fresh proxy on the same Redis replays the recorded answer.
		a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
		again := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/payments", "sig-1", `{"amount":5}`)
		if got := again.header.Get("Idempotent-Replayed"); got != "true" {
			t.Errorf("retry on a new proxy: got status %v replayed=%q body %q, want a replay", again.status, got, again.body)
		}
		if again.status != r.status || again.body != r.body {
			t.Errorf("retry on a new proxy: got %v %q, want %v %q", again.status, again.body, r.status, r.body)
		}
		if got := up.calls.Load(); got != 1 {
			t.Errorf("upstream calls: got %v, want 1", got)
		}
	})

	t.Run("SHUTDOWN_TIMEOUT runs out", func(t *testing.T) {
		// SHUTDOWN_TIMEOUT must cover UPSTREAM_TIMEOUT plus 10s of
		// recording, so the smallest allowed value is 11s here. What outlives
		// it is a pass-through answer that keeps streaming: UPSTREAM_TIMEOUT
		// bounds the time to its headers, not a body that flows.
		up := newStreamingUpstream(t, 40*time.Second)
		listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		p := startBinary(t, bin, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR="+listen, "ADMIN_ADDR="+admin,
			"UPSTREAM_TIMEOUT=1s", "LOCK_TTL=10s", "SHUTDOWN_TIMEOUT=11s")
		c := newClient(t)
		waitStatus(t, c, "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)

		streamClient := &http.Client{Transport: c.Transport} // no client timeout: the stream is long
		res, err := streamClient.Get("http://" + listen + "/v1/events")
		if err != nil {
			t.Fatalf("GET stream: %v", err)
		}
		defer res.Body.Close()
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, res.Body); close(drained) }()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		signalled := time.Now()
		// The upstream streams for 40s: an exit around 11s proves the timeout.
		if got := p.wait(t, 25*time.Second); got == 0 {
			t.Errorf("exit code: got %v, want non-zero", got)
		}
		if took := time.Since(signalled); took < 10*time.Second {
			t.Errorf("exited %v after SIGTERM, want about SHUTDOWN_TIMEOUT=11s", took)
		}
		if got := p.stderr.String(); !strings.Contains(got, "SHUTDOWN_TIMEOUT") {
			t.Errorf("stderr: got %q, want it to name SHUTDOWN_TIMEOUT", got)
		}
		up.release()
		select { // the process is gone, so the stream ends
		case <-drained:
		case <-time.After(10 * time.Second):
			t.Errorf("stream still open 10s after the proxy exited")
		}
	})

	t.Run("malformed variable", func(t *testing.T) {
		tests := []struct {
			name string
			env  string
			want string
		}{
			{"duration", "LOCK_TTL=abc", `LOCK_TTL="abc"`},
			{"bool", "REQUIRE_KEY=maybe", `REQUIRE_KEY="maybe"`},
			{"enum", "FAIL_MODE=sideways", `FAIL_MODE="sideways"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
				p := startBinary(t, bin, "UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR="+listen, "ADMIN_ADDR=", tt.env)
				if got := p.wait(t, 10*time.Second); got == 0 {
					t.Errorf("exit code: got %v, want non-zero", got)
				}
				if got := p.stderr.String(); !strings.Contains(got, tt.want) {
					t.Errorf("stderr: got %q, want it to contain %s", got, tt.want)
				}
			})
		}
	})
}

// ---------------------------------------------------------------------------
// Helpers

// syncBuffer is a bytes.Buffer safe for the writers of several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// upstream is a legacy API that answers 201 with a body naming the call.
type upstream struct {
	*httptest.Server
	calls atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n)
	}))
	t.Cleanup(u.Close)
	return u
}

// blockingUpstream holds each request until release (or hold runs out, or
// its client leaves), then answers 201.
type blockingUpstream struct {
	*httptest.Server
	calls    atomic.Int64
	received chan struct{}
	released chan struct{}
	once     sync.Once
}

func (u *blockingUpstream) release() { u.once.Do(func() { close(u.released) }) }

func newBlockingUpstream(t *testing.T, hold time.Duration) *blockingUpstream {
	t.Helper()
	u := &blockingUpstream{received: make(chan struct{}, 1), released: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case u.received <- struct{}{}:
		default:
		}
		timer := time.NewTimer(hold)
		defer timer.Stop()
		select {
		case <-u.released:
		case <-timer.C:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.release) // runs first: lets Close return
	return u
}

// streamingUpstream answers every request 200 at once and then writes a
// line every 100ms until release, its client leaves, or hold runs out.
type streamingUpstream struct {
	*httptest.Server
	released chan struct{}
	once     sync.Once
}

func (u *streamingUpstream) release() { u.once.Do(func() { close(u.released) }) }

func newStreamingUpstream(t *testing.T, hold time.Duration) *streamingUpstream {
	t.Helper()
	u := &streamingUpstream{released: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		timer := time.NewTimer(hold)
		defer timer.Stop()
		for {
			select {
			case <-u.released:
				return
			case <-timer.C:
				return
			case <-r.Context().Done():
				return
			case <-tick.C:
				if _, err := io.WriteString(w, "data: tick\n\n"); err != nil {
					return
				}
				_ = rc.Flush()
			}
		}
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.release) // runs first: lets Close return
	return u
}

// startEnv loads env and starts the proxy; it is shut down when the test ends.
func startEnv(t *testing.T, env ...string) (*app, *syncBuffer) {
	t.Helper()
	cfg, err := loadConfig(env)
	if err != nil {
		t.Fatalf("loadConfig(%q): %v", env, err)
	}
	logs := &syncBuffer{}
	return startAppLog(t, cfg, logs), logs
}

func startApp(t *testing.T, cfg *Config) *app {
	t.Helper()
	return startAppLog(t, cfg, &syncBuffer{})
}

func startAppLog(t *testing.T, cfg *Config, logs *syncBuffer) *app {
	t.Helper()
	a, err := start(cfg, zerolog.New(logs).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := a.shutdown(5 * time.Second); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return a
}

func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type response struct {
	status int
	header http.Header
	body   string
	err    error
}

// post sends a keyed POST; safe to call from any goroutine.
func post(c *http.Client, url, key, body string) response {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

func mustPost(t *testing.T, c *http.Client, url, key, body string) response {
	t.Helper()
	r := post(c, url, key, body)
	if r.err != nil {
		t.Fatalf("POST %s (key %s): %v", url, key, r.err)
	}
	return r
}

func get(c *http.Client, url string) (int, string, error) {
	res, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

func getStatus(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	status, _, err := get(c, url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return status
}

func getBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	status, body, err := get(c, url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: got %v %v, want %v", url, status, err, http.StatusOK)
	}
	return body
}

// eventually polls cond every 25ms until it holds or timeout runs out.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, msg)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// waitStatus polls url until it answers want, and returns that body.
func waitStatus(t *testing.T, c *http.Client, url string, want int, timeout time.Duration) string {
	t.Helper()
	var body string
	eventually(t, timeout, func() (bool, string) {
		status, b, err := get(c, url)
		body = b
		return err == nil && status == want, fmt.Sprintf("GET %s: got %v %v %q, want %v", url, status, err, b, want)
	})
	return body
}

func checkProblem(t *testing.T, r response, status int) {
	t.Helper()
	if got := r.header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", got)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem: got %+v, want status %v and type, title, detail set", p, status)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// proc is an idemproxy process this test started.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
}

// startBinary runs bin with exactly env; it is killed when the test ends if
// it is still running.
func startBinary(t *testing.T, bin string, env ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill() // our own child, by its pid
			<-p.done
		}
		if t.Failed() {
			t.Logf("idemproxy stdout:\n%s\nstderr:\n%s", p.stdout.String(), p.stderr.String())
		}
	})
	return p
}

// wait returns the exit code, or fails the test if the process is still
// running after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("process %d still running after %v", p.cmd.Process.Pid, timeout)
		return -1
	}
}

func TestLoadConfigNeverShowsUpstreamPassword(t *testing.T) {
	const secret = "s3cretPW"
	for _, v := range []string{
		"http://user:" + secret + "@[bad/x",
		"ftp://user:" + secret + "@legacy:80",
		"http://user:ab/" + secret + "@legacy:80",
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=" + v})
		if err == nil {
			t.Errorf("UPSTREAM_URL=%q accepted", v)
			continue
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "UPSTREAM_URL") {
			t.Errorf("UPSTREAM_URL=%q: error %q shows the password or does not name the variable", v, err)
		}
	}
}

func TestLoadConfigNormalisesAndWarns(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "IDEMPOTENCY_HEADER=idempotency-key",
		"UPSTREAM_TIMEOUT=30s", "LOCK_TTL=32s", "ROUTES=POST /x lock=31s", "FAIL_MODE=open", "SCOPE_HEADERS="})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IdempotencyHeader != "Idempotency-Key" {
		t.Errorf("IDEMPOTENCY_HEADER = %q, want the canonical Idempotency-Key", cfg.IdempotencyHeader)
	}
	want := []string{"LOCK_TTL=32s leaves 2s", `ROUTES rule "POST /x lock=31s" leaves 1s`, "SCOPE_HEADERS is empty", "FAIL_MODE=open"}
	all := strings.Join(cfg.warnings, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("warnings %q lack %q", cfg.warnings, w)
		}
	}
	if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "KEY_PREFIX=idem:{x}:"}); err == nil || !strings.Contains(err.Error(), `KEY_PREFIX="idem:{x}:"`) {
		t.Errorf("KEY_PREFIX with a hash tag: error %v, want one naming it", err)
	}
	def, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000"})
	if err != nil || len(def.warnings) != 0 {
		t.Errorf("defaults: warnings %q, err %v; want none", def.warnings, err)
	}
}
