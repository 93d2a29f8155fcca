package claim_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/claim"
)

// The execution's trace is stored beside the record (field tr) and comes
// back with every replay, from Redis and from the replay cache; without a
// trace nothing is written. With Tracing, each script run is a child span of
// the caller's.
func TestRecordTrace(t *testing.T) {
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			s := claim.NewStore(be.rdb, "trace:"+be.name+":", nil, claim.ReplayCache(1<<20, time.Minute), claim.Tracing(tp))
			terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
			for i, want := range []string{tr, ""} {
				key := claim.NewKey(nil, "k"+string(rune('0'+i)))
				parent, span := tp.Tracer("test").Start(ctx, "request")
				lease, _, err := s.Acquire(parent, key, claim.Fingerprint{1}, terms)
				if err != nil {
					t.Fatal(err)
				}
				if err := lease.Complete(parent, &claim.Record{Status: 201, Trace: want}, time.Hour); err != nil {
					t.Fatal(err)
				}
				span.End()
				got, ok := recordFields(t, be.rdb, claim.RecordKey("trace:"+be.name+":", key))["tr"]
				if want == "" && ok {
					t.Errorf("field tr: got %q, want none written", got)
				}
				if want != "" && got != want {
					t.Errorf("field tr: got %q, want %q", got, want)
				}
				for j, from := range []string{"Redis", "the replay cache"} {
					_, r, err := s.Acquire(ctx, key, claim.Fingerprint{1}, terms)
					if err != nil || r == nil || r.Trace != want {
						t.Fatalf("replay %d (from %s): got %+v, %v; want Trace %q", j, from, r, err, want)
					}
				}
			}
			var claims, completes int
			for _, sp := range rec.Ended() {
				attrs := attribute.NewSet(sp.Attributes()...)
				switch sp.Name() {
				case "redis claim":
					claims++
				case "redis complete":
					completes++
					if !sp.Parent().IsValid() {
						t.Errorf("redis complete: no parent; want the caller's span")
					}
					if v, _ := attrs.Value("idempotency.script.result"); v.AsString() != "ok" {
						t.Errorf("redis complete result: got %q, want ok", v.AsString())
					}
				}
				if v, _ := attrs.Value("db.system.name"); sp.Name() != "request" && v.AsString() != "redis" {
					t.Errorf("%s: db.system.name %q, want redis", sp.Name(), v.AsString())
				}
			}
			// Two claims, two replays from Redis; the cached replays run no script.
			if claims != 4 || completes != 2 {
				t.Errorf("spans: got %d redis claim and %d redis complete, want 4 and 2", claims, completes)
			}
		})
	}
}
