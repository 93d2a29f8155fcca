package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is configured only through the standard OTEL_* variables. It is on
// when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set (and OTEL_SDK_DISABLED is not true). The OpenTelemetry SDK reads the
// variables itself, from the process environment (main passes that same
// environment to run); checkTracing refuses values the SDK would only log
// and ignore, naming each, as for every other variable.

// The variables checkTracing reads; the SDK honours them and more
// (OTEL_EXPORTER_OTLP_CERTIFICATE, _COMPRESSION, OTEL_BSP_*, ...).
const (
	envEndpoint         = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint   = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol         = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol   = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envHeaders          = "OTEL_EXPORTER_OTLP_HEADERS"
	envTracesHeaders    = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
	envTimeout          = "OTEL_EXPORTER_OTLP_TIMEOUT"
	envTracesTimeout    = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
	envSampler          = "OTEL_TRACES_SAMPLER"
	envSamplerArg       = "OTEL_TRACES_SAMPLER_ARG"
	envResourceAttrs    = "OTEL_RESOURCE_ATTRIBUTES"
	envSDKDisabled      = "OTEL_SDK_DISABLED"
	defaultServiceName  = "idemproxy"
	protocolHTTP        = "http/protobuf"
	protocolGRPC        = "grpc"
	tracingFlushTimeout = 5 * time.Second
)

// tracingConfig is what the proxy itself needs to know; the rest is the SDK's.
type tracingConfig struct {
	enabled  bool
	protocol string // protocolHTTP or protocolGRPC
}

// checkTracing validates the OTEL_* variables when tracing is on.
func (c *Config) checkTracing(k *checker) {
	raw := func(name string) string { return strings.TrimSpace(k.raw[name]) }
	if strings.EqualFold(raw(envSDKDisabled), "true") || (raw(envEndpoint) == "" && raw(envTracesEndpoint) == "") {
		return
	}
	c.tracing = tracingConfig{enabled: true, protocol: protocolHTTP}
	for _, name := range []string{envEndpoint, envTracesEndpoint} {
		v := raw(name)
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			k.bad("%s=%q: not an http:// or https:// URL with a host", name, k.raw[name])
		}
	}
	for _, name := range []string{envProtocol, envTracesProtocol} { // the per-signal one wins
		switch v := raw(name); v {
		case "":
		case protocolHTTP, protocolGRPC:
			c.tracing.protocol = v
		default:
			k.bad("%s=%q: use %s (the default) or %s", name, k.raw[name], protocolHTTP, protocolGRPC)
		}
	}
	for _, name := range []string{envHeaders, envTracesHeaders, envResourceAttrs} {
		if err := checkKeyValues(raw(name)); err != nil {
			k.bad("%s=%q: %v", name, k.raw[name], err)
		}
	}
	for _, name := range []string{envTimeout, envTracesTimeout} {
		if v := raw(name); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 0 {
				k.bad("%s=%q: not a whole number of milliseconds", name, k.raw[name])
			}
		}
	}
	sampler := strings.ToLower(raw(envSampler))
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
	case "traceidratio", "parentbased_traceidratio":
		if v := raw(envSamplerArg); v != "" {
			if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || f > 1 {
				k.bad("%s=%q: a ratio between 0 and 1 is wanted for %s", envSamplerArg, k.raw[envSamplerArg], sampler)
			}
		}
	default:
		k.bad("%s=%q: use always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio",
			envSampler, k.raw[envSampler])
	}
}

// checkKeyValues checks the W3C Baggage-like list of OTEL_*_HEADERS and
// OTEL_RESOURCE_ATTRIBUTES: key=value pairs separated by commas, values
// percent-encoded.
func checkKeyValues(s string) error {
	if s == "" {
		return nil
	}
	for p := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(p) == "" {
			continue
		}
		key, val, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(key) == "" {
			return errors.New("want key=value pairs separated by commas")
		}
		if _, err := url.PathUnescape(strings.TrimSpace(val)); err != nil {
			return fmt.Errorf("value of %q is not percent-encoded correctly", strings.TrimSpace(key))
		}
	}
	return nil
}

// tracing is the started tracer provider; a nil *tracing is tracing off.
type tracing struct {
	sdk *sdktrace.TracerProvider
}

// newTracing starts the OTLP exporter and the tracer provider, or returns
// nil when tracing is off. Exporting never blocks a request: spans are
// batched, and export failures are logged (by the SDK's error handler).
func newTracing(cfg tracingConfig, logger zerolog.Logger) (*tracing, error) {
	if !cfg.enabled {
		return nil, nil
	}
	ctx := context.Background()
	var (
		exp *otlptrace.Exporter
		err error
	)
	if cfg.protocol == protocolGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter (%s): %w", cfg.protocol, err)
	}
	// service.name defaults to idemproxy; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (WithFromEnv, applied after) override it.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(defaultServiceName), semconv.ServiceVersion(version)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: %s: %w", envResourceAttrs, err)
	}
	lg := logger.With().Str("component", "tracing").Logger()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		lg.Warn().Err(err).Msg("OpenTelemetry: spans not exported")
	}))
	// The sampler comes from OTEL_TRACES_SAMPLER and _ARG (read by the SDK;
	// parentbased_always_on when unset).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &tracing{sdk: tp}, nil
}

// provider is the TracerProvider for proxy and claim; nil when tracing is off
// (an interface holding a nil pointer would not be).
func (t *tracing) provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.sdk
}

// shutdown exports the spans still queued and stops the exporter, within
// ctx and at most tracingFlushTimeout.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, tracingFlushTimeout)
	defer cancel()
	if err := t.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush on shutdown: %w", err)
	}
	return nil
}
