// Package proxy is the HTTP side of idemproxy: it matches ROUTES policies,
// checks keys and bodies, fingerprints requests, forwards them once through
// httputil.ReverseProxy, records their answers and replays them.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/xid"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// Store claims keys; *claim.Store implements it.
type Store interface {
	Acquire(ctx context.Context, key claim.Key, fp claim.Fingerprint, terms claim.Terms) (*claim.Lease, *claim.Record, error)
}

// Options configure a Handler. Zero values are not defaults: main fills every
// field from the configuration.
type Options struct {
	Upstream       *url.URL
	KeyHeader      string   // IDEMPOTENCY_HEADER
	Methods        []string // METHODS
	Default        Policy   // the global settings (Covered is derived from Methods)
	Routes         []Route  // ROUTES
	MaxKeyLength   int
	MaxBodyBytes   int64
	MaxStoredBytes int64
	// MaxBufferedBytes (MAX_BUFFERED_BYTES) bounds the keyed bodies and
	// answers being recorded that all requests hold in memory at once; 0
	// bounds nothing (main always sets it).
	MaxBufferedBytes int64
	ScopeHeaders     []string
	// UpstreamTimeout bounds a keyed upstream call, the wait for any
	// forwarded request's response headers (with the default Transport), and
	// each write to a client.
	UpstreamTimeout time.Duration
	// RequestReadTimeout bounds the arrival of a keyed request's whole body,
	// and each read of a streamed pass-through body.
	RequestReadTimeout time.Duration
	// DocsURL (DOCS_URL), when set, is linked from every problem the proxy
	// writes (Link: <DocsURL>; rel="describedby").
	DocsURL   string
	Transport http.RoundTripper // nil: NewTransport() with ResponseHeaderTimeout = UpstreamTimeout
	// Logger writes the access log and every other line; the lines the
	// Handler writes for a request carry its request_id. ReverseProxy's own
	// lines (ErrorLog) go to it too, without one: ReverseProxy logs through
	// one log.Logger for all requests. Its line for a body copy that failed
	// is dropped: the request's own warning says it (answerBody).
	Logger  zerolog.Logger
	Metrics *Metrics // nil: metrics are registered nowhere
	// TracerProvider, when set, traces every request (trace.go); nil: no
	// tracing, and no tracing work on any request.
	TracerProvider trace.TracerProvider
}

// Handler is the idempotency proxy.
type Handler struct {
	store    Store
	opts     Options
	router   *router
	methods  map[string]bool
	plain    *httputil.ReverseProxy // pass-through (passthrough.go)
	keyed    *httputil.ReverseProxy // claimed requests (keyed.go)
	metrics  *Metrics
	titleUse string // IETF draft titles, with the configured header name
	titleOut string
	titleMis string
	docsLink []string        // the Link header of the proxy's problems; nil without DOCS_URL
	noTrail  map[string]bool // request trailer names never forwarded (trailerDenied)
	tracer   trace.Tracer    // nil: tracing off (trace.go)
	buffered *budget         // MAX_BUFFERED_BYTES

	stopWaits     chan struct{} // closed by StopWaiting
	stopWaitsOnce sync.Once
	// notJSONWarned holds the routes whose first body that was not JSON has
	// been warned of (once per route: the metric counts the rest).
	notJSONWarned sync.Map
}

// StopWaiting ends every WAIT_TIMEOUT wait at once with a 409 (the client
// retries later and gets the replay from another replica). Call it when
// shutting down: a wait must not hold SHUTDOWN_TIMEOUT when nothing runs
// here.
func (h *Handler) StopWaiting() {
	h.stopWaitsOnce.Do(func() { close(h.stopWaits) })
}

// New returns a Handler that claims keys in store and forwards to
// opts.Upstream.
func New(store Store, opts Options) (*Handler, error) {
	if opts.Upstream == nil || opts.Upstream.Host == "" {
		return nil, errors.New("proxy: upstream URL with a host is required")
	}
	if opts.UpstreamTimeout <= 0 || opts.RequestReadTimeout <= 0 {
		return nil, fmt.Errorf("proxy: UpstreamTimeout (%v) and RequestReadTimeout (%v) must be above zero", opts.UpstreamTimeout, opts.RequestReadTimeout)
	}
	if opts.MaxBufferedBytes < 0 || (opts.MaxBufferedBytes > 0 && opts.MaxBufferedBytes < opts.MaxStoredBytes) {
		// A replay must fit (Handler.replay): a smaller budget would refuse
		// the largest records for ever.
		return nil, fmt.Errorf("proxy: MaxBufferedBytes (%d) must be 0 (no bound) or at least MaxStoredBytes (%d)", opts.MaxBufferedBytes, opts.MaxStoredBytes)
	}
	rtr, err := newRouter(opts.Routes)
	if err != nil {
		return nil, err
	}
	if opts.Transport == nil {
		t := NewTransport()
		// Every forwarded request, keyed or not, waits at most this long for
		// the upstream's headers; a body that then streams is not cut.
		t.ResponseHeaderTimeout = opts.UpstreamTimeout
		opts.Transport = t
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	h := &Handler{
		store:    store,
		opts:     opts,
		router:   rtr,
		methods:  map[string]bool{},
		metrics:  opts.Metrics,
		titleUse: opts.KeyHeader + " is already used",
		titleOut: "A request is outstanding for this " + opts.KeyHeader,
		titleMis: opts.KeyHeader + " is missing",
		buffered: &budget{max: opts.MaxBufferedBytes},

		stopWaits: make(chan struct{}),
	}
	opts.Metrics.watchBuffered(&h.buffered.used)
	for _, rt := range opts.Routes {
		if rt.Key != nil && rt.Key.needsBody {
			// Exported at zero: a series first scraped at 1 is one that
			// rate() and increase() never see grow.
			opts.Metrics.bodyNotJSON.WithLabelValues(rt.Pattern)
		}
	}
	for _, m := range opts.Methods {
		h.methods[m] = true
	}
	if opts.DocsURL != "" {
		h.docsLink = []string{"<" + opts.DocsURL + `>; rel="describedby"`}
	}
	// Two forwarding paths, each owning its hooks: plain streams a request
	// through and answers its errors; keyed runs a claimed request into an
	// exchange (keyed.go), which records the answer.
	own := append([]string{opts.KeyHeader}, opts.ScopeHeaders...)
	for _, rt := range opts.Routes {
		if rt.Scope != nil {
			own = append(own, *rt.Scope...)
		}
		if rt.Key != nil {
			own = append(own, rt.Key.headers()...)
		}
	}
	h.noTrail = trailerDenied(own)
	pool := NewBufferPool()
	errLog := log.New(reverseProxyLog{opts.Logger}, "", 0)
	h.plain = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			h.rewrite(pr)
			if pr.In.Trailer != nil && pr.Out.Body != nil {
				pr.Out.Body = &trailerCopy{ReadCloser: pr.Out.Body, in: pr.In.Trailer, out: pr.Out.Trailer}
			}
		},
		Transport:      opts.Transport,
		BufferPool:     pool,
		ModifyResponse: plainResponse,
		ErrorHandler:   h.plainError,
		ErrorLog:       errLog,
	}
	h.keyed = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			h.rewrite(pr)
			switch {
			case pr.Out.Body == nil && replayableMethod(pr.Out.Method):
				// ReverseProxy sends an empty body as nil, and the Transport then
				// resends a written GET/HEAD/OPTIONS/TRACE without asking GetBody.
				// A non-nil empty body makes it ask; for these methods the
				// Transport probes it and sends no length, as for nil.
				pr.Out.Body = io.NopCloser(strings.NewReader(""))
			case pr.Out.Body == nil:
				// POST, PUT, PATCH...: NoBody keeps "Content-Length: 0" (a non-nil
				// empty body has an unknown length, sent chunked, which upstreams
				// that require a length refuse), and the Transport never resends
				// these without a canonical Idempotency-Key header, which
				// hideIdempotencyKey takes away.
				pr.Out.Body = http.NoBody
			case pr.In.ContentLength > 0:
				// A keyed body is in memory (exchange). ReverseProxy hides it
				// behind a wrapper the Transport cannot recognise, and the
				// Transport then flushes the headers and writes the body in a
				// second syscall (and the upstream reads twice). The in-memory
				// reader itself goes out whole in one write; its Close is a no-op,
				// which is what the wrapper protects.
				pr.Out.Body = pr.In.Body
			}
		},
		Transport:      opts.Transport,
		BufferPool:     pool,
		ModifyResponse: keyedResponse,
		ErrorHandler:   keyedError,
		ErrorLog:       errLog,
	}
	if opts.TracerProvider != nil {
		h.tracer = opts.TracerProvider.Tracer(tracerName)
		for _, rp := range []*httputil.ReverseProxy{h.plain, h.keyed} {
			rp.Rewrite = tracedRewrite(rp.Rewrite)
			rp.ModifyResponse = tracedResponse(rp.ModifyResponse)
			rp.ErrorHandler = tracedError(rp.ErrorHandler)
		}
	}
	return h, nil
}

// replayableMethod: the methods net/http's Transport resends on a failed
// pooled connection without asking GetBody when the body is nil or NoBody
// (Request.isReplayable).
func replayableMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// rewrite is the outgoing request of both forwarding paths.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(h.opts.Upstream)
	pr.SetXForwarded()
	hideIdempotencyKey(pr.Out.Header)
	for k := range pr.Out.Trailer {
		if h.noTrail[k] {
			delete(pr.Out.Trailer, k)
		}
	}
}

// upgradeRequested reports whether the request asks to switch protocols
// (Connection: upgrade and an Upgrade header: the only form ReverseProxy
// tunnels), and returns the protocols asked for other than h2c ("" when h2c
// was the only one).
func upgradeRequested(h http.Header) (string, bool) {
	up := h.Values("Upgrade")
	if len(up) == 0 || !headerHasToken(h.Values("Connection"), "upgrade") {
		return "", false
	}
	var rest []string
	for _, v := range up {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			name, _, _ := strings.Cut(p, "/")
			if p != "" && !strings.EqualFold(name, "h2c") {
				rest = append(rest, p)
			}
		}
	}
	return strings.Join(rest, ", "), true
}

// headerHasToken reports whether a comma-separated header holds token
// (case-insensitive).
func headerHasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// hideIdempotencyKey stores the Idempotency-Key headers under lower-case
// map keys. net/http's Transport treats a request carrying the canonical
// "Idempotency-Key" or "X-Idempotency-Key" as safe to send twice, and
// resends it on a new connection when a pooled one breaks after the request
// was written: the upstream would execute it twice. Header names are
// case-insensitive on the wire, so the upstream sees the same header; the
// Transport's check (an exact map lookup) no longer matches.
func hideIdempotencyKey(h http.Header) {
	for _, k := range [...]string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[k]; ok {
			delete(h, k)
			h[strings.ToLower(k)] = v
		}
	}
}

// result is what the access log and the metrics learn about one request.
type result struct {
	// requestID is sent as X-Request-Id and logged as request_id on every
	// line of the request (info, warn, error).
	requestID string
	log       *zerolog.Logger
	route     string
	outcome   string
	status    int
	// key is the (scope, key) hash once there is one (hasKey): logged as
	// key_hash, hex-encoded only when a line is written.
	key        claim.Key
	hasKey     bool
	upstreamMS float64
	// rc puts the write deadlines on the client connection: every answer is
	// written under one, the final flush (after the handler returns)
	// included; net/http lifts it once the answer is out.
	rc           *http.ResponseController
	writeTimeout time.Duration
	// writeDeadline is the write deadline this request last put on the
	// connection (zero: none yet, or cleared); see writeBy.
	writeDeadline time.Time
	hijacked      bool // a protocol switch took the connection over: no deadlines
	// trailers are the request trailers the client announced (its Trailer
	// header, which net/http takes away); nil for none, as nearly always.
	trailers  []string
	keySource string   // keySourceHeader, keySourceDerived or keySourceNone
	docsLink  []string // Link header for the proxy's own problems (DOCS_URL)
	replayOf  string   // a replayed record's Trace (its execution), for the span link
	// acct holds the request's share of MAX_BUFFERED_BYTES: its body, and
	// its answer while it is recorded. Given back by finish.
	acct account
	// replayCounted: a record read by readLarge, counted in acct before it
	// was read (replay does not count it again).
	replayCounted bool
	// bodyDone: the request's body was read to its end, or pass-through
	// took charge of it (it bounds what is left itself), or what is left of
	// it is bounded (boundBody). bodyLen is its declared length (-1 for
	// unknown), readTimeout REQUEST_READ_TIMEOUT.
	bodyDone    bool
	bodyLen     int64
	readTimeout time.Duration
}

// boundBody puts REQUEST_READ_TIMEOUT on what is left of a body the
// request is answered without reading (a refusal: the key, the declared
// size, an upgrade; or a body that failed part way). net/http reads what is
// left, up to 256 KiB, before it writes the answer's header, so as to keep
// the connection: inside the handler's own write when the answer is larger
// than its 2 KiB buffer, or else after the handler returns. Without a
// deadline, a client that declares a body and never sends it holds the
// connection and never gets its answer. Called before any answer of the
// proxy's own is written, and by finish.
func (res *result) boundBody() {
	if res.bodyDone || res.hijacked || res.bodyLen == 0 || res.rc == nil {
		return
	}
	res.bodyDone = true
	_ = res.rc.SetReadDeadline(time.Now().Add(res.readTimeout))
}

// The key_source label and access-log field: a fixed set.
const (
	keySourceNone    = "none"    // no key: not covered, or no key sent
	keySourceHeader  = "header"  // IDEMPOTENCY_HEADER
	keySourceDerived = "derived" // a route's key=SOURCE
)

// arm gives the next write to the client UPSTREAM_TIMEOUT from now, or up
// to deadlineSlack more. Every stage that writes arms first: a deadline set
// earlier may have been used up by a wait (WAIT_TIMEOUT), a slow body or a
// long upload.
func (res *result) arm() { res.armFrom(time.Now()) }

// armFrom is arm with the time already read.
func (res *result) armFrom(now time.Time) {
	res.writeBy(now.Add(res.writeTimeout), deadlineSlack(res.writeTimeout))
}

// info, warn and error start a log line of this request. The request id is
// a field of each line rather than of a logger made per request: that
// logger, carried in a copy of the request, was four allocations on every
// request, replays included, at any LOG_LEVEL (issue 14).
func (res *result) debug() *zerolog.Event { return res.log.Debug().Str("request_id", res.requestID) }
func (res *result) info() *zerolog.Event  { return res.log.Info().Str("request_id", res.requestID) }
func (res *result) warn() *zerolog.Event  { return res.log.Warn().Str("request_id", res.requestID) }
func (res *result) error() *zerolog.Event { return res.log.Error().Str("request_id", res.requestID) }

// writeBy makes the client's write deadline no earlier than earliest and no
// later than earliest+slack. A deadline this request set that is already in
// that window is kept: every set is a runtime timer update on the
// connection, and the stages and writes of one answer arm within
// microseconds of each other (three sets on every replay were 3.5 % of its
// CPU under load). A new one is set at the window's end, so that the arms
// that follow within slack keep it.
func (res *result) writeBy(earliest time.Time, slack time.Duration) {
	if res.hijacked {
		return
	}
	if d := res.writeDeadline; !d.Before(earliest) && !d.After(earliest.Add(slack)) {
		return
	}
	res.writeDeadline = earliest.Add(slack)
	_ = res.rc.SetWriteDeadline(res.writeDeadline)
}

// clearWriteDeadline lifts the client's write deadline (a protocol switch:
// the tunnel has none).
func (res *result) clearWriteDeadline() {
	res.writeDeadline = time.Time{}
	_ = res.rc.SetWriteDeadline(time.Time{})
}

// deadlineSlack is how much later than asked a write deadline may be, for a
// deadline d from now: an eighth of it, at most a second.
func deadlineSlack(d time.Duration) time.Duration {
	return max(0, min(d/8, time.Second))
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.metrics.inflight.Inc()
	// Every answer carries a new request id, the request_id of the
	// request's log lines: the proxy's own, set before anything can answer
	// and kept over an upstream's header of that name (savedHeaders).
	id := xid.NewWithTime(start).String()
	w.Header()[RequestIDHeader] = []string{id}
	res := result{requestID: id, log: &h.opts.Logger, route: "default", upstreamMS: -1, rc: http.NewResponseController(w),
		writeTimeout: h.opts.UpstreamTimeout, keySource: keySourceNone, docsLink: h.docsLink, acct: account{b: h.buffered},
		bodyLen: r.ContentLength, readTimeout: h.opts.RequestReadTimeout}
	defer h.finish(r, &res, start)
	if r.Trailer != nil { // before the body is read: the announced names only
		res.trailers = slices.Collect(maps.Keys(r.Trailer))
	}
	if h.tracer != nil {
		var span trace.Span
		r, span = h.startServerSpan(r)
		defer endServerSpan(span, r.Method, &res)
	}
	// Every answer, the proxy's own problems included, is written under a
	// deadline: a client that never reads (or pipelines and never reads)
	// must not hold a connection. Each stage re-arms it before it writes,
	// and streams extend it per write.
	res.armFrom(start)

	pol := h.opts.Default
	pol.Covered = h.methods[r.Method]
	if rt := h.router.match(r); rt != nil {
		res.route = rt.Pattern
		pol = rt.apply(h.opts.Default)
	}
	if upgrade, ok := upgradeRequested(r.Header); ok {
		switch {
		case upgrade == "":
			// Only h2c was asked for: never tunnelled (requests inside the
			// tunnel would bypass every check). Ignoring an Upgrade is always
			// allowed (RFC 9110 section 7.8); the client goes on in HTTP/1.1.
			r.Header.Del("Upgrade")
			r.Header.Del("Http2-Settings")
		case pol.Upgrade:
			r.Header.Set("Upgrade", upgrade)
			h.passthrough(w, r, &res, outcomePassthrough)
			return
		default:
			upgradeRefused(upgrade).write(w, &res)
			return
		}
	}
	if !pol.Covered || pol.Off {
		h.passthrough(w, r, &res, outcomePassthrough)
		return
	}

	var (
		key      string
		body     []byte
		bodyRead bool
		err      error
	)
	if pol.Verifier != nil {
		// The sender's signature is checked before anything else: a forged
		// delivery must neither claim its message id (the genuine one would
		// get the forgery's answer) nor reach the upstream.
		if body, err = readBody(res.rc, r, h.opts.MaxBodyBytes, h.opts.RequestReadTimeout, pol.Observe, &res.acct); err != nil {
			h.refuseBody(w, r, &res, err, pol, body)
			return
		}
		bodyRead, res.bodyDone = true, true
		if err = pol.Verifier.Verify(r.Header, body, time.Now()); err != nil {
			res.keySource = keySourceDerived
			res.warn().Str("reason", err.Error()).Msg("delivery refused: its signature does not verify (verify=); nothing claimed or forwarded")
			h.refuse(w, r, &res, signatureInvalid(err), pol, body)
			return
		}
	}
	if ks := pol.Key; ks != nil {
		res.keySource = keySourceDerived
		if ks.needsBody && !bodyRead {
			// The key is in the body: it is read (and MAX_BODY_BYTES applies)
			// before the key, whether or not it holds one.
			if body, err = readBody(res.rc, r, h.opts.MaxBodyBytes, h.opts.RequestReadTimeout, pol.Observe, &res.acct); err != nil {
				h.refuseBody(w, r, &res, err, pol, body)
				return
			}
			bodyRead, res.bodyDone = true, true
		}
		key, err = ks.derive(r, body, h.opts.MaxKeyLength)
	} else {
		res.keySource = keySourceHeader
		key, err = parseKey(r.Header.Values(h.opts.KeyHeader), h.opts.MaxKeyLength)
	}
	if err != nil {
		if errors.Is(err, errNoKeyNotJSON) {
			h.noteNotJSON(&res, pol)
		}
		if a := h.keyAnswer(err, pol, r.Method); a.forwarded() {
			res.keySource = keySourceNone
			if bodyRead {
				r.Body = bodyReader(body)
			}
			h.passthrough(w, r, &res, a.outcome)
		} else {
			h.refuse(w, r, &res, a, pol, body)
		}
		return
	}
	if pol.Key == nil && !pol.Observe {
		// Stripe echoes the key on every answer to a keyed request; a key
		// derived from the message is not echoed. (The request's own
		// one-element slice: parseKey saw exactly one value.)
		w.Header()[h.opts.KeyHeader] = r.Header.Values(h.opts.KeyHeader)
	}
	if !bodyRead {
		if body, err = readBody(res.rc, r, h.opts.MaxBodyBytes, h.opts.RequestReadTimeout, pol.Observe, &res.acct); err != nil {
			h.refuseBody(w, r, &res, err, pol, body)
			return
		}
		bodyRead, res.bodyDone = true, true
	}
	// The json profile's canonical form is built in scratch memory that
	// hostile bodies make as large as ScratchBound: counted first, as a
	// body is, and refused in the same way when there is no room.
	scratch := fingerprintScratch(r, body, pol.Fingerprint)
	if scratch > 0 && !res.acct.take(scratch) {
		h.metrics.bufferFull.Inc()
		res.warn().Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
			Msg("MAX_BUFFERED_BYTES reached: no room to canonicalise the body (fingerprint=json); answered 503")
		h.refuse(w, r, &res, h.overloaded(), pol, body)
		return
	}
	fp := fingerprint(r, body, pol.Fingerprint)
	res.acct.give(scratch)
	scopeNames := h.opts.ScopeHeaders
	if pol.ScopeSet {
		scopeNames = pol.Scope
	}
	var scopeBuf [4]string
	k := claim.NewKey(scopeValues(r, scopeNames, scopeBuf[:]), key)
	res.key, res.hasKey = k, true

	lease, rec, err := h.acquire(r.Context(), k, fp, pol)
	// The replay cache counts a record it gave out until it is written
	// (rec as it is when this returns: readLarge may read another).
	defer func() { rec.Release() }()
	if err != nil {
		if pol.Observe && isLarge(err) {
			// A completed record: forwarded, and counted would_replay, without reading it.
			h.refuse(w, r, &res, answer{outcome: outcomeReplayed}, pol, body)
			return
		}
		var over bool
		if isLarge(err) {
			// The key was seen completed: a failure from here on is never
			// forwarded (FAIL_MODE=open), or it would execute again.
			pol.FailOpen = false
		}
		if lease, rec, err, over = h.readLarge(r.Context(), k, fp, pol, err, &res); over {
			h.metrics.bufferFull.Inc()
			res.warn().Hex("key_hash", res.key[:]).Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
				Msg("MAX_BUFFERED_BYTES reached: replay refused; answered 503")
			h.refuse(w, r, &res, h.overloaded(), pol, body)
			return
		}
	}
	if rec != nil {
		res.replayOf = rec.Trace
	}
	if err != nil {
		h.noteUnknown(err, &res)
	}
	switch {
	case err == nil && rec != nil && pol.Observe:
		// Forwarded, for as long as the upstream takes: the record is not
		// written, so the replay cache need not count it meanwhile.
		status := rec.Status
		rec.Release()
		rec = nil
		h.refuse(w, r, &res, answer{status: status, outcome: outcomeReplayed}, pol, body)
	case err == nil && rec != nil:
		h.replay(w, rec, &res)
	case err == nil:
		if lease.TakenOver {
			h.metrics.takeoverAge.Observe(lease.TakeoverAge.Seconds())
		}
		h.execute(w, r, body, lease, pol, &res)
	default:
		a := h.claimAnswer(err, r.Context().Err(), pol)
		switch {
		case pol.Observe:
			if a.outcome == outcomeStoreError || a.outcome == outcomeFailOpen {
				res.warn().Err(err).Hex("key_hash", res.key[:]).Msg("claim failed (Redis unavailable, or the record unreadable); forwarding (observe mode)")
			}
			h.refuse(w, r, &res, a, pol, body)
			return
		case errors.Is(err, claim.ErrBadRecord):
			res.error().Err(err).Hex("key_hash", res.key[:]).Msg("stored record cannot be decoded")
		case a.outcome == outcomeFailOpen:
			res.warn().Err(err).Hex("key_hash", res.key[:]).Msg("Redis unreachable; forwarding without idempotency guarantee (fail open)")
			r.Body = bodyReader(body)
			h.passthrough(w, r, &res, a.outcome)
			return
		case a.outcome == outcomeStoreError && claim.Unavailable(err):
			res.error().Err(err).Hex("key_hash", res.key[:]).Msg("Redis unreachable; answering 503 (fail closed)")
		case a.outcome == outcomeStoreError:
			res.error().Err(err).Hex("key_hash", res.key[:]).Msg("Redis refused the claim; answering 503")
		}
		a.write(w, &res)
	}
}

// finish writes the access log line and the metrics of one request, and
// gives the final flush of the answer a deadline of its own.
func (h *Handler) finish(r *http.Request, res *result, start time.Time) {
	h.metrics.inflight.Dec()
	res.acct.close()
	h.metrics.countRequest(res.route, res.outcome, res.keySource)
	h.metrics.count(h.metrics.responses, "responses", res.route, statusText(res.status))
	res.arm() // for the final flush, after the handler returns
	res.boundBody()
	ev := res.info()
	if !ev.Enabled() {
		return // (LOG_LEVEL above info: not even the clock is read)
	}
	ev = ev.Str("method", r.Method).
		Str("route", res.route).
		Int("status", res.status).
		Str("outcome", res.outcome).
		Str("key_source", res.keySource)
	if res.hasKey {
		ev = ev.Hex("key_hash", res.key[:])
	}
	if res.upstreamMS >= 0 {
		ev = ev.Float64("upstream_ms", res.upstreamMS)
	}
	ev.Float64("total_ms", float64(time.Since(start).Microseconds())/1000).Msg("request")
}

// noteNotJSON counts a request whose key could not be read because its
// body is not JSON, and warns once per route: a sender that always sends
// such bodies (a byte-order mark, gzip) is never protected, silently.
func (h *Handler) noteNotJSON(res *result, pol Policy) {
	h.metrics.countKey([4]string{"body_not_json", res.route}, func() prometheus.Counter {
		return h.metrics.bodyNotJSON.WithLabelValues(res.route)
	})
	if _, warned := h.notJSONWarned.LoadOrStore(res.route, true); !warned {
		res.warn().Str("route", res.route).Str("key", pol.Key.Text).
			Msg("the key of this route is read from a JSON body, and a body that is not JSON arrived (a byte-order mark, Content-Encoding, a form?): such requests have no key and run without protection; counted in idemproxy_key_body_not_json_total, warned once per route")
	}
}

// noteUnknown counts a key that this request found with its lock expired
// and held as unknown. (A function of its own: the variable errors.As
// fills escapes, and must not cost an allocation on every request.)
func (h *Handler) noteUnknown(err error, res *result) {
	var unknown *claim.UnknownError
	if errors.As(err, &unknown) && unknown.Entered {
		h.metrics.unknownOutcomes.WithLabelValues(causeLockExpired).Inc()
		res.warn().Hex("key_hash", res.key[:]).
			Msg("in-flight claim's lock expired without an answer (its proxy stopped, or lost Redis); key held as unknown (ON_UNKNOWN=hold) until an operator purges it")
	}
}

// refuse answers a request the proxy does not execute under its key: with
// enforce, a writes its problem; in observe mode the request is forwarded
// unchanged instead (body is what was read of it, the rest still follows
// on the connection) and counted as what enforcing would have answered.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, res *result, a answer, pol Policy, body []byte) {
	if pol.Observe {
		if outcome, ok := observeAnswer(a); ok {
			unreadBody(r, body)
			h.passthrough(w, r, res, outcome)
			return
		}
	}
	a.write(w, res)
}

// refuseBody answers a keyed request whose body was not buffered (err is
// readBody's).
func (h *Handler) refuseBody(w http.ResponseWriter, r *http.Request, res *result, err error, pol Policy, body []byte) {
	switch {
	case !errors.Is(err, errOverBudget):
	case pol.Observe:
		res.warn().Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
			Msg("MAX_BUFFERED_BYTES reached: keyed request forwarded unbuffered (observe mode; enforcing would answer 503)")
	default:
		h.metrics.bufferFull.Inc()
		res.warn().Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
			Msg("MAX_BUFFERED_BYTES reached: keyed request not let in; answered 503")
	}
	h.refuse(w, r, res, h.bodyAnswer(err, pol), pol, body)
}

// acquire claims the key; with a wait policy, a duplicate of an in-flight
// request polls until the first completes (replay), is released or expires
// (we claim it), or the wait runs out (ErrInFlight).
func (h *Handler) acquire(ctx context.Context, k claim.Key, fp claim.Fingerprint, pol Policy) (*claim.Lease, *claim.Record, error) {
	// The claim must not be cut by a client leaving halfway through: a claim
	// written but never answered would hold the key for its lock TTL.
	sctx := context.WithoutCancel(ctx)
	terms := claim.Terms{LockTTL: pol.LockTTL, TTL: pol.TTL, Hold: pol.Hold}
	if h.opts.MaxBufferedBytes > 0 {
		terms.MaxReplay = maxInlineReplay
	}
	lease, rec, err := h.store.Acquire(sctx, k, fp, terms)
	if pol.Wait <= 0 || pol.Observe || !errors.Is(err, claim.ErrInFlight) {
		return lease, rec, err
	}
	deadline := time.NewTimer(pol.Wait)
	defer deadline.Stop()
	backoff := 5 * time.Millisecond
	for {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-deadline.C:
			t.Stop()
			return nil, nil, claim.ErrInFlight
		case <-h.stopWaits:
			t.Stop()
			return nil, nil, claim.ErrInFlight
		case <-t.C:
		}
		lease, rec, err = h.store.Acquire(sctx, k, fp, terms)
		if !errors.Is(err, claim.ErrInFlight) {
			return lease, rec, err
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// maxInlineReplay is the largest record a claim's reply may carry. A larger
// one is read by readLarge once MAX_BUFFERED_BYTES has counted it: else
// every concurrent replay would hold a record of up to
// MAX_STORED_RESPONSE_BYTES before it is counted. (A replay up to it holds
// about twice it uncounted while it decodes: the reply and the record.)
const maxInlineReplay = 16 << 10

// readLarge reads the record of a claim whose reply left it out for its
// size (a *claim.LargeRecordError; any other err is returned as it is):
// it counts that size in the request's account, under the rule that lets a
// replay in (over is true when there is no room: nothing was read), then
// claims again with a reply bounded to it (counted twice while it is read
// and decoded). The key may have changed in
// between (purged, and claimed or recorded anew): what comes back is
// answered as any claim's result, and a size counted for nothing is given
// back.
func (h *Handler) readLarge(ctx context.Context, k claim.Key, fp claim.Fingerprint, pol Policy, err error, res *result) (_ *claim.Lease, _ *claim.Record, _ error, over bool) {
	var large *claim.LargeRecordError
	for tries := 0; errors.As(err, &large); tries++ {
		if tries == 3 {
			// The record changed at every read: answered as a store that
			// cannot serve it (503, retry), never executed.
			return nil, nil, err, false
		}
		if !res.acct.admit(large.Size) {
			return nil, nil, nil, true
		}
		terms := claim.Terms{LockTTL: pol.LockTTL, TTL: pol.TTL, Hold: pol.Hold, MaxReplay: large.Size}
		// While it is decoded, the reply and the record are held at once.
		res.acct.force(large.Size)
		lease, rec, aerr := h.store.Acquire(context.WithoutCancel(ctx), k, fp, terms)
		res.acct.give(large.Size)
		if rec == nil || rec.Cached {
			res.acct.give(large.Size)
		} else {
			res.replayCounted = true
		}
		if errors.Is(aerr, claim.ErrInFlight) && pol.Wait > 0 {
			// Purged and claimed anew in between: waited for as any
			// duplicate is (a large answer comes back as an error again).
			lease, rec, aerr = h.acquire(ctx, k, fp, pol)
		}
		if !errors.As(aerr, &large) {
			return lease, rec, aerr, false
		}
		err = aerr
	}
	return nil, nil, err, false
}

func isLarge(err error) bool {
	var large *claim.LargeRecordError
	return errors.As(err, &large)
}

// replayedTrue is shared by every replay; nothing appends to it.
var replayedTrue = []string{"true"}[:1:1]

// scopeValues returns the scope headers' values of r (see ScopeValues).
func scopeValues(r *http.Request, names, buf []string) []string {
	return ScopeValues(r.Header, r.Host, names, buf)
}

// replay writes a recorded answer (under the write deadline ServeHTTP set:
// a client that never reads must not hold the handler).
func (h *Handler) replay(w http.ResponseWriter, rec *claim.Record, res *result) {
	// The record is held while the client reads it (up to UPSTREAM_TIMEOUT
	// per write): counted, and let in under a new request's rule, or clients
	// that ask for large replays and never read could hold any amount. One
	// the replay cache keeps holds nothing more, nor does an empty one.
	if n := len(rec.Body); n > 0 && !rec.Cached && !res.replayCounted && !res.acct.admit(int64(n)) {
		h.metrics.bufferFull.Inc()
		res.warn().Hex("key_hash", res.key[:]).Int("body_bytes", len(rec.Body)).Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
			Msg("MAX_BUFFERED_BYTES reached: replay refused; answered 503")
		h.overloaded().write(w, res)
		return
	}
	hdr := w.Header()
	hdr["Idempotent-Replayed"] = replayedTrue
	if rec.BodyNotStored {
		notStoredAnswer(rec.Status).write(w, res)
		return
	}
	res.status, res.outcome = rec.Status, outcomeReplayed
	// The proxy's own headers win over the recorded ones, as on the first
	// answer: this answer's request id, and the key echo where there is one.
	keep := proxyHeaders(hdr, h.opts.KeyHeader)
	copyRecordable(hdr, rec.Header)
	keep.restore(hdr)
	if len(rec.Trailer) > 0 {
		// Trailers need a chunked body: no length, and announced up front.
		delete(hdr, "Content-Length")
		for name := range rec.Trailer {
			hdr.Add("Trailer", name)
		}
	}
	res.arm()
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body) // a failed write means the client left; it can retry
	for name, vv := range rec.Trailer {
		hdr[name] = vv
	}
}
