package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog/hlog"
)

// passthrough forwards without any idempotency handling, streaming the body
// both ways. A request body must keep arriving (REQUEST_READ_TIMEOUT between
// reads) and the client must keep reading the answer (UPSTREAM_TIMEOUT per
// write); a stream that flows is never cut.
func (h *Handler) passthrough(w http.ResponseWriter, r *http.Request, res *result, outcome string) {
	res.outcome = outcome
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
	h.plain.ServeHTTP(sw, r)
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

// plainError answers a pass-through whose round trip failed.
func (h *Handler) plainError(w http.ResponseWriter, r *http.Request, err error) {
	if sw, ok := w.(*statusWriter); ok && sw.body != nil && sw.body.timedOut.Load() {
		hlog.FromRequest(r).Warn().Err(err).Msg("request body stalled; forward abandoned")
		h.bodyTimeout(fmt.Sprintf("The request body stopped arriving for %v.", h.opts.RequestReadTimeout)).write(w, &result{})
		return
	}
	a := upstreamAnswer(err, isDialError(err))
	hlog.FromRequest(r).Warn().Err(err).Int("status", a.status).Msg("upstream request failed")
	// The error text stays in the log: it names internal addresses.
	a.write(w, &result{})
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
