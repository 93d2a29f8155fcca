package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
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

// The variables checkTracing reads; the SDK honours them and a few more.
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
	envTracesExporter   = "OTEL_TRACES_EXPORTER"
	envAttrValueLimit   = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
	envSpanAttrValueLim = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
	defaultServiceName  = "idemproxy"
	protocolHTTP        = "http/protobuf"
	protocolGRPC        = "grpc"
	tracingFlushTimeout = 5 * time.Second
	// defaultAttrValueLimit bounds every span attribute value (bytes) when
	// neither OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT nor
	// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT is set; the SDK's own default is
	// unlimited, and clients control User-Agent, the path and Host.
	defaultAttrValueLimit = 1024
)

// The certificate files (paths) the exporter reads at start.
var envCertificates = []string{
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
}

// The SDK's numeric variables, each a whole number; positive ones must not
// be 0. The times (milliseconds) are positive: a schedule delay of 0 makes
// the batch processor's timer fire without pause (a goroutine spinning on a
// core), and export timeouts of 0 leave an export with no deadline (one
// stalled collector would hold every later export).
var envCounts = []struct {
	name     string
	positive bool
}{
	{"OTEL_BSP_SCHEDULE_DELAY", true}, {"OTEL_BSP_EXPORT_TIMEOUT", true},
	{envTimeout, true}, {envTracesTimeout, true},
	{"OTEL_BSP_MAX_QUEUE_SIZE", true}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", true},
	{envAttrValueLimit, false}, {envSpanAttrValueLim, false},
	{"OTEL_ATTRIBUTE_COUNT_LIMIT", false}, {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", false},
	{"OTEL_SPAN_EVENT_COUNT_LIMIT", false}, {"OTEL_SPAN_LINK_COUNT_LIMIT", false},
	{"OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", false}, {"OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", false},
}

// tracingConfig is what the proxy itself needs to know; the rest is the SDK's.
type tracingConfig struct {
	enabled  bool
	protocol string // protocolHTTP or protocolGRPC
	// attrValueLimit is the span attribute value length limit in bytes
	// (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
	// else defaultAttrValueLimit).
	attrValueLimit int
}

// checkTracing validates the OTEL_* variables when tracing is on. Header
// values (OTEL_EXPORTER_OTLP_HEADERS holds the collector's credentials) are
// never quoted, and endpoints are shown through redactURL.
func (c *Config) checkTracing(k *checker) {
	raw := func(name string) string { return strings.TrimSpace(k.raw[name]) }
	if strings.EqualFold(raw(envSDKDisabled), "true") || (raw(envEndpoint) == "" && raw(envTracesEndpoint) == "") {
		return
	}
	switch strings.ToLower(raw(envTracesExporter)) {
	case "", "otlp":
	case "none": // the standard way to turn traces off
		return
	default:
		k.bad("%s=%q: use otlp (the default) or none (no tracing)", envTracesExporter, k.raw[envTracesExporter])
	}
	c.tracing = tracingConfig{enabled: true, protocol: protocolHTTP, attrValueLimit: defaultAttrValueLimit}
	for _, name := range []string{envEndpoint, envTracesEndpoint} {
		v := raw(name)
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			k.bad("%s=%q: not an http:// or https:// URL with a host", name, redactURL(k.raw[name]))
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
	for _, name := range []string{envHeaders, envTracesHeaders} {
		if err := checkKeyValues(raw(name), true); err != nil {
			k.bad("%s: %v (the value is not shown: it holds credentials)", name, err)
		}
	}
	if err := checkKeyValues(raw(envResourceAttrs), false); err != nil {
		k.bad("%s=%q: %v", envResourceAttrs, k.raw[envResourceAttrs], err)
	}
	for _, name := range envCertificates {
		if v := raw(name); v != "" {
			if fi, err := os.Stat(v); err != nil {
				k.bad("%s=%q: %v", name, k.raw[name], errors.Unwrap(err))
			} else if fi.IsDir() {
				k.bad("%s=%q: a directory, not a PEM file", name, k.raw[name])
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		switch raw(name) {
		case "", "gzip", "none":
		default:
			k.bad("%s=%q: use gzip or none (the default)", name, k.raw[name])
		}
	}
	for _, e := range envCounts {
		v := raw(e.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 0:
			k.bad("%s=%q: not a whole number", e.name, k.raw[e.name])
		case e.positive && n == 0:
			k.bad("%s=%q: must be at least 1", e.name, k.raw[e.name])
		}
	}
	for _, name := range []string{envAttrValueLimit, envSpanAttrValueLim} { // the span one wins
		if n, err := strconv.Atoi(raw(name)); err == nil && n >= 0 {
			c.tracing.attrValueLimit = n
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
// percent-encoded. With headers, each key must be an HTTP header name (the
// exporter drops any other), and the error names a pair by its position,
// and its key only when that is a valid header name: a pair without "="
// ("Authorization: Bearer ...") is all credential.
func checkKeyValues(s string, headers bool) error {
	if s == "" {
		return nil
	}
	i := 0
	for p := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(p) == "" {
			continue
		}
		i++
		key, val, ok := strings.Cut(p, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			if headers {
				return fmt.Errorf("pair %d: want name=value pairs separated by commas (\"=\", not \":\": authorization=Bearer%%20TOKEN)", i)
			}
			return errors.New("want key=value pairs separated by commas")
		}
		if headers && !isToken(key) {
			return fmt.Errorf("pair %d: the name is not a valid HTTP header name (letters, digits and !#$%%&'*+-.^_`|~ only; no spaces, colons or slashes)", i)
		}
		if _, err := url.PathUnescape(strings.TrimSpace(val)); err != nil {
			return fmt.Errorf("value of %q is not percent-encoded correctly", key)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 5.6.2), what a header
// name must be.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
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
	// Span limits from the OTEL_*_LIMIT variables, the attribute value
	// length bounded by default (checkTracing).
	limits := sdktrace.NewSpanLimits()
	limits.AttributeValueLengthLimit = cfg.attrValueLimit
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))
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
