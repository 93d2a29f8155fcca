package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// passthrough forwards without any idempotency handling, streaming the body
// both ways. A request body must keep arriving (REQUEST_READ_TIMEOUT between
// reads), the upstream must take it and answer (UPSTREAM_TIMEOUT without
// progress, see watchdog), and the client must keep reading the answer
// (UPSTREAM_TIMEOUT per write); a stream that flows is never cut.
func (h *Handler) passthrough(w http.ResponseWriter, r *http.Request, res *result, outcome string) {
	res.outcome = outcome
	res.bodyDone = true // what is left of the body is bounded below
	sw := &statusWriter{ResponseWriter: w, keep: proxyHeaders(w.Header(), h.opts.KeyHeader), rc: res.rc, res: res,
		http10: !r.ProtoAtLeast(1, 1), client: r.Context()}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	if h.tracer != nil {
		var span trace.Span
		ctx, span = h.startUpstreamSpan(ctx, r.Method)
		defer span.End()
	}
	wd := &watchdog{timer: time.AfterFunc(h.opts.UpstreamTimeout, func() { cancel(errUpstreamStalled) }), d: h.opts.UpstreamTimeout,
		due: time.Now().Add(h.opts.UpstreamTimeout)}
	sw.wd = wd
	defer wd.stop()
	ctx = httptrace.WithClientTrace(context.WithValue(ctx, watchdogKey{}, wd), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { wd.gotConn.Store(true) },
	})
	r = r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		// An upstream may answer before it has read the whole body (a
		// stream, an early 4xx). net/http's HTTP/1 server would read the
		// rest of the body itself, and throw it away, before it writes the
		// answer's headers: the Transport, still sending it, would lose
		// those reads, and the upstream get a body with holes.
		_ = res.rc.EnableFullDuplex()
		sw.body = &idleBody{ReadCloser: r.Body, rc: res.rc, timeout: h.opts.RequestReadTimeout, wd: wd, length: r.ContentLength}
		if strings.Contains(strings.ToLower(r.Header.Get("Expect")), "100-continue") {
			sw.body.first, sw.body.chunked = &sw.informational, r.ContentLength < 0
		}
		r.Body = sw.body
	}
	defer func() { // also when ReverseProxy aborts (panics) mid-body
		res.status = sw.status
		if res.status == 0 {
			res.status = http.StatusBadGateway
		}
		switch {
		case wd.body.ReadCloser == nil || wd.body.ended:
			// No answer (plainError told why), or all of it.
		case sw.body != nil && sw.body.stalled(time.Now()):
			// An upstream that answers before it has the whole body, and a
			// body that then stalls: net/http cancels the request, and the
			// answer's read ends "canceled", with no error of its own.
			res.warn().Int("status", res.status).Dur("request_read_timeout", h.opts.RequestReadTimeout).
				Msg("request body stalled after the answer began; answer cut")
		case wd.body.err == nil:
			// The client left, or stopped reading.
		case sw.body != nil && sw.body.broke.Load():
			// The Transport gave up on the upstream connection because the
			// client's body failed (an upstream may answer before it has the
			// whole body): the answer's read failed for that, not the
			// upstream's doing (as in plainError).
			res.warn().Err(wd.body.err).Int("status", res.status).Msg("request body broke off after the answer began; answer cut")
		default:
			res.warn().Err(wd.body.err).Int("status", res.status).Msg("upstream answer broke off mid-body; client connection cut")
		}
		switch {
		case sw.body == nil || res.hijacked:
		case sw.body.ended.Load():
			_ = res.rc.SetReadDeadline(time.Time{})
		default:
			// The answer is out, the body is not all read: net/http reads
			// the rest after this returns (to reuse the connection), and the
			// Transport may still be reading it. Both end within
			// REQUEST_READ_TIMEOUT, not whenever the client hangs up.
			_ = res.rc.SetReadDeadline(time.Now().Add(h.opts.RequestReadTimeout))
		}
	}()
	h.plain.ServeHTTP(sw, r)
}

// errUpstreamStalled: the upstream neither took the request body nor
// answered for UPSTREAM_TIMEOUT.
// It is a deadline: the answer is 504, as for any upstream timeout.
var errUpstreamStalled = fmt.Errorf("upstream took neither the request body nor answered within UPSTREAM_TIMEOUT: %w", context.DeadlineExceeded)

type watchdogKey struct{}

// watchdog cancels a pass-through forward whose upstream makes no progress:
// it runs while the Transport is not reading the request body (it is
// writing to an upstream that does not read, or waiting for the answer)
// and stops when the answer's headers arrive. Transport's
// ResponseHeaderTimeout alone starts only once the whole body was written.
type watchdog struct {
	timer   *time.Timer
	d       time.Duration
	gotConn atomic.Bool // a connection was obtained: the request may have left

	mu     sync.Mutex // orders resume against stop: a resume after stop would cut a download
	done   bool
	paused bool
	due    time.Time // when the timer, last (re)started, fires

	body answerBody // the answer's, once it arrived
}

// pause is called while the body is read from the client: a slow client is
// REQUEST_READ_TIMEOUT's business, not the upstream's.
func (wd *watchdog) pause() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.paused = true
	wd.timer.Stop()
}

func (wd *watchdog) resume() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.paused = false
	if !wd.done {
		wd.timer.Reset(wd.d)
		wd.due = time.Now().Add(wd.d)
	}
}

// left is how long the upstream has left to answer before the watchdog
// fires (the Transport's ResponseHeaderTimeout, started once the whole
// body was written, fires no sooner). While the client's body is being
// read the watchdog is paused and restarts in full when the read returns:
// the upstream has all of UPSTREAM_TIMEOUT left, whatever a slow client
// has used up.
func (wd *watchdog) left(now time.Time) time.Duration {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.paused {
		return wd.d
	}
	return max(0, wd.due.Sub(now))
}

// expired: the watchdog's time ran out (whether or not its timer has
// run yet) while it was neither paused nor stopped.
func (wd *watchdog) expired(now time.Time) bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return !wd.done && !wd.paused && !now.Before(wd.due)
}

func (wd *watchdog) stop() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.done = true
	wd.timer.Stop()
}

// plainResponse is the plain path's ModifyResponse: the answer arrived
// (101 included), the upstream is alive.
func plainResponse(res *http.Response) error {
	if wd, ok := res.Request.Context().Value(watchdogKey{}).(*watchdog); ok {
		wd.stop()
		wd.body.wrap(res)
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		// ReverseProxy writes a 101 itself, with the upstream's headers
		// added to the proxy's (never through statusWriter, which keeps the
		// proxy's id over the upstream's): the answer must not carry two.
		res.Header.Del(RequestIDHeader)
	}
	return nil
}

// RequestIDHeader carries each answer's request id, which the Handler sets
// first (the request_id of the request's log lines) and keeps over an
// upstream's own header of that name.
const RequestIDHeader = "X-Request-Id"

// proxyHeaders are the headers the proxy itself set on the answer before
// forwarding (request id, key echo). ReverseProxy clears the header map after
// relaying a 1xx answer; the final answer gets them back.
type savedHeaders struct {
	requestID, echo []string
	echoName        string
}

func proxyHeaders(h http.Header, echoName string) savedHeaders {
	return savedHeaders{requestID: h[RequestIDHeader], echo: h[echoName], echoName: echoName}
}

// restore puts them back over whatever the upstream sent: the request id is
// the proxy's, new on each answer and named in its access log (an upstream's
// own X-Request-Id would otherwise be added beside it, or replace it on a
// replay).
func (s savedHeaders) restore(h http.Header) {
	if s.requestID != nil {
		h[RequestIDHeader] = s.requestID
	}
	if s.echo != nil {
		h[s.echoName] = s.echo // set, not added: an upstream echo must not double it
	}
}

// statusWriter remembers the status for the access log and puts a write
// deadline on each write; Unwrap lets ReverseProxy flush through it.
type statusWriter struct {
	http.ResponseWriter
	status int
	keep   savedHeaders
	rc     *http.ResponseController
	res    *result
	body   *idleBody // the request body, when there is one
	wd     *watchdog
	client context.Context // the client's request context: done when it hung up
	// informational is held while a 1xx is written, and while net/http
	// writes its own "100 Continue" (Expect) on the body's first read: that
	// runs on the Transport's writing goroutine, a 1xx is relayed from its
	// reading one, and net/http orders neither against the other.
	informational sync.Mutex
	http10        bool // the client speaks HTTP/1.0: no 1xx (RFC 9110 section 15.2)
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
		s.keep.restore(s.ResponseWriter.Header())
		if s.body != nil && !s.body.complete() {
			// The answer goes out before the client's body is all in (an
			// upstream that answers early): whatever of it is still to come
			// must not be read as the connection's next request.
			s.ResponseWriter.Header().Set("Connection", "close")
		}
	}
	if code < 200 && s.http10 {
		return
	}
	if code < 200 && s.wd != nil {
		// An informational answer (103 Early Hints) is relayed from the
		// Transport's reader: while its write blocks, the final answer is
		// not read, and the watchdog would blame the upstream of a client
		// that does not read. It gets half of the upstream's time left, as
		// a keyed answer's writes do, so that it fails first.
		// Set under the lock, and the ordinary deadline back before it is
		// released: net/http's own "100 Continue", written when the body
		// is first read, must not be written under the short one.
		s.informational.Lock()
		now := time.Now()
		half := s.wd.left(now) / 2
		s.res.writeBy(now.Add(half), deadlineSlack(half))
		s.ResponseWriter.WriteHeader(code)
		s.res.arm()
		s.informational.Unlock()
		return
	}
	s.res.arm()
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	s.res.arm()
	return s.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController (used by ReverseProxy) calls.
func (s *statusWriter) FlushError() error {
	s.res.arm()
	return s.rc.Flush()
}

// Hijack is how ReverseProxy takes the connection over for a protocol
// switch (101): a tunnel has no deadlines (it lives as long as both ends
// keep it), and its status is 101, not the 502 of "no answer".
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	s.res.clearWriteDeadline()
	_ = s.rc.SetReadDeadline(time.Time{})
	conn, brw, err := s.rc.Hijack()
	if err == nil {
		s.status = http.StatusSwitchingProtocols
		s.res.hijacked = true
	}
	return conn, brw, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// plainError answers a pass-through whose round trip failed.
func (h *Handler) plainError(w http.ResponseWriter, r *http.Request, err error) {
	sw, ok := w.(*statusWriter) // always: passthrough serves through one
	if !ok {
		sw = &statusWriter{res: &result{log: &h.opts.Logger}}
	}
	logs := sw.res // the request's id for its log lines
	if sw.body != nil && sw.body.timedOut.Load() {
		logs.warn().Err(err).Msg("request body stalled; forward abandoned")
		h.bodyTimeout(fmt.Sprintf("The request body stopped arriving for %v.", h.opts.RequestReadTimeout)).write(w, &result{docsLink: h.docsLink})
		return
	}
	wd, _ := r.Context().Value(watchdogKey{}).(*watchdog)
	if errors.Is(context.Cause(r.Context()), errUpstreamStalled) || wd != nil && wd.expired(time.Now()) {
		// A timeout, not the "canceled" the Transport saw. Also when the
		// client's side failed first, in the moment before the watchdog
		// fired: a 1xx relayed then is written under half of nothing
		// left, fails, and net/http cancels the request as the client's.
		// The upstream had all of UPSTREAM_TIMEOUT and did not answer.
		err = errUpstreamStalled
	} else if sw.client != nil && sw.client.Err() != nil {
		// The client hung up before the answer (net/http cancels its
		// context, and so the forward): nobody is left to answer, and the
		// upstream is not at fault. 499 is nginx's "client closed
		// request", and keeps it out of an alert on 502s.
		sw.status = statusClientClosed
		logs.debug().Err(err).Msg("client closed the connection before the answer; forward abandoned")
		abandon()
	} else if sw.body != nil && sw.body.broke.Load() {
		// The client is still there, but its body could not be read
		// (malformed chunked framing): its fault, told as a keyed request's
		// is. Not err's text, which may be the Transport's.
		logs.warn().Err(err).Msg("request body unreadable; forward abandoned")
		answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeBodyUnreadable, closeConn: true,
			title:  "Request body could not be read",
			detail: "The request body broke off or is malformed; the forward was abandoned."}.write(w, &result{docsLink: h.docsLink})
		return
	}
	neverLeft := isDialError(err)
	if wd != nil && !wd.gotConn.Load() {
		neverLeft = true // no connection was obtained (a dial the watchdog cut, too)
		if sw.body != nil {
			sw.body.drain()
		}
	}
	a := upstreamAnswer(err, neverLeft)
	logs.warn().Err(err).Int("status", a.status).Msg("upstream request failed")
	// The error text stays in the log: it names internal addresses.
	a.write(w, &result{docsLink: h.docsLink})
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
