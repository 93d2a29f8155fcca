package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestTrailersReplayed: trailers are part of the answer; the replay sends
// them as the first answer had them.
func TestTrailersReplayed(t *testing.T) {
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "payload")
			w.Header().Set("X-Checksum", "abc123")
		})
		first := e.do(req{key: "tr", body: "b"})
		again := e.do(req{key: "tr", body: "b"})
		if first.Trailer.Get("X-Checksum") != "abc123" {
			t.Fatalf("first answer trailer %v, want X-Checksum: abc123", first.Trailer)
		}
		if again.Header.Get("Idempotent-Replayed") != "true" || string(again.body) != "payload" {
			t.Fatalf("replay: %d %q", again.StatusCode, again.body)
		}
		if again.Trailer.Get("X-Checksum") != "abc123" {
			t.Errorf("replay trailer %v, want X-Checksum: abc123", again.Trailer)
		}
	})
}

// TestFailOpenOnlyWhenUnreachable: a Redis that answers but refuses writes
// (OOM under noeviction) is not an outage: fail open must not forward
// without a guarantee; the answer is 503.
func TestFailOpenOnlyWhenUnreachable(t *testing.T) {
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Default.FailOpen = true })
	ctx := context.Background()
	if err := e.rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	r := e.do(req{key: "oom", body: "b"})
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("OOM with FAIL_MODE=open: status %d, want 503", r.StatusCode)
	}
	if e.calls.Load() != 0 {
		t.Errorf("upstream called %d times while Redis refused writes", e.calls.Load())
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	e.redis.Kill()
	if r := e.do(req{key: "down", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Errorf("Redis down with FAIL_MODE=open: status %d, want the forwarded 201", r.StatusCode)
	}
}

// TestDeploymentsBoundToTheirUpstream: two deployments in front of
// different APIs share one Redis and the default KEY_PREFIX. A key sent to
// both is executed by the first and refused (422) by the second: neither
// replays the other's answer.
func TestDeploymentsBoundToTheirUpstream(t *testing.T) {
	forBoth(t, nil, func(t *testing.T, e *env) {
		serviceB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "service B")
		}))
		defer serviceB.Close()
		newDeployment := func(upstream string) *httptest.Server {
			opts := e.opts
			opts.Upstream = mustURL(t, upstream)
			reg := prometheus.NewRegistry()
			opts.Metrics = proxy.NewMetrics(reg)
			opts.Logger = zerolog.New(e.logs)
			h, err := proxy.New(claim.NewStore(e.rdb, "idem:", nil, claim.Upstream(upstream)), opts)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			return srv
		}
		a, b := newDeployment(e.upstream.URL), newDeployment(serviceB.URL)
		if r := e.doTo(a, req{key: "shared", body: "x"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("service A: %d", r.StatusCode)
		}
		r := e.doTo(b, req{key: "shared", body: "x"})
		if r.StatusCode != http.StatusUnprocessableEntity || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("service B with A's key: %d %s, want 422 (never A's answer)", r.StatusCode, r.body)
		}
		if again := e.doTo(a, req{key: "shared", body: "x"}); again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("service A retry: %d, want the replay", again.StatusCode)
		}
		if e.calls.Load() != 1 {
			t.Errorf("service A called %d times, want 1", e.calls.Load())
		}
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
