package main

// /readyz: one caller must not decide the shared, cached result (review17b).

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	itestutil "github.com/idemproxy/idemproxy/internal/testutil"
)

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

// frozenReadiness is the proxy's readiness check against a real, healthy
// redis-server, with its clock frozen (the 1 s cache window never ends by
// itself, so no timing decides the outcome).
func frozenReadiness(t *testing.T) (*readiness, http.Handler, *itestutil.SyncBuffer, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "REDIS_URL=" + srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	logs := &itestutil.SyncBuffer{}
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

// TestReadyzNotPoisonedByAnAbortedProbe: /readyz checks Redis on the
// request's own context and caches the result for everyone for 1 s. A
// caller that goes away before the check ends (a probe that timed out, an
// aborted curl, anyone who can reach the admin port sending a request and
// closing) cancels that context: the PING fails with "context canceled",
// which is cached as "Redis unreachable" -- the next /readyz (the kubelet's)
// gets 503, idemproxy_ready drops to 0 and "not ready: Redis unreachable"
// is logged, while Redis is perfectly healthy. One aborted request a second
// keeps every replica out of the Service.
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
