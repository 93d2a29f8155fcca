package claim

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing makes the Store add a span to the caller's trace (the span in the
// context given to Acquire, Complete, Hold and Release) for each script it
// runs: "redis claim", "redis complete", "redis hold" or "redis release",
// with the script's name and result. A replay answered from the ReplayCache
// runs no script and has no span. tp nil: no spans, and no cost.
func Tracing(tp trace.TracerProvider) Option {
	return func(s *Store) {
		if tp != nil {
			s.tracer = tp.Tracer("github.com/idemproxy/idemproxy/claim")
		}
	}
}

// Attribute keys of the script spans (the others are OpenTelemetry's
// semantic conventions).
const (
	attrScript = attribute.Key("idempotency.script")        // claim.lua, complete.lua, release.lua
	attrResult = attribute.Key("idempotency.script.result") // the Event's Result
)

// spanNames and scriptNames are fixed per Op: no allocation per span.
var (
	spanNames   = map[Op]string{OpClaim: "redis claim", OpComplete: "redis complete", OpHold: "redis hold", OpRelease: "redis release"}
	scriptNames = map[Op]string{OpClaim: "claim.lua", OpComplete: "complete.lua", OpHold: "complete.lua", OpRelease: "release.lua"}
)

// observe tells the Observer of ev and, with Tracing, records the script
// run as a span from start to start+ev.Duration: the span is made once the
// result is known, so the round trip itself carries no tracing work.
func (s *Store) observe(ctx context.Context, ev Event, start time.Time) {
	s.obs(ev)
	if s.tracer == nil {
		return
	}
	name, ok := spanNames[ev.Op]
	if !ok {
		return
	}
	_, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start))
	if span.IsRecording() {
		span.SetAttributes(
			semconv.DBSystemNameRedis,
			semconv.DBOperationName("EVALSHA"),
			semconv.DBStoredProcedureName(scriptNames[ev.Op]),
			attrScript.String(scriptNames[ev.Op]),
			attrResult.String(ev.Result),
		)
		if ev.Result == "error" {
			span.SetStatus(codes.Error, "Redis script failed")
		}
	}
	span.End(trace.WithTimestamp(start.Add(ev.Duration)))
}
