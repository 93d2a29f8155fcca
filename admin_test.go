package main

// Tests of admin.go: /readyz (its check of Redis, its cache and its log),
// the admin listener and what it exports.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestReadyzHidesRedisAddress: with Redis down, /readyz is 503 with a
// generic body; the dial error, which names Redis's address, is logged.
func TestReadyzHidesRedisAddress(t *testing.T) {
	port := strconv.Itoa(redistest.FreePort(t)) // nothing listens there
	up := newUpstream(t)
	a, logs := startProxy(t, up.URL, "REDIS_URL=redis://127.0.0.1:"+port+"/0")
	c := newClient(t)
	status, body, err := get(c, adminURL(a, "/readyz"))
	if err != nil || status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis down: got %v %v %q, want 503", status, err, body)
	}
	if body != "not ready: Redis unreachable\n" {
		t.Errorf("/readyz body: got %q, want %q", body, "not ready: Redis unreachable\n")
	}
	for _, leak := range []string{port, "127.0.0.1", "dial", "refused"} {
		if strings.Contains(body, leak) {
			t.Errorf("/readyz body %q shows %q", body, leak)
		}
	}
	if !strings.Contains(logs.String(), port) {
		t.Errorf("log lacks the cause (Redis's address); got:\n%s", logs.String())
	}
	if m := getBody(t, c, adminURL(a, "/metrics")); !strings.Contains(m, "\nidemproxy_ready 0\n") {
		t.Errorf("/metrics with Redis down: want idemproxy_ready 0; got:\n%v", grepLines(m, "idemproxy_ready"))
	}
}

// TestReadyzCachedAndLogRateLimited: within a second, /readyz reuses its
// result instead of pinging Redis again, concurrent probes share one PING,
// and an outage is logged when it starts, then at most every 10s, and its
// end once. The idemproxy_ready gauge follows every fresh check (0, 1, 0,
// 1, 0) and is left alone by cached answers, even when Redis has changed
// state meanwhile.
func TestReadyzCachedAndLogRateLimited(t *testing.T) {
	var pings atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	logs := &testutil.SyncBuffer{}
	rd := &readiness{
		store:  &store{embedded: new(miniredis.Miniredis)},
		logger: zerolog.New(logs),
		unsafe: prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"}),
		ready:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemproxy_ready"}),
		now:    now,
		ping: func(context.Context) error {
			pings.Add(1)
			if failing.Load() {
				return errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")
			}
			return nil
		},
	}
	gauge := prometheus.NewRegistry() // idemproxy_ready alone, to read it
	gauge.MustRegister(rd.ready)
	srv := httptest.NewServer(adminHandler(prometheus.NewRegistry(), rd))
	t.Cleanup(srv.Close)
	c := newClient(t)
	readyz := func() (int, string) {
		t.Helper()
		status, body, err := get(c, srv.URL+"/readyz")
		if err != nil {
			t.Fatalf("GET /readyz: %v", err)
		}
		return status, body
	}
	logged := func() int { return strings.Count(logs.String(), "not ready: Redis unreachable") }
	wantReady := func(when string, want float64) {
		t.Helper()
		mfs, err := gauge.Gather()
		if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
			t.Fatalf("gather idemproxy_ready: %v %v", mfs, err)
		}
		if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != want {
			t.Errorf("idemproxy_ready %s: got %v, want %v", when, got, want)
		}
	}

	wantReady("before the first check", 0)

	if s, b := readyz(); s != http.StatusServiceUnavailable || strings.Contains(b, "10.1.2.3") {
		t.Fatalf("/readyz: got %v %q, want 503 without the address", s, b)
	}
	wantReady("with Redis down", 0)
	advance(500 * time.Millisecond)
	readyz()
	if got := pings.Load(); got != 1 {
		t.Errorf("two /readyz within the cache window: %d pings, want 1", got)
	}
	// A burst of concurrent probes in one window: still one ping.
	advance(time.Second)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			res, err := c.Get(srv.URL + "/readyz")
			if err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	wg.Wait()
	if got := pings.Load(); got != 2 {
		t.Errorf("20 concurrent /readyz in a new window: %d pings in all, want 2", got)
	}
	if got := logged(); got != 1 {
		t.Errorf("outage logged %d times within 1.5s, want once", got)
	}
	if !strings.Contains(logs.String(), "10.1.2.3") {
		t.Errorf("log lacks the cause: %s", logs.String())
	}
	advance(10 * time.Second)
	readyz()
	if got := logged(); got != 2 {
		t.Errorf("outage logged %d times after 11.5s, want twice", got)
	}
	failing.Store(false)
	advance(2 * time.Second)
	if s, _ := readyz(); s != http.StatusOK {
		t.Errorf("/readyz after Redis is back: got %v, want 200", s)
	}
	if !strings.Contains(logs.String(), "Redis answers again") {
		t.Errorf("recovery not logged: %s", logs.String())
	}
	wantReady("after Redis is back", 1)
	failing.Store(true)
	advance(2 * time.Second)
	readyz()
	if got := logged(); got != 3 {
		t.Errorf("a new outage right after recovery: logged %d times in all, want 3", got)
	}
	wantReady("in a new outage", 0)

	// Cached answers do not touch the gauge: Redis comes back, but within
	// the window /readyz still answers the cached 503 and the gauge stays 0;
	// the next fresh check sets it to 1. Then the same the other way round.
	for _, step := range []struct {
		failing   bool
		status    int
		ready     float64
		fresh     bool
		advanceBy time.Duration
	}{
		{failing: false, advanceBy: 500 * time.Millisecond, status: http.StatusServiceUnavailable, ready: 0},
		{failing: false, advanceBy: time.Second, status: http.StatusOK, ready: 1, fresh: true},
		{failing: true, advanceBy: 500 * time.Millisecond, status: http.StatusOK, ready: 1},
		{failing: true, advanceBy: time.Second, status: http.StatusServiceUnavailable, ready: 0, fresh: true},
		{failing: false, advanceBy: 999 * time.Millisecond, status: http.StatusServiceUnavailable, ready: 0},
		{failing: false, advanceBy: time.Millisecond, status: http.StatusOK, ready: 1, fresh: true},
	} {
		failing.Store(step.failing)
		advance(step.advanceBy)
		before := pings.Load()
		s, _ := readyz()
		when := fmt.Sprintf("%v after Redis began failing=%v", step.advanceBy, step.failing)
		if s != step.status {
			t.Errorf("/readyz %s: got %v, want %v", when, s, step.status)
		}
		if fresh := pings.Load() > before; fresh != step.fresh {
			t.Errorf("/readyz %s: pinged Redis %v, want %v", when, fresh, step.fresh)
		}
		wantReady(when, step.ready)
	}
}

// TestReadyzNotPoisonedByAnAbortedProbe: one caller must not decide the
// shared, cached result. /readyz checks Redis on the request's own context
// and caches the result for everyone for 1 s. A caller that goes away before
// the check ends (a probe that timed out, an aborted curl, anyone who can
// reach the admin port sending a request and closing) cancels that context:
// the PING fails with "context canceled", which is cached as "Redis
// unreachable" -- the next /readyz (the kubelet's) gets 503, idemproxy_ready
// drops to 0 and "not ready: Redis unreachable" is logged, while Redis is
// perfectly healthy. One aborted request a second keeps every replica out of
// the Service.
func TestReadyzNotPoisonedByAnAbortedProbe(t *testing.T) {
	rd, h, logs, _ := frozenReadiness(t)

	aborted, cancel := context.WithCancel(context.Background())
	cancel() // the caller hung up (net/http cancels r.Context())
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/readyz", nil).WithContext(aborted))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil)) // the kubelet, a moment later
	if rec.Code != http.StatusOK {
		t.Errorf("/readyz with a healthy Redis, after one aborted /readyz: got %d %q, want 200", rec.Code, rec.Body.String())
	}
	if v := gaugeValue(rd.ready); v != 1 {
		t.Errorf("idemproxy_ready with a healthy Redis, after one aborted /readyz: %v, want 1", v)
	}
	if strings.Contains(logs.String(), "Redis unreachable") {
		t.Errorf("a healthy Redis was logged unreachable: %s", strings.TrimSpace(logs.String()))
	}
}

// TestReadyzSettingsNotPoisonedByAnAbortedProbe: the Redis settings
// (maxmemory-policy) are read once, by the first /readyz check that gets a
// PONG, and never again. When that request's caller goes away between the
// PING and the CONFIG GET, the CONFIG GET fails with "context canceled",
// which configWarnings turns into a warning ("could not read
// maxmemory-policy ... make sure it is noeviction") that is kept as the
// settings check's result for the life of the process: /readyz carries it
// and idemproxy_store_unsafe stays 1 (alert IdemproxyStoreUnsafe) on a Redis
// whose policy is noeviction.
func TestReadyzSettingsNotPoisonedByAnAbortedProbe(t *testing.T) {
	rd, h, _, _ := frozenReadiness(t)
	if err := rd.store.client.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	aborted, cancel := context.WithCancel(context.Background())
	// The caller hangs up right after Redis answered PING.
	rd.ping = func(ctx context.Context) error {
		err := rd.store.ping(ctx)
		cancel()
		return err
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/readyz", nil).WithContext(aborted))
	rd.ping = nil

	// Later checks, fresh (the cache dropped), on live contexts.
	rd.probe.Lock()
	rd.cached = false
	rd.probe.Unlock()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ready\n" {
		t.Errorf("/readyz on a noeviction Redis, after a caller hung up mid-check: got %d %q, want 200 \"ready\\n\"", rec.Code, rec.Body.String())
	}
	if v := gaugeValue(rd.unsafe); v != 0 {
		t.Errorf("idemproxy_store_unsafe on a noeviction Redis: %v, want 0", v)
	}
}

// TestReadyzSettingsReadAgainAfterAnOutage: the settings are read once and
// their warning kept; a read that failed because Redis went away between
// the PING and the CONFIG GET must not stand for them (it would say "could
// not read maxmemory-policy" and keep idemproxy_store_unsafe at 1 for the
// life of the process). That check fails; the next one reads them.
func TestReadyzSettingsReadAgainAfterAnOutage(t *testing.T) {
	rd, h, _, srv := frozenReadiness(t)
	rd.ping = func(ctx context.Context) error {
		err := rd.store.ping(ctx)
		srv.Kill() // Redis goes away right after its PONG
		return err
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/readyz when Redis went away mid-check: got %d %q, want 503", rec.Code, rec.Body.String())
	}
	rd.ping = nil
	srv.Restart()
	rd.probe.Lock()
	rd.cached = false
	rd.probe.Unlock()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ready\n" {
		t.Errorf("/readyz once Redis is back (noeviction): got %d %q, want 200 \"ready\\n\"", rec.Code, rec.Body.String())
	}
	if v := gaugeValue(rd.unsafe); v != 0 {
		t.Errorf("idemproxy_store_unsafe on a noeviction Redis: %v, want 0", v)
	}
}

// TestReadyzListsConfigWarnings: risky-but-allowed settings are reported in
// the /readyz body, as the contract asks.
func TestReadyzListsConfigWarnings(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "LISTEN_ADDR=127.0.0.1:0",
		"ADMIN_ADDR=127.0.0.1:0", "FAIL_MODE=open", "UPSTREAM_TIMEOUT=30s", "LOCK_TTL=32s"})
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	resp, err := http.Get(adminURL(a, "/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"FAIL_MODE=open", "LOCK_TTL=32s leaves 2s", "embedded"} {
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("/readyz %d %q lacks %q", resp.StatusCode, body, want)
		}
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
			if a.adminAddr != nil {
				// The check at start has set the gauge: the embedded store answers.
				c := newClient(t)
				if m := getBody(t, c, adminURL(a, "/metrics")); !strings.Contains(m, "\nidemproxy_ready 1\n") {
					t.Errorf("/metrics after start: want idemproxy_ready 1; got:\n%v", grepLines(m, "idemproxy_ready"))
				}
			}
		})
	}
}

// TestAdminServerDeadlines: the admin listener bounds every read and write
// and closes idle connections, as the proxy's does: with only a header
// timeout, idle keep-alive connections (file descriptors) were held for ever
// by whoever reached the admin port. The durations themselves are minutes,
// too long to wait for here.
func TestAdminServerDeadlines(t *testing.T) {
	up := newUpstream(t)
	a, _ := startProxy(t, up.URL)
	s := a.adminSrv
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 {
		t.Errorf("admin server: ReadHeaderTimeout %v, ReadTimeout %v, WriteTimeout %v, IdleTimeout %v; want each above zero",
			s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
}

// frozenReadiness is the proxy's readiness check against a real, healthy
// redis-server, with its clock frozen (the 1 s cache window never ends by
// itself, so no timing decides the outcome).
func frozenReadiness(t *testing.T) (*readiness, http.Handler, *testutil.SyncBuffer, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "REDIS_URL=" + srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	st, err := openRedis(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.close)
	frozen := time.Unix(1_700_000_000, 0)
	rd := &readiness{
		store:  st,
		logger: zerolog.New(logs),
		unsafe: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemproxy_store_unsafe"}),
		ready:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemproxy_ready"}),
		now:    func() time.Time { return frozen },
	}
	return rd, adminHandler(prometheus.NewRegistry(), rd), logs, srv
}

// gaugeValue reads a gauge's value.
func gaugeValue(g prometheus.Gauge) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(g)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
		return -1
	}
	return mfs[0].GetMetric()[0].GetGauge().GetValue()
}
