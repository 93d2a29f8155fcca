package proxy

import (
	"testing"

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
