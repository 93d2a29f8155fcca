package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

type exchangeKey struct{}

var errRequestSent = errors.New("proxy: request already written to the upstream; not resending it")

// exchange is the ResponseWriter ReverseProxy writes a claimed request's
// answer to. It tees the body to the client and to a bounded buffer. A failed
// client write is remembered and later writes to the client are dropped, but
// the copy goes on: ReverseProxy aborts the copy on a write error, and the
// answer must be recorded so that the client's retry gets a replay.
type exchange struct {
	w         http.ResponseWriter
	max       int64
	buf       *bytes.Buffer
	noBody    bool           // body too large or streaming: recorded without it
	status    int            // upstream status (from ModifyResponse)
	header    http.Header    // upstream headers, hop-by-hop removed by ReverseProxy
	res       *http.Response // its Trailer is filled once the body has been read
	headersAt time.Time
	wrote     bool
	clientErr error
	upErr     error
	gotConn   atomic.Bool // a connection was obtained: the request may have left
	sent      atomic.Bool // the request's headers were written (to the Transport's buffer)
	// The connection of the current attempt, when NewTransport dialed it,
	// and its write count when the attempt got it (see rewind).
	conn     atomic.Pointer[countingConn]
	connMark atomic.Int64
	// An earlier attempt may have left (see gotConnection).
	leftBefore atomic.Bool
	keep       savedHeaders
	onHeaders  func() // arms the slow-client write deadline
	http10     bool   // the client speaks HTTP/1.0: no 1xx
	body       answerBody
	// acct is the request's share of MAX_BUFFERED_BYTES; the copy counts
	// the memory it holds there (counted: its buffer's capacity).
	acct    *account
	counted int64
}

// capturePool holds the copies' buffers. One that grew past maxPooledCapture
// is left to the collector: kept, every request in flight could hold a
// buffer as large as the largest answer before it, uncounted.
var capturePool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledCapture = 16 << 10

func (ex *exchange) Header() http.Header { return ex.w.Header() }

func (ex *exchange) WriteHeader(code int) {
	if ex.wrote {
		return
	}
	if code < 200 { // informational (103 Early Hints): pass on, not recorded
		if ex.clientErr == nil && !ex.http10 { // never to HTTP/1.0 (RFC 9110 section 15.2)
			// Under the slow-client deadline, as every write of the answer:
			// the Transport relays a 1xx from the goroutine that reads the
			// upstream's answer, and a client that does not take it must not
			// keep the final answer unread past UPSTREAM_TIMEOUT (then
			// unrecorded, and the retry gets 409 instead of a replay).
			if ex.onHeaders != nil {
				ex.onHeaders()
			}
			ex.w.WriteHeader(code)
		}
		return
	}
	ex.wrote = true
	if ex.status == 0 {
		ex.status = code
	}
	ex.keep.restore(ex.w.Header())
	if ex.onHeaders != nil {
		ex.onHeaders()
	}
	ex.w.WriteHeader(code)
}

func (ex *exchange) Write(p []byte) (int, error) {
	if !ex.wrote {
		ex.WriteHeader(http.StatusOK)
	}
	if !ex.noBody {
		if ex.buf == nil {
			// Taken at the first byte: a request whose upstream has not
			// answered yet holds no buffer.
			ex.buf = capturePool.Get().(*bytes.Buffer)
			ex.buf.Reset()
		}
		if int64(ex.buf.Len()+len(p)) > ex.max {
			ex.dropCopy()
		} else {
			ex.buf.Write(p)
			// Counted, never refused: the request has executed, and its
			// answer is recorded whole (budget).
			if c := int64(ex.buf.Cap()); c > ex.counted {
				ex.acct.force(c - ex.counted)
				ex.counted = c
			}
		}
	}
	if ex.clientErr == nil {
		// Each write gets half of the time left: a client that keeps up is
		// never cut, one that stalls is cut while there is still time to
		// read the rest of the answer and record it.
		if ex.onHeaders != nil {
			ex.onHeaders()
		}
		if _, err := ex.w.Write(p); err != nil {
			ex.clientErr = err
		}
	}
	return len(p), nil
}

// dropCopy gives up the copy: the answer is recorded without its body, and
// the copy's memory goes (to the collector, and back to the budget) at once,
// not when a long stream ends.
func (ex *exchange) dropCopy() {
	ex.noBody = true
	ex.buf = nil
	ex.acct.give(ex.counted)
	ex.counted = 0
}

// releaseCopy lets go of the copy once the record is encoded: its buffer
// goes back to the pool (or to the collector) and its count to the budget.
func (ex *exchange) releaseCopy() {
	ex.putCopy()
	ex.acct.give(ex.counted)
	ex.counted = 0
}

// putCopy gives the copy's buffer back to the pool, unless it grew too
// large to keep.
func (ex *exchange) putCopy() {
	if ex.buf != nil && ex.buf.Cap() <= maxPooledCapture {
		capturePool.Put(ex.buf)
	}
	ex.buf = nil
}

// FlushError is what http.ResponseController (used by ReverseProxy) calls.
// It never fails, for the same reason Write never does.
func (ex *exchange) FlushError() error {
	if ex.clientErr == nil {
		if err := http.NewResponseController(ex.w).Flush(); err != nil {
			ex.clientErr = err
		}
	}
	return nil
}

// gotConnection is the trace's GotConn: the Transport got a connection for
// an attempt (each attempt gets its own, a resend too), and the request may
// leave from now on.
func (ex *exchange) gotConnection(info httptrace.GotConnInfo) {
	if ex.gotConn.Load() {
		// A resend the Transport made without asking GetBody (an empty body
		// goes as NoBody, which it resends on a nothing-written error without
		// rewinding): the earlier attempt's connection says whether the
		// request may have left already; unknown (not counted) means it may.
		if prev := ex.conn.Load(); prev == nil || prev.written() != ex.connMark.Load() {
			ex.leftBefore.Store(true)
		}
	}
	ex.gotConn.Store(true)
	c := writeCounter(info.Conn)
	if c != nil {
		ex.connMark.Store(c.written())
	}
	ex.conn.Store(c)
}

// rewind reports whether the request may be sent again, on a new
// connection, after the attempt on the last connection failed: the
// Transport asks it (through GetBody) before any resend. It may only when
// not one byte reached that connection's socket since the attempt got it.
// Then the upstream has nothing of this request, and the attempt is
// forgotten: the request has not left, so a resend that gets no connection
// is "not sent" again. A short write, TLS records, even the close_notify
// crypto/tls sends as the Transport closes the connection: all count as
// written, and the request may have been executed. On a connection that
// does not count its writes (a Transport that does not dial through
// NewTransport), it may only before the request reached the Transport's
// buffer (WroteHeaders): in practice never, as before.
//
// It guards whatever the Transport's reason to resend: a nothing-written
// error on a reused connection (the Transport's own count, which a layer
// such as crypto/tls may report as 0 after part of a record left), and the
// read errors on which the Transport resends, after writing it, a request
// it deems replayable (GET, HEAD, OPTIONS, TRACE, or an Idempotency-Key
// header in canonical form).
func (ex *exchange) rewind() bool {
	c := ex.conn.Swap(nil)
	if c == nil {
		return !ex.sent.Load()
	}
	// The Transport asks once the connection's write loop has returned and
	// the connection is closed; a write still under way would show anyway.
	if c.written() != ex.connMark.Load() {
		return false
	}
	ex.sent.Store(false)
	ex.gotConn.Store(false)
	return true
}

// left reports, once the Transport has returned err, whether the request
// may have reached the upstream. On a connection that counts its writes the
// counts decide: a byte reached its socket since the attempt got it (or an
// earlier attempt's did). net/http returns a round trip's error only after
// that connection's write loop has ended, so the count is final; a resend's
// failed dial says nothing of what an earlier attempt wrote. Where nothing
// is counted (a Transport of the caller's own), a connection obtained means
// it may have, unless the last error is a failed dial and no earlier
// attempt may have.
func (ex *exchange) left(err error) bool {
	if ex.leftBefore.Load() {
		return true
	}
	if !ex.gotConn.Load() {
		return false
	}
	if c := ex.conn.Load(); c != nil {
		return c.written() != ex.connMark.Load()
	}
	return !isDialError(err)
}

func (ex *exchange) upstreamResponse(res *http.Response) {
	ex.status = res.StatusCode
	ex.header = res.Header
	ex.res = res
	ex.headersAt = time.Now()
	ex.body.wrap(res)
	// The upstream's headers (up to net/http's 10 MiB) are held until the
	// request ends, beside the answer's copy and then its encoding: counted
	// when large (ordinary ones, as a connection's buffers, are not).
	if n := headerBytes(res.Header); n > countedHeaderBytes {
		ex.acct.force(n)
	}
	if res.ContentLength > ex.max || isEventStream(res.Header.Get("Content-Type")) {
		ex.noBody = true
	}
}

// countedHeaderBytes: an answer's headers above this are counted in
// MAX_BUFFERED_BYTES (README: "and an answer's headers, when above 16 KiB").
const countedHeaderBytes = 16 << 10

// headerBytes is about what h holds: its names, values and value slices.
func headerBytes(h http.Header) int64 {
	var n int64
	for k, vv := range h {
		n += int64(len(k)) + 24
		for _, v := range vv {
			n += int64(len(v)) + 16
		}
	}
	return n
}

func isEventStream(ct string) bool {
	// Parsing allocates; an answer whose type does not begin with it is
	// not one (ParseMediaType trims white space, Unicode's included, first).
	const es = "text/event-stream"
	ct = strings.TrimLeftFunc(ct, unicode.IsSpace)
	if len(ct) < len(es) || !strings.EqualFold(ct[:len(es)], es) {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// execute forwards a claimed request once, returns its answer to the client
// and records it (or releases or keeps the claim, by outcome).
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, body []byte, lease *claim.Lease, pol Policy, res *result) {
	ex := &exchange{
		w:      w,
		max:    h.opts.MaxStoredBytes,
		keep:   proxyHeaders(w.Header(), h.opts.KeyHeader),
		http10: !r.ProtoAtLeast(1, 1),
		acct:   &res.acct,
	}
	defer ex.putCopy()

	// The client leaving must not cancel the upstream call: it runs to its
	// end, bounded by UPSTREAM_TIMEOUT, and is recorded for the retry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.opts.UpstreamTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, exchangeKey{}, ex)
	var upSpan trace.Span
	if h.tracer != nil {
		ctx, upSpan = h.startUpstreamSpan(ctx, r.Method)
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      ex.gotConnection,
		WroteHeaders: func() { ex.sent.Store(true) },
	})
	out := r.WithContext(ctx)
	out.Body = bodyReader(body)
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.Trailer = announcedTrailers(r.Trailer, res.trailers) // the denied ones go in rewrite
	if out.Trailer != nil {
		// Trailers go only with a chunked body, an empty one too.
		out.ContentLength = -1
		out.TransferEncoding = []string{"chunked"}
	}
	// The body is already here: waiting for "100 Continue" would only delay
	// it (by a second, against upstreams that never send one).
	if out.Header.Get("Expect") != "" {
		out.Header = out.Header.Clone()
		out.Header.Del("Expect")
	}
	// Lets the transport resend on a new connection when a pooled one that
	// the upstream had already closed failed before a byte was written to
	// it; never after (rewind).
	out.GetBody = func() (io.ReadCloser, error) {
		if !ex.rewind() {
			return nil, errRequestSent
		}
		return bodyReader(body), nil
	}

	start := time.Now()
	// A client that reads slowly (or not at all) must not hold the upstream
	// copy until UPSTREAM_TIMEOUT cuts it: past this deadline its writes fail,
	// are dropped, and the answer is still read in full and recorded, with
	// the other half of UPSTREAM_TIMEOUT left for that (at least 7/16 of it:
	// writeBy may keep a deadline up to an eighth later).
	upDeadline := start.Add(h.opts.UpstreamTimeout)
	ex.onHeaders = func() {
		now := time.Now()
		half := upDeadline.Sub(now) / 2
		res.writeBy(now.Add(half), deadlineSlack(half))
	}
	aborted := h.forward(ex, out)
	if upSpan != nil {
		upSpan.End()
	}
	switch {
	case !ex.headersAt.IsZero():
		res.upstreamMS = float64(ex.headersAt.Sub(start).Microseconds()) / 1000
		h.metrics.observeUpstream(res.route, ex.status, ex.headersAt.Sub(start))
	default:
		h.metrics.observeUpstream(res.route, 0, time.Since(start))
	}

	if ex.upErr != nil {
		a := upstreamAnswer(ex.upErr, !ex.left(ex.upErr))
		res.warn().Err(ex.upErr).Hex("key_hash", res.key[:]).Int("status", a.status).Msg("upstream request failed")
		switch {
		case a.outcome == outcomeReleased:
			// The request never left: release, so a retry executes.
			h.release(r, lease, res)
			a.detail = a.title + ". The request was not sent; retry with the same key."
			if pol.Observe {
				a.detail = a.title + ". The request was not sent."
			}
		case pol.Observe:
			// Retries are forwarded in observe mode whatever the claim says.
			a.detail = a.title + ". The request may have been executed."
			if pol.Hold {
				h.hold(r, lease, a.status, pol.TTL, res)
			}
		case pol.Hold:
			a.detail = a.title + ". The request may have been executed; it is not executed again: retries with this key get this status (outcome-unknown) until an operator purges the key."
			h.hold(r, lease, a.status, pol.TTL, res)
		default:
			a.detail = a.title + ". The request may have been executed; retries with this key get 409 until the claim expires."
		}
		// After a relayed 1xx, ReverseProxy has cleared the header map: the
		// problem still names its request and echoes the key.
		ex.keep.restore(w.Header())
		a.write(w, res)
		return
	}
	a := recordAnswer(ex.status, pol, lease.TakenOver)
	res.status, res.outcome = a.status, a.outcome
	switch {
	case a.outcome == outcomeReleased:
		if aborted {
			res.warn().Err(ex.body.err).Hex("key_hash", res.key[:]).Msg("upstream 5xx answer broke off mid-body; claim released")
		}
		h.release(r, lease, res)
	case aborted:
		// The final status arrived, so the upstream did execute; its body
		// broke off (or UPSTREAM_TIMEOUT cut a long stream). Record the
		// status without the body, as for an answer too large to store, so
		// that a retry never executes again; then cut the client off, so it
		// sees the answer was incomplete.
		res.warn().Err(ex.body.err).Hex("key_hash", res.key[:]).Int("status", ex.status).
			Msg("upstream answer broke off mid-body; recorded without its body")
		rec := &claim.Record{Status: ex.status, Header: recordableHeader(ex.header), BodyNotStored: true}
		h.complete(r, lease, rec, pol.TTL, res, ex)
		if res.outcome == outcomeExecuted || res.outcome == outcomeTakeover {
			res.outcome = outcomeUpstreamError
		}
	default:
		rec := &claim.Record{Status: ex.status, Header: recordableHeader(ex.header), BodyNotStored: ex.noBody}
		if !ex.noBody {
			if ex.buf != nil {
				rec.Body = ex.buf.Bytes()
			}
			if ex.res != nil && len(ex.res.Trailer) > 0 {
				rec.Trailer = recordableHeader(ex.res.Trailer)
			}
		}
		h.complete(r, lease, rec, pol.TTL, res, ex)
	}
	if aborted {
		panic(http.ErrAbortHandler)
	}
}

// forward runs ReverseProxy and reports whether it aborted (it panics with
// http.ErrAbortHandler when the upstream body fails mid-copy). Other panics
// are not ours to handle.
func (h *Handler) forward(ex *exchange, out *http.Request) (aborted bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler { //nolint:errorlint // ReverseProxy panics with this exact value
				panic(p)
			}
			aborted = true
		}
	}()
	h.keyed.ServeHTTP(ex, out)
	return false
}

// complete records the answer (claim.Lease retries it) and reports how
// that went. Once encoded, the record holds the answer: ex's copy goes, and
// MAX_BUFFERED_BYTES counts the encoding instead while Redis takes it (up
// to claim.CompleteBudget), not both and not neither.
func (h *Handler) complete(r *http.Request, lease *claim.Lease, rec *claim.Record, ttl time.Duration, res *result, ex *exchange) {
	if h.tracer != nil {
		rec.Trace = traceRef(r.Context()) // the execution, for its replays' span links
	}
	enc := rec.Encode()
	// Counted by what it holds (Encode sizes it by an upper bound), and
	// before the copy's count goes: never a moment holding it uncounted.
	held := int64(cap(enc))
	res.acct.force(held)
	ex.releaseCopy()
	err := lease.CompleteEncoded(r.Context(), enc, rec.Trace, ttl)
	res.acct.give(held)
	switch {
	case err == nil && lease.Recreated:
		res.warn().Hex("key_hash", res.key[:]).
			Msg("claim's lock had expired (or the claim was lost in a failover, purged, or held as unknown) and nobody had taken it over: answer recorded all the same")
	case err == nil:
	case errors.Is(err, claim.ErrNotReplicated):
		// Written on the master; a failover before it reaches a replica
		// would lose it. Nothing to retry: the record is there.
		res.warn().Err(err).Hex("key_hash", res.key[:]).Msg("answer recorded but not yet acknowledged by REDIS_WAIT_REPLICAS replicas")
	case errors.Is(err, claim.ErrLost):
		// Our lock expired and another request took the key over: the fence
		// kept us from overwriting its record, and the key has now executed
		// twice. The one hard signal that at-most-once was breached.
		res.outcome = outcomeLost
		h.metrics.doubleExecutions.Inc()
		res.error().Hex("key_hash", res.key[:]).
			Msg("claim expired and was taken over before completion: this key executed twice; answer not recorded")
	default:
		res.outcome = outcomeStoreError
		h.metrics.recordFailures.Inc()
		res.error().Err(err).Hex("key_hash", res.key[:]).
			Msg("answer returned but not recorded; the key stays in flight until its lock TTL")
	}
}

// hold records the claim's outcome as unknown (ON_UNKNOWN=hold): the
// request was sent and no final status came back, so retries get status,
// never another execution.
func (h *Handler) hold(r *http.Request, lease *claim.Lease, status int, ttl time.Duration, res *result) {
	cause := causeUpstreamFailed
	if status == http.StatusGatewayTimeout {
		cause = causeUpstreamTimeout
	}
	err := lease.Hold(r.Context(), status, ttl)
	switch {
	case err == nil && lease.AlreadyUnknown:
		// A request found our lock expired and held the key, and counted it.
		res.warn().Hex("key_hash", res.key[:]).Int("status", status).
			Msg("outcome unknown: key already held (its lock had expired) until an operator purges it")
	case err == nil || errors.Is(err, claim.ErrNotReplicated):
		h.metrics.unknownOutcomes.WithLabelValues(cause).Inc()
		res.warn().Err(err).Hex("key_hash", res.key[:]).Int("status", status).
			Msg("outcome unknown: key held (ON_UNKNOWN=hold) until an operator purges it")
	case errors.Is(err, claim.ErrLost):
		res.outcome = outcomeLost
		h.metrics.doubleExecutions.Inc()
		res.error().Hex("key_hash", res.key[:]).
			Msg("claim expired and was taken over before its outcome was known: this key may have executed twice")
	default:
		// The claim stays in flight; when its lock expires the next
		// request finds it and holds it as unknown all the same.
		h.metrics.recordFailures.Inc()
		res.error().Err(err).Hex("key_hash", res.key[:]).
			Msg("unknown outcome not recorded; the key stays in flight until its lock TTL, then is held as unknown")
	}
}

// release frees the claim so that a retry executes again.
func (h *Handler) release(r *http.Request, lease *claim.Lease, res *result) {
	if err := lease.Release(r.Context()); err != nil && !errors.Is(err, claim.ErrLost) {
		res.error().Err(err).Hex("key_hash", res.key[:]).
			Msg("could not release claim; the key stays in flight until its lock TTL")
	}
}

// keyedResponse is the keyed path's ModifyResponse: the exchange learns the
// upstream's status and headers before ReverseProxy copies the body.
func keyedResponse(res *http.Response) error {
	res.Request.Context().Value(exchangeKey{}).(*exchange).upstreamResponse(res)
	return nil
}

// keyedError is the keyed path's ErrorHandler: it only notes the error;
// execute decides what to answer and what to do with the claim.
func keyedError(w http.ResponseWriter, _ *http.Request, err error) {
	w.(*exchange).upErr = err
}
