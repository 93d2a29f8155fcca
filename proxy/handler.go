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
			h.bodyAnswerOrObserve(w, r, &res, err, pol, body)
			return
		}
		bodyRead, res.bodyDone = true, true
		if err = pol.Verifier.Verify(r.Header, body, time.Now()); err != nil {
			res.keySource = keySourceDerived
			res.warn().Str("reason", err.Error()).Msg("delivery refused: its signature does not verify (verify=); nothing claimed or forwarded")
			h.answerOrObserve(w, r, &res, signatureInvalid(err), pol, body)
			return
		}
	}
	if ks := pol.Key; ks != nil {
		res.keySource = keySourceDerived
		if ks.needsBody && !bodyRead {
			// The key is in the body: it is read (and MAX_BODY_BYTES applies)
			// before the key, whether or not it holds one.
			if body, err = readBody(res.rc, r, h.opts.MaxBodyBytes, h.opts.RequestReadTimeout, pol.Observe, &res.acct); err != nil {
				h.bodyAnswerOrObserve(w, r, &res, err, pol, body)
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
			h.answerOrObserve(w, r, &res, a, pol, body)
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
			h.bodyAnswerOrObserve(w, r, &res, err, pol, body)
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
		h.answerOrObserve(w, r, &res, h.overloaded(), pol, body)
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
			h.answerOrObserve(w, r, &res, answer{outcome: outcomeReplayed}, pol, body)
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
			h.answerOrObserve(w, r, &res, h.overloaded(), pol, body)
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
		h.answerOrObserve(w, r, &res, answer{status: status, outcome: outcomeReplayed}, pol, body)
	case err == nil && rec != nil:
		h.replay(w, rec, &res)
	case err == nil:
		if lease.TakenOver {
			// Said whatever this request's own outcome: if the claim it
			// takes over had reached the upstream, the key executes again
			// here, and a takeover whose forward is then released (5xx) or
			// fails must not leave that unannounced.
			h.metrics.takeoverAge.Observe(lease.TakeoverAge.Seconds())
			res.warn().Hex("key_hash", res.key[:]).Dur("claim_age", lease.TakeoverAge).
				Msg("took over an in-flight claim whose lock had expired (its proxy stopped, or its outcome was unknown): if that request reached the upstream, this key executes again")
		}
		h.execute(w, r, body, lease, pol, &res)
	default:
		a := h.claimAnswer(err, r.Context().Err(), pol)
		switch {
		case pol.Observe:
			if a.outcome == outcomeStoreError || a.outcome == outcomeFailOpen {
				res.warn().Err(err).Hex("key_hash", res.key[:]).Msg("claim failed (Redis unavailable, or the record unreadable); forwarding (observe mode)")
			}
			h.answerOrObserve(w, r, &res, a, pol, body)
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

// answerOrObserve answers a request the proxy does not execute under its
// key: with enforce, a writes its problem; in observe mode the request is
// forwarded unchanged instead (body is what was read of it, the rest still
// follows on the connection) and counted as what enforcing would have
// answered.
func (h *Handler) answerOrObserve(w http.ResponseWriter, r *http.Request, res *result, a answer, pol Policy, body []byte) {
	if pol.Observe {
		if outcome, ok := observeAnswer(a); ok {
			unreadBody(r, body)
			h.passthrough(w, r, res, outcome)
			return
		}
	}
	a.write(w, res)
}

// bodyAnswerOrObserve answers a keyed request whose body was not buffered (err is
// readBody's).
func (h *Handler) bodyAnswerOrObserve(w http.ResponseWriter, r *http.Request, res *result, err error, pol Policy, body []byte) {
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
	h.answerOrObserve(w, r, res, h.bodyAnswer(err, pol), pol, body)
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

// scopeValues returns the scope headers' values of r (see ScopeValues).
func scopeValues(r *http.Request, names, buf []string) []string {
	return ScopeValues(r.Header, r.Host, names, buf)
}
