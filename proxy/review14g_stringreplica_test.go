package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// review14gStringReplica starts a second replica on e's Redis, as
// RECORD_FORMAT=string wires it (main.go: claim.StringRecords).
func review14gStringReplica(e *env, opts proxy.Options) *httptest.Server {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	metrics := proxy.NewMetrics(reg)
	logger := zerolog.New(e.logs).With().Timestamp().Logger()
	opts.Logger, opts.Metrics = logger, metrics
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", metrics.ObserveScript, claim.StringRecords(true)), opts)
	if err != nil {
		e.t.Fatalf("proxy.New: %v", err)
	}
	srv := httptest.NewServer(h)
	e.t.Cleanup(srv.Close)
	return srv
}

// TestReview14gStringReplicaReexecutesHashRecord: the README's step 2 of the
// record format rollout (set RECORD_FORMAT=string with a rolling restart;
// hash records stay for one TTL). A payment was executed and recorded by a
// hash replica. Redis then refuses writes but answers and still has every
// record: min-replicas-to-write is not met (a replica link drops), or the
// proxies still talk to the old master that a failover demoted (read-only;
// the README: fail open applies to a Redis "failing over or read-only"). A
// retry through the hash replica is replayed, as before this change.
// Through a string replica, claim.lua issues SET NX before it reads the
// hash; Redis refuses that write (NOREPLICAS, READONLY), which counts as an
// outage, and FAIL_MODE=open forwards the completed payment: it executes
// twice.
func TestReview14gStringReplicaReexecutesHashRecord(t *testing.T) {
	for _, tc := range []struct {
		name          string
		refuse, allow func(context.Context, *env) error
	}{
		{"NOREPLICAS",
			func(ctx context.Context, e *env) error {
				return e.rdb.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
			},
			func(ctx context.Context, e *env) error {
				return e.rdb.ConfigSet(ctx, "min-replicas-to-write", "0").Err()
			}},
		{"READONLY (demoted master)",
			// Its new master is a port nobody listens on: no sync, so it
			// keeps its data and refuses writes.
			func(ctx context.Context, e *env) error {
				return e.rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(e.t)).Err()
			},
			func(ctx context.Context, e *env) error { return e.rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, realBackend, func(o *proxy.Options) { o.Default.FailOpen = true })
			str := review14gStringReplica(e, e.opts)
			ctx := context.Background()

			first := e.do(req{key: "pay-1", body: `{"amount":100}`})
			if first.StatusCode != http.StatusCreated || e.calls.Load() != 1 {
				t.Fatalf("first request through the hash replica: %d, upstream calls %d", first.StatusCode, e.calls.Load())
			}
			if err := tc.refuse(ctx, e); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tc.allow(ctx, e) })

			viaHash := e.do(req{key: "pay-1", body: `{"amount":100}`})
			if viaHash.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Fatalf("control, retry through the hash replica: %d replayed=%q, upstream calls %d; want a replay",
					viaHash.StatusCode, viaHash.Header.Get("Idempotent-Replayed"), e.calls.Load())
			}

			viaString := e.doTo(str, req{key: "pay-1", body: `{"amount":100}`})
			if viaString.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Errorf("retry through the string replica: status %d replayed=%q body %s, upstream calls %d; want the recorded answer replayed and 1 call",
					viaString.StatusCode, viaString.Header.Get("Idempotent-Replayed"), viaString.body, e.calls.Load())
			}
		})
	}
}

// TestReview14gStringReplicaOOMRefusesReplay: the same with Redis full under
// noeviction (FAIL_MODE=closed). The README: a full Redis refuses the claim
// of a first request (503); a retry of a recorded key is still answered
// from its record, by a hash replica. A string replica answers 503 to the
// retry of every key recorded as a hash.
func TestReview14gStringReplicaOOMRefusesReplay(t *testing.T) {
	e := newEnv(t, realBackend, nil)
	str := review14gStringReplica(e, e.opts)
	ctx := context.Background()

	if r := e.do(req{key: "pay-2", body: "b"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %d", r.StatusCode)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.rdb.ConfigSet(ctx, "maxmemory", "0").Err() })

	if r := e.do(req{key: "pay-2", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("control, hash replica with Redis full: %d %s; want a replay", r.StatusCode, r.body)
	}
	if r := e.doTo(str, req{key: "pay-2", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("string replica with Redis full: status %d body %s; want the recorded answer replayed", r.StatusCode, r.body)
	}
}
