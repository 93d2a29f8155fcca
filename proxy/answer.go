package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy/claim"
)

// statusClientClosed is the status logged and counted for a request whose
// client hung up before its answer (nginx's 499): nothing is written.
const statusClientClosed = 499

// abandon ends a request whose client hung up (statusClientClosed) without
// an answer: net/http closes the connection and writes nothing. Returning
// instead would let it answer "200 OK" itself, and a client that only
// half-closed (shutdown of its write side; net/http takes that EOF for a
// hang-up) would read it as success. The handler's deferred access line and
// metrics still run and say 499.
func abandon() {
	panic(http.ErrAbortHandler)
}

// answer is what the proxy answers to one request, and why. Every status
// the proxy decides is made by one of the small functions below, one per
// stage (the request, the claim, the upstream); the README's behaviour
// table is their table-driven test (answer_test.go). When typ is empty the
// body is not the proxy's own: the request is forwarded (outcome tells why)
// or the upstream's answer is passed on.
type answer struct {
	status     int
	outcome    string
	typ, title string // the problem+json the proxy writes
	detail     string
	retryAfter bool // Retry-After: 1 (the contract's value for 409 and 503)
	closeConn  bool // the request body stalled: the connection is not reused
	clientGone bool // the client hung up (statusClientClosed): no answer at all (abandon)
	replayed   bool // Idempotent-Replayed: true (an unknown outcome's answer)
	// authenticate: a 401, which must name a scheme (RFC 9110 section
	// 11.6.1): the sender's signature is the credential.
	authenticate bool
}

// forwarded reports whether the answer is to forward the request rather
// than answer it here.
func (a answer) forwarded() bool {
	return a.outcome == outcomeNoKey || a.outcome == outcomeFailOpen || a.outcome == outcomePassthrough
}

// upgradeRefused: a protocol switch on a route that does not allow it.
func upgradeRefused(protocols string) answer {
	return answer{status: http.StatusBadRequest, outcome: outcomeInvalid,
		typ: typeUpgradeRefused, title: "Protocol upgrade not allowed",
		detail: "This route does not allow switching protocols (Upgrade: " + protocols + ")."}
}

// keyAnswer: the stage that reads the key. err is parseKey's.
func (h *Handler) keyAnswer(err error, pol Policy, method string) answer {
	var part *errPartInvalid
	switch {
	case errors.Is(err, errNoKey) && pol.Required && pol.Key != nil:
		return answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeKeyMissing, title: "Idempotency key is missing",
			detail: "This route requires a key from key=" + pol.Key.Text + " on " + method + " requests, and none of its parts were found."}
	case errors.Is(err, errNoKey) && pol.Required:
		return answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeKeyMissing, title: h.titleMis,
			detail: "This route requires an " + h.opts.KeyHeader + " header on " + method + " requests."}
	case errors.Is(err, errNoKey):
		return answer{outcome: outcomeNoKey}
	case errors.As(err, &part):
		return answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeKeyInvalid,
			title: "Idempotency key is invalid", detail: part.msg + "."}
	}
	return answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeKeyInvalid,
		title: h.opts.KeyHeader + " is invalid", detail: err.Error() + "."}
}

// signatureInvalid: a delivery on a verify= route whose signature does not
// verify (err says why, in words for the sender: never a secret). Nothing
// is claimed or forwarded; no Retry-After, since the same delivery fails
// again.
func signatureInvalid(err error) answer {
	return answer{status: http.StatusUnauthorized, outcome: outcomeSignatureInvalid, typ: typeSignatureInvalid,
		title: "Signature is invalid", authenticate: true,
		detail: "The delivery's signature could not be verified (" + err.Error() + "). Nothing was recorded or forwarded."}
}

// bodyAnswer: the stage that buffers a keyed body. err is readBody's.
func (h *Handler) bodyAnswer(err error, pol Policy) answer {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		detail := fmt.Sprintf("Requests with an %s may carry at most %d bytes.", h.opts.KeyHeader, h.opts.MaxBodyBytes)
		if pol.Key != nil {
			detail = fmt.Sprintf("Requests to this route (key=%s) may carry at most %d bytes.", pol.Key.Text, h.opts.MaxBodyBytes)
		}
		return answer{status: http.StatusRequestEntityTooLarge, outcome: outcomeTooLarge, typ: typeBodyTooLarge,
			title: "Request body is too large", detail: detail}
	case errors.Is(err, errOverBudget):
		a := h.overloaded()
		a.closeConn = true // the rest of the body is not read
		return a
	case errors.Is(err, errBodyTimeout):
		return h.bodyTimeout(fmt.Sprintf("The request body did not arrive within %v. Nothing was executed; retry with the same key.", h.opts.RequestReadTimeout))
	}
	return answer{status: http.StatusBadRequest, outcome: outcomeInvalid, typ: typeBodyUnreadable,
		title: "Request body could not be read", detail: err.Error()}
}

// overloaded: MAX_BUFFERED_BYTES has no room for the request's body, or for
// the record it would replay.
func (h *Handler) overloaded() answer {
	return answer{status: http.StatusServiceUnavailable, outcome: outcomeOverloaded, typ: typeOverloaded,
		title: "Too many request bodies in memory", retryAfter: true,
		detail: fmt.Sprintf("This proxy holds as many request bodies, answers and replays in memory as it may (MAX_BUFFERED_BYTES=%d). Nothing was executed; retry with the same key.", h.opts.MaxBufferedBytes)}
}

func (h *Handler) bodyTimeout(detail string) answer {
	return answer{status: http.StatusRequestTimeout, outcome: outcomeInvalid, typ: typeRequestTimeout,
		title: "Request body not received in time", detail: detail, closeConn: true}
}

// claimAnswer: the stage that claims the key, for every error Acquire
// returns. clientGone is the request context's error.
func (h *Handler) claimAnswer(err, clientGone error, pol Policy) answer {
	var unknown *claim.UnknownError
	if errors.As(err, &unknown) {
		return unknownAnswer(unknown.Status)
	}
	compared := [...]string{
		FingerprintStrict: "another method, path, query or body (fingerprint=strict)",
		FingerprintJSON:   "another method, path, set of query parameters or JSON body (fingerprint=json: member order and whitespace do not count)",
		FingerprintNone:   "another method or path (fingerprint=none)",
	}[pol.Fingerprint]
	switch {
	case errors.Is(err, claim.ErrOtherUpstream):
		return answer{status: http.StatusUnprocessableEntity, outcome: outcomeMismatch, typ: typeKeyReused, title: h.titleUse,
			detail: "This key was first used for a request to another upstream service."}
	case errors.Is(err, claim.ErrMismatch):
		return answer{status: http.StatusUnprocessableEntity, outcome: outcomeMismatch, typ: typeKeyReused, title: h.titleUse,
			detail: "This key was first used for a request with " + compared + "."}
	case errors.Is(err, claim.ErrInFlight):
		return answer{status: http.StatusConflict, outcome: outcomeInFlight, typ: typeRequestOutstanding, title: h.titleOut,
			detail: "The first request with this key has not finished yet; retry later to get its answer.", retryAfter: true}
	case errors.Is(err, claim.ErrBadRecord):
		// Not an outage: failing open here would execute a completed key again.
		return answer{status: http.StatusInternalServerError, outcome: outcomeStoreError, typ: typeRecordUnreadable,
			title:  "Stored response cannot be read",
			detail: "A response was recorded for this key but cannot be decoded (written by an incompatible version?). It is not executed again."}
	case clientGone != nil:
		// The client left while we waited; nothing was claimed.
		return answer{status: statusClientClosed, outcome: outcomeInFlight, clientGone: true}
	case pol.FailOpen && claim.Unavailable(err):
		// Only an outage: a Redis that answers but refuses (out of memory
		// under noeviction) is no reason to drop the guarantee.
		return answer{outcome: outcomeFailOpen}
	}
	return answer{status: http.StatusServiceUnavailable, outcome: outcomeStoreError, typ: typeStoreUnavailable,
		title: "Idempotency store is unavailable", detail: "The request was not forwarded. Retry later with the same key.",
		retryAfter: true}
}

// unknownAnswer is the answer for a key whose outcome is unknown and held
// (ON_UNKNOWN=hold): the first answer's status, never an execution. No
// Retry-After: retrying changes nothing until an operator purges the key.
func unknownAnswer(status int) answer {
	return answer{status: status, outcome: outcomeUnknown, typ: typeOutcomeUnknown,
		title: "Outcome of the original request is unknown", replayed: true,
		detail: "The first request with this key was sent upstream, but its outcome is unknown (the upstream timed out or broke off, or the proxy handling it stopped). " +
			"It is not executed again; an operator can inspect the key and purge it (idemproxy keys), after which the next request executes."}
}

// observeAnswer turns what enforcing would answer into observe mode's
// outcome: the request is forwarded as it is, unclaimed. ok is false for a
// stage answer that forwards anyway, or that observe keeps (a body that
// could not be read at all).
func observeAnswer(a answer) (outcome string, ok bool) {
	switch a.outcome {
	case outcomeSignatureInvalid:
		return outcomeWouldReject, true
	case outcomeInvalid, outcomeTooLarge:
		if a.typ == typeBodyUnreadable || a.typ == typeRequestTimeout {
			// The client broke off, or its body stalled (observe reads it
			// read by read, as a pass-through body): answered as a plain
			// forward would be.
			return "", false
		}
		return outcomeWouldReject, true
	case outcomeMismatch:
		return outcomeWouldMismatch, true
	case outcomeInFlight:
		if a.clientGone {
			return "", false // the client left while waiting
		}
		return outcomeWouldConflict, true
	case outcomeUnknown, outcomeReplayed:
		return outcomeWouldReplay, true
	case outcomeStoreError, outcomeFailOpen:
		// Never 503 in observe: the guarantee is not being given anyway.
		return outcomeStoreError, true
	case outcomeOverloaded:
		// Nor for want of memory: forwarded as a plain proxy would, the
		// rest of the body streamed.
		return outcomeOverloaded, true
	}
	return "", false
}

// upstreamAnswer: the stage that forwards, for a round trip that failed
// before an answer arrived. A request that never reached the upstream (no
// connection obtained, or the dial failed) is "unreachable" (502, outcome
// released: a keyed claim is freed) even when the dial ran into the
// timeout. Once it may have left, the outcome is unknown: 504 on a timeout,
// 502 otherwise (outcome upstream_error: a keyed claim is kept).
func upstreamAnswer(err error, neverLeft bool) answer {
	if neverLeft {
		return answer{status: http.StatusBadGateway, outcome: outcomeReleased, typ: typeUpstreamUnreachable, title: "Upstream is unreachable"}
	}
	if isTimeout(err) {
		return answer{status: http.StatusGatewayTimeout, outcome: outcomeUpstreamError, typ: typeUpstreamTimeout, title: "Upstream timed out"}
	}
	return answer{status: http.StatusBadGateway, outcome: outcomeUpstreamError, typ: typeUpstreamFailed, title: "Upstream connection failed"}
}

// recordAnswer: the stage that forwards, for an answer whose status
// arrived. A 5xx is released unless the policy stores it, a 401 or 403 when
// the policy releases them (ReleaseAuth); anything else is recorded
// (without its body when it broke off).
func recordAnswer(status int, pol Policy, takeover bool) answer {
	switch {
	case status >= 500 && !pol.Store5xx:
		return answer{status: status, outcome: outcomeReleased}
	case (status == http.StatusUnauthorized || status == http.StatusForbidden) && pol.ReleaseAuth:
		// Where the key is derived from the message, whoever sends a
		// message id first holds it: a forgery refused by the upstream
		// must not be replayed to the genuine delivery.
		return answer{status: status, outcome: outcomeReleased}
	case takeover:
		return answer{status: status, outcome: outcomeTakeover}
	}
	return answer{status: status, outcome: outcomeExecuted}
}

// notStoredAnswer is the replay of a record kept without its body.
func notStoredAnswer(status int) answer {
	return answer{status: status, outcome: outcomeReplayed, typ: typeResponseNotStored,
		title: "Original response too large to replay",
		detail: "The first request with this key was executed and answered with status " + strconv.Itoa(status) +
			", but its response body was too large, streaming, or cut off to be recorded. It is not executed again."}
}

// write sends the answer's problem and notes it in res. An answer without a
// problem type writes nothing (the client is gone, or another stage writes).
func (a answer) write(w http.ResponseWriter, res *result) {
	res.status, res.outcome = a.status, a.outcome
	res.boundBody()
	if a.clientGone {
		abandon()
	}
	if a.typ == "" {
		return
	}
	if a.retryAfter {
		w.Header().Set("Retry-After", "1")
	}
	if a.closeConn {
		w.Header().Set("Connection", "close")
	}
	if a.replayed {
		w.Header()["Idempotent-Replayed"] = replayedTrue
	}
	if a.authenticate {
		w.Header().Set("WWW-Authenticate", `Signature realm="webhook"`)
	}
	if res.docsLink != nil {
		w.Header()["Link"] = res.docsLink
	}
	detail := a.detail
	if detail == "" {
		detail = a.title + "."
	}
	if res.rc != nil {
		res.arm()
	}
	writeProblem(w, a.status, a.typ, a.title, detail)
}
