package proxy

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/claim"
)

// BenchmarkHandlerOwnCostTraced is BenchmarkHandlerOwnCost with tracing on:
// every request sampled, its spans (server, upstream client, one per Redis
// script) batched to an exporter that discards them. The difference is what
// tracing costs the proxy per request; tracing off is BenchmarkHandlerOwnCost.
func BenchmarkHandlerOwnCostTraced(b *testing.B) {
	for _, sampler := range []struct {
		name string
		s    sdktrace.Sampler
	}{{"sampled", sdktrace.AlwaysSample()}, {"sampled_out", sdktrace.NeverSample()}} {
		b.Run(sampler.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler.s), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
			opts := memoryOptions(nil)
			opts.TracerProvider = tp
			h, err := New(claim.NewStore(phaseScripter{}, "idem:", nil, claim.Tracing(tp)), opts)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				serve(b, h, "k")
			}
		})
	}
}

// BenchmarkHandlerReplayCachedTraced is BenchmarkHandlerReplayCached with
// every request sampled: a replay's server span, with its link to the
// recorded execution, batched to an exporter that discards it.
func BenchmarkHandlerReplayCachedTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
	rec := &claim.Record{Status: 201, Header: map[string][]string{
		"Content-Type": {"application/json"}, "Content-Length": {"200"},
	}, Body: []byte(upstreamBody)}
	opts := memoryOptions(nil)
	opts.TracerProvider = tp
	h, err := New(claim.NewStore(replayScripter{rec: string(rec.Encode()), trace: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}, "idem:", nil,
		claim.ReplayCache(1<<20, time.Minute), claim.Tracing(tp)), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		serve(b, h, "same")
	}
}
