// Package proxy is the HTTP side of idemproxy: it matches ROUTES policies,
// checks keys and bodies, fingerprints requests, forwards them once through
// httputil.ReverseProxy, records their answers and replays them.
package proxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/hlog"

	"github.com/idemproxy/idemproxy/claim"
)

// Store claims keys; *claim.Store implements it.
type Store interface {
	Acquire(ctx context.Context, key claim.Key, fp claim.Fingerprint, lockTTL, markTTL time.Duration) (*claim.Lease, *claim.Record, error)
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
	ScopeHeaders   []string
	// UpstreamTimeout bounds a keyed upstream call, the wait for any
	// forwarded request's response headers (with the default Transport), and
	// each write to a client.
	UpstreamTimeout time.Duration
	// RequestReadTimeout bounds the arrival of a keyed request's whole body,
	// and each read of a streamed pass-through body.
	RequestReadTimeout time.Duration
	Transport          http.RoundTripper // nil: NewTransport() with ResponseHeaderTimeout = UpstreamTimeout
	Logger             zerolog.Logger    // for errors outside a request
	Metrics            *Metrics          // nil: metrics are registered nowhere
}

// Handler is the idempotency proxy.
type Handler struct {
	store    Store
	opts     Options
	router   *router
	methods  map[string]bool
	rp       *httputil.ReverseProxy
	metrics  *Metrics
	titleUse string // IETF draft titles, with the configured header name
	titleOut string
	titleMis string

	stopWaits     chan struct{} // closed by StopWaiting
	stopWaitsOnce sync.Once
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

		stopWaits: make(chan struct{}),
	}
	for _, m := range opts.Methods {
		h.methods[m] = true
	}
	h.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(opts.Upstream)
			pr.SetXForwarded()
			hideIdempotencyKey(pr.Out.Header)
			// ReverseProxy sends an empty body as nil, and the Transport then
			// resends a written GET/HEAD/OPTIONS/TRACE without asking GetBody.
			if _, keyed := pr.Out.Context().Value(exchangeKey{}).(*exchange); keyed && pr.Out.Body == nil {
				pr.Out.Body = io.NopCloser(strings.NewReader(""))
			}
		},
		Transport:      opts.Transport,
		BufferPool:     NewBufferPool(),
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.errorHandler,
		ErrorLog:       log.New(opts.Logger, "", 0),
	}
	return h, nil
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
	route      string
	outcome    string
	status     int
	keyHash    string
	upstreamMS float64
	// deadline is set when a write deadline was put on the connection: the
	// answer is flushed under it and it is then lifted, after the access log
	// and the metrics, so that the next request on the connection does not
	// inherit it.
	deadline *http.ResponseController
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.metrics.inflight.Inc()
	res := result{route: "default", upstreamMS: -1}
	defer func() {
		h.metrics.inflight.Dec()
		h.metrics.count(h.metrics.requests, "requests", res.route, res.outcome)
		h.metrics.count(h.metrics.responses, "responses", res.route, statusText(res.status))
		ev := hlog.FromRequest(r).Info().
			Str("method", r.Method).
			Str("route", res.route).
			Int("status", res.status).
			Str("outcome", res.outcome)
		if res.keyHash != "" {
			ev = ev.Str("key_hash", res.keyHash)
		}
		if res.upstreamMS >= 0 {
			ev = ev.Float64("upstream_ms", res.upstreamMS)
		}
		ev.Float64("total_ms", float64(time.Since(start).Microseconds())/1000).Msg("request")
		if res.deadline != nil {
			_ = res.deadline.Flush()
			_ = res.deadline.SetWriteDeadline(time.Time{})
		}
	}()

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
			res.outcome = outcomePassthrough
			h.passthrough(w, r, &res)
			return
		default:
			res.outcome, res.status = outcomeInvalid, http.StatusBadRequest
			writeProblem(w, res.status, typeUpgradeRefused, "Protocol upgrade not allowed",
				"This route does not allow switching protocols (Upgrade: "+upgrade+").")
			return
		}
	}
	if !pol.Covered || pol.Off {
		res.outcome = outcomePassthrough
		h.passthrough(w, r, &res)
		return
	}

	key, err := parseKey(r.Header.Values(h.opts.KeyHeader), h.opts.MaxKeyLength)
	switch {
	case errors.Is(err, errNoKey) && pol.Required:
		res.outcome, res.status = outcomeInvalid, http.StatusBadRequest
		writeProblem(w, res.status, typeKeyMissing, h.titleMis,
			"This route requires an "+h.opts.KeyHeader+" header on "+r.Method+" requests.")
		return
	case errors.Is(err, errNoKey):
		res.outcome = outcomeNoKey
		h.passthrough(w, r, &res)
		return
	case err != nil:
		res.outcome, res.status = outcomeInvalid, http.StatusBadRequest
		writeProblem(w, res.status, typeKeyInvalid, h.opts.KeyHeader+" is invalid", err.Error()+".")
		return
	}
	// Stripe echoes the key on every answer to a keyed request.
	// (The request's own one-element slice: parseKey saw exactly one value.)
	w.Header()[h.opts.KeyHeader] = r.Header.Values(h.opts.KeyHeader)

	body, err := readBody(w, r, h.opts.MaxBodyBytes, h.opts.RequestReadTimeout)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			res.outcome, res.status = outcomeTooLarge, http.StatusRequestEntityTooLarge
			writeProblem(w, res.status, typeBodyTooLarge, "Request body is too large",
				fmt.Sprintf("Requests with an %s may carry at most %d bytes.", h.opts.KeyHeader, h.opts.MaxBodyBytes))
			return
		}
		if errors.Is(err, errBodyTimeout) {
			res.outcome, res.status = outcomeInvalid, http.StatusRequestTimeout
			w.Header().Set("Connection", "close")
			writeProblem(w, res.status, typeRequestTimeout, "Request body not received in time",
				fmt.Sprintf("The request body did not arrive within %v. Nothing was executed; retry with the same key.", h.opts.RequestReadTimeout))
			return
		}
		res.outcome, res.status = outcomeInvalid, http.StatusBadRequest
		writeProblem(w, res.status, typeBodyUnreadable, "Request body could not be read", err.Error())
		return
	}
	fp := fingerprint(r, body)
	var scopeBuf [4]string
	k := claim.NewKey(h.scope(r, scopeBuf[:]), key)
	res.keyHash = k.String()

	lease, rec, err := h.acquire(r.Context(), k, fp, pol)
	switch {
	case err == nil && rec != nil:
		res.outcome = outcomeReplayed
		res.status = h.replay(w, rec, &res)
	case err == nil:
		res.outcome = outcomeExecuted
		if lease.TakenOver {
			res.outcome = outcomeTakeover
			h.metrics.takeoverAge.Observe(lease.TakeoverAge.Seconds())
		}
		h.execute(w, r, body, lease, pol, &res)
	case errors.Is(err, claim.ErrOtherUpstream):
		res.outcome, res.status = outcomeMismatch, http.StatusUnprocessableEntity
		writeProblem(w, res.status, typeKeyReused, h.titleUse,
			"This key was first used for a request to another upstream service.")
	case errors.Is(err, claim.ErrMismatch):
		res.outcome, res.status = outcomeMismatch, http.StatusUnprocessableEntity
		writeProblem(w, res.status, typeKeyReused, h.titleUse,
			"This key was first used for a request with another method, path, query or body.")
	case errors.Is(err, claim.ErrInFlight):
		res.outcome, res.status = outcomeInFlight, http.StatusConflict
		writeProblem(w, res.status, typeRequestOutstanding, h.titleOut,
			"The first request with this key has not finished yet; retry later to get its answer.")
	case errors.Is(err, claim.ErrBadRecord):
		// Not an outage: failing open here would execute a completed key again.
		res.outcome, res.status = outcomeStoreError, http.StatusInternalServerError
		hlog.FromRequest(r).Error().Err(err).Str("key_hash", res.keyHash).Msg("stored record cannot be decoded")
		writeProblem(w, res.status, typeRecordUnreadable, "Stored response cannot be read",
			"A response was recorded for this key but cannot be decoded (written by an incompatible version?). It is not executed again.")
	case r.Context().Err() != nil:
		// The client left while we waited; nothing was claimed.
		res.outcome, res.status = outcomeInFlight, 499
	case pol.FailOpen && claim.Unavailable(err):
		// Only an outage: a Redis that answers but refuses (out of memory
		// under noeviction) is no reason to drop the guarantee.
		res.outcome = outcomeFailOpen
		hlog.FromRequest(r).Warn().Err(err).Str("key_hash", res.keyHash).
			Msg("Redis unreachable; forwarding without idempotency guarantee (fail open)")
		r.Body = bodyReader(body)
		h.passthrough(w, r, &res)
	default:
		res.outcome, res.status = outcomeStoreError, http.StatusServiceUnavailable
		msg := "Redis unreachable; answering 503 (fail closed)"
		if !claim.Unavailable(err) {
			msg = "Redis refused the claim; answering 503"
		}
		hlog.FromRequest(r).Error().Err(err).Str("key_hash", res.keyHash).Msg(msg)
		writeProblem(w, res.status, typeStoreUnavailable, "Idempotency store is unavailable",
			"The request was not forwarded. Retry later with the same key.")
	}
}

// acquire claims the key; with a wait policy, a duplicate of an in-flight
// request polls until the first completes (replay), is released or expires
// (we claim it), or the wait runs out (ErrInFlight).
func (h *Handler) acquire(ctx context.Context, k claim.Key, fp claim.Fingerprint, pol Policy) (*claim.Lease, *claim.Record, error) {
	// The claim must not be cut by a client leaving halfway through: a claim
	// written but never answered would hold the key for its lock TTL.
	sctx := context.WithoutCancel(ctx)
	lease, rec, err := h.store.Acquire(sctx, k, fp, pol.LockTTL, pol.TTL)
	if pol.Wait <= 0 || !errors.Is(err, claim.ErrInFlight) {
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
		lease, rec, err = h.store.Acquire(sctx, k, fp, pol.LockTTL, pol.TTL)
		if !errors.Is(err, claim.ErrInFlight) {
			return lease, rec, err
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// fingerprint is SHA-256 over the method, the escaped path, the raw query as
// sent (not reordered) and the body; NUL separates the fields, which none of
// the first three can contain.
func fingerprint(r *http.Request, body []byte) claim.Fingerprint {
	var stack [4096]byte // small requests are hashed in one go, without allocating
	b := append(stack[:0], r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	b = append(b, 0)
	b = append(b, r.URL.RawQuery...)
	b = append(b, 0)
	if len(b)+len(body) <= len(stack) {
		return sha256.Sum256(append(b, body...))
	}
	h := sha256.New()
	h.Write(b)
	h.Write(body)
	var fp claim.Fingerprint
	h.Sum(fp[:0])
	return fp
}

// replayedTrue is shared by every replay; nothing appends to it.
var replayedTrue = []string{"true"}[:1:1]

// scope returns the SCOPE_HEADERS values, one entry per header (all its
// values joined), "" for an absent header.
func (h *Handler) scope(r *http.Request, buf []string) []string {
	vals := buf[:0]
	for range h.opts.ScopeHeaders {
		vals = append(vals, "")
	}
	for i, name := range h.opts.ScopeHeaders {
		switch vv := r.Header.Values(name); len(vv) {
		case 0:
		case 1:
			vals[i] = vv[0]
		default:
			vals[i] = strings.Join(vv, "\n")
		}
	}
	return vals
}

// replay writes a recorded answer, within UPSTREAM_TIMEOUT: a client that
// never reads must not hold the handler.
func (h *Handler) replay(w http.ResponseWriter, rec *claim.Record, res *result) int {
	hdr := w.Header()
	hdr["Idempotent-Replayed"] = replayedTrue
	if rec.BodyNotStored {
		writeProblem(w, rec.Status, typeResponseNotStored, "Original response too large to replay",
			"The first request with this key was executed and answered with status "+strconv.Itoa(rec.Status)+
				", but its response body was too large, streaming, or cut off to be recorded. It is not executed again.")
		return rec.Status
	}
	echo := hdr.Values(h.opts.KeyHeader)
	copyRecordable(hdr, rec.Header)
	hdr[h.opts.KeyHeader] = echo
	if len(rec.Trailer) > 0 {
		// Trailers need a chunked body: no length, and announced up front.
		delete(hdr, "Content-Length")
		for name := range rec.Trailer {
			hdr.Add("Trailer", name)
		}
	}
	if rc := http.NewResponseController(w); rc.SetWriteDeadline(time.Now().Add(h.opts.UpstreamTimeout)) == nil {
		res.deadline = rc
	}
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body) // a failed write means the client left; it can retry
	for name, vv := range rec.Trailer {
		hdr[name] = vv
	}
	return rec.Status
}

// passthrough forwards without any idempotency handling, streaming the body
// both ways. A request body must keep arriving (REQUEST_READ_TIMEOUT between
// reads) and the client must keep reading the answer (UPSTREAM_TIMEOUT per
// write); a stream that flows is never cut.
func (h *Handler) passthrough(w http.ResponseWriter, r *http.Request, res *result) {
	rc := http.NewResponseController(w)
	sw := &statusWriter{ResponseWriter: w, keep: proxyHeaders(w.Header(), h.opts.KeyHeader), rc: rc, writeTimeout: h.opts.UpstreamTimeout}
	if r.Body != nil && r.Body != http.NoBody {
		sw.body = &idleBody{ReadCloser: r.Body, rc: rc, timeout: h.opts.RequestReadTimeout}
		r.Body = sw.body
	}
	defer func() { // also when ReverseProxy aborts (panics) mid-body
		res.status = sw.status
		if res.status == 0 {
			res.status = http.StatusBadGateway
		}
		if sw.deadlines {
			_ = rc.SetWriteDeadline(time.Now().Add(h.opts.UpstreamTimeout))
			res.deadline = rc
		}
		if sw.body != nil {
			_ = rc.SetReadDeadline(time.Time{})
		}
	}()
	h.rp.ServeHTTP(sw, r)
}

// proxyHeaders are the headers the proxy itself set on the answer before
// forwarding (request id, key echo). ReverseProxy clears the header map after
// relaying a 1xx answer; the final answer gets them back.
type savedHeaders struct {
	requestID, echo []string
	echoName        string
}

func proxyHeaders(h http.Header, echoName string) savedHeaders {
	return savedHeaders{requestID: h["X-Request-Id"], echo: h[echoName], echoName: echoName}
}

func (s savedHeaders) restore(h http.Header) {
	if s.requestID != nil && h["X-Request-Id"] == nil {
		h["X-Request-Id"] = s.requestID
	}
	if s.echo != nil {
		h[s.echoName] = s.echo // set, not added: an upstream echo must not double it
	}
}

// statusWriter remembers the status for the access log and puts a write
// deadline on each write; Unwrap lets ReverseProxy flush and hijack
// (protocol upgrades) through it.
type statusWriter struct {
	http.ResponseWriter
	status       int
	keep         savedHeaders
	rc           *http.ResponseController
	writeTimeout time.Duration
	deadlines    bool      // a write deadline was set
	body         *idleBody // the request body, when there is one
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
		s.keep.restore(s.ResponseWriter.Header())
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	s.deadlines = s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout)) == nil || s.deadlines
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// errorHandler gets the upstream round-trip failures. For a keyed exchange it
// only notes the error: execute decides what to answer and what to do with
// the claim. For a pass-through it answers directly.
func (h *Handler) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if ex, ok := w.(*exchange); ok {
		ex.upErr = err
		return
	}
	if sw, ok := w.(*statusWriter); ok && sw.body != nil && sw.body.timedOut.Load() {
		hlog.FromRequest(r).Warn().Err(err).Msg("request body stalled; forward abandoned")
		w.Header().Set("Connection", "close")
		writeProblem(w, http.StatusRequestTimeout, typeRequestTimeout, "Request body not received in time",
			fmt.Sprintf("The request body stopped arriving for %v.", h.opts.RequestReadTimeout))
		return
	}
	status, typ, title := classifyUpstreamError(err, !isDialError(err))
	hlog.FromRequest(r).Warn().Err(err).Int("status", status).Msg("upstream request failed")
	// The error text stays in the log: it names internal addresses.
	writeProblem(w, status, typ, title, title+".")
}

// classifyUpstreamError maps a round-trip failure to an answer. A request
// that never reached the upstream (no connection obtained, or the dial
// failed) is "unreachable" (502) even when the dial ran into the timeout.
func classifyUpstreamError(err error, mayHaveLeft bool) (int, string, string) {
	if !mayHaveLeft {
		return http.StatusBadGateway, typeUpstreamUnreachable, "Upstream is unreachable"
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return http.StatusGatewayTimeout, typeUpstreamTimeout, "Upstream timed out"
	}
	return http.StatusBadGateway, typeUpstreamFailed, "Upstream connection failed"
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (h *Handler) modifyResponse(res *http.Response) error {
	if ex, ok := res.Request.Context().Value(exchangeKey{}).(*exchange); ok {
		ex.upstreamResponse(res)
	}
	return nil
}
