package proxy

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (Options.TracerProvider). Each request gets a server span that
// continues an incoming W3C traceparent; the upstream call a client span,
// whose context the upstream receives as traceparent. The Store adds a span
// per Redis script (claim.Tracing). Without a TracerProvider none of this
// runs: h.tracer is nil and every hook below is skipped.
//
// No attribute holds the idempotency key, a scope value, a query string or a
// body: the key appears as its hash only.

// Attribute keys of idemproxy's own span attributes.
const (
	attrOutcome   = attribute.Key("idempotency.outcome")    // the outcome label of the metrics and access log
	attrKeyHash   = attribute.Key("idempotency.key_hash")   // as logged (key_hash)
	attrKeySource = attribute.Key("idempotency.key_source") // header, derived or none
	// attrExecution is on a replay's span: the recorded execution's
	// "<trace-id>-<span-id>", also given as a span link.
	attrExecution = attribute.Key("idempotency.execution")
)

const tracerName = "github.com/idemproxy/idemproxy/proxy"

// maxClientAttrBytes bounds the attributes whose value the client controls
// (url.path, server.address, user_agent.original, url.full), whatever the
// SDK's attribute value length limit.
const maxClientAttrBytes = 1024

// clientAttr is s cut at maxClientAttrBytes (on a UTF-8 boundary) and
// copied: a span waiting in the export queue must not keep the request's
// header or request line alive (a substring would, and so would the SDK's
// own truncation).
func clientAttr(s string) string {
	if len(s) > maxClientAttrBytes {
		n := maxClientAttrBytes
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return strings.Clone(s)
}

// traceContext is the W3C Trace Context propagator (traceparent, tracestate).
var traceContext propagation.TraceContext

// startServerSpan starts the request's server span, a child of the incoming
// traceparent when there is one, and returns the request carrying it.
func (h *Handler) startServerSpan(r *http.Request) (*http.Request, trace.Span) {
	ctx := traceContext.Extract(r.Context(), incomingCarrier(r.Header))
	ctx, span := h.tracer.Start(ctx, methodName(r.Method), trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		host, port := splitHostPort(r.Host)
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		attrs := []attribute.KeyValue{
			semconv.HTTPRequestMethodKey.String(methodName(r.Method)),
			semconv.URLPath(clientAttr(r.URL.Path)),
			semconv.URLScheme(scheme),
			semconv.ServerAddress(clientAttr(host)),
			semconv.NetworkProtocolVersion(protocolVersion(r)),
		}
		if port > 0 {
			attrs = append(attrs, semconv.ServerPort(port))
		}
		if peer, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			attrs = append(attrs, semconv.NetworkPeerAddress(peer))
		}
		if ua := r.UserAgent(); ua != "" {
			attrs = append(attrs, semconv.UserAgentOriginal(clientAttr(ua)))
		}
		span.SetAttributes(attrs...)
	}
	return r.WithContext(ctx), span
}

// incomingCarrier is the carrier Extract reads the client's trace context
// from: a tracestate sent over several header lines is one list (RFC 9110
// field combination), joined here; Extract would read the first line only.
func incomingCarrier(h http.Header) propagation.TextMapCarrier {
	ts := h.Values("Tracestate")
	if len(ts) <= 1 {
		return propagation.HeaderCarrier(h)
	}
	return propagation.MapCarrier{"traceparent": h.Get("Traceparent"), "tracestate": strings.Join(ts, ",")}
}

// endServerSpan names the span after the route, adds what the request came
// to (outcome, key hash, status) and, for a replay, links the execution.
func endServerSpan(span trace.Span, method string, res *result) {
	if span.IsRecording() {
		if res.route != "default" {
			span.SetName(methodName(method) + " " + res.route)
			span.SetAttributes(semconv.HTTPRoute(res.route))
		}
		span.SetAttributes(attrOutcome.String(res.outcome), attrKeySource.String(res.keySource))
		if res.hasKey {
			span.SetAttributes(attrKeyHash.String(res.key.String()))
		}
		if res.status > 0 {
			span.SetAttributes(semconv.HTTPResponseStatusCode(res.status))
		}
		if res.status >= 500 {
			span.SetStatus(codes.Error, "")
			span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(res.status)))
		}
		if sc, ok := parseTraceRef(res.replayOf); ok {
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("idempotency.link", "execution")}})
			span.SetAttributes(attrExecution.String(res.replayOf))
		}
	}
	span.End()
}

// startUpstreamSpan starts the client span of the upstream call; rewrite
// sends its context as traceparent.
func (h *Handler) startUpstreamSpan(ctx context.Context, method string) (context.Context, trace.Span) {
	return h.tracer.Start(ctx, methodName(method), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(methodName(method))))
}

// traceOutgoing describes the outgoing request on its client span and
// writes that span's traceparent and tracestate into it, replacing the
// client's. The client's tracestate is dropped first: Inject writes one only
// when the span context has one, that is when the client's traceparent was
// valid and its tracestate parsed (W3C Trace Context: a tracestate is not
// propagated without its valid traceparent).
func traceOutgoing(out *http.Request) {
	ctx := out.Context()
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		host, port := splitHostPort(out.URL.Host)
		u := url.URL{Scheme: out.URL.Scheme, Host: out.URL.Host, Path: out.URL.Path, RawPath: out.URL.RawPath} // no query, no user info
		attrs := []attribute.KeyValue{semconv.URLFull(clientAttr(u.String())), semconv.ServerAddress(clientAttr(host))}
		if port == 0 {
			port = 80
			if out.URL.Scheme == "https" {
				port = 443
			}
		}
		span.SetAttributes(append(attrs, semconv.ServerPort(port))...)
	}
	out.Header.Del("Tracestate")
	traceContext.Inject(ctx, propagation.HeaderCarrier(out.Header))
}

// tracedRewrite, tracedResponse and tracedError wrap the ReverseProxy hooks
// when tracing is on; without it New leaves the hooks as they are.
func tracedRewrite(next func(*httputil.ProxyRequest)) func(*httputil.ProxyRequest) {
	return func(pr *httputil.ProxyRequest) {
		next(pr)
		traceOutgoing(pr.Out)
	}
}

func tracedResponse(next func(*http.Response) error) func(*http.Response) error {
	return func(res *http.Response) error {
		span := trace.SpanFromContext(res.Request.Context())
		span.SetAttributes(semconv.HTTPResponseStatusCode(res.StatusCode))
		if res.StatusCode >= 500 {
			span.SetStatus(codes.Error, "")
			span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(res.StatusCode)))
		}
		return next(res)
	}
}

func tracedError(next func(http.ResponseWriter, *http.Request, error)) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		span := trace.SpanFromContext(r.Context())
		span.SetStatus(codes.Error, "upstream request failed")
		errType := "upstream_error"
		if isTimeout(err) {
			errType = "timeout"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		next(w, r, err)
	}
}

// traceRef is the record's Trace: "<trace-id>-<span-id>" of the span in
// ctx (the executing request's server span), or "" when it is not sampled.
func traceRef(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return ""
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	var b [2*16 + 1 + 2*8]byte
	hex.Encode(b[:32], tid[:])
	b[32] = '-'
	hex.Encode(b[33:], sid[:])
	return string(b[:])
}

// parseTraceRef reads a record's Trace back as a (remote) span context.
func parseTraceRef(s string) (trace.SpanContext, bool) {
	if len(s) != 2*16+1+2*8 || s[32] != '-' {
		return trace.SpanContext{}, false
	}
	tid, err1 := trace.TraceIDFromHex(s[:32])
	sid, err2 := trace.SpanIDFromHex(s[33:])
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}

// methodName is the method as the semantic conventions want it: a known
// method, or _OTHER (the attribute set stays bounded).
func methodName(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

func protocolVersion(r *http.Request) string {
	switch {
	case r.ProtoMajor == 1 && r.ProtoMinor == 0:
		return "1.0"
	case r.ProtoMajor == 2:
		return "2"
	}
	return "1.1"
}

func splitHostPort(hostport string) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport, 0
	}
	port, _ := strconv.Atoi(p)
	return host, port
}
