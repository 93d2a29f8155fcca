package proxy

import (
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/rs/zerolog"
)

// result is what the access log and the metrics learn about one request.
type result struct {
	// requestID is sent as X-Request-Id and logged as request_id on every
	// line of the request (info, warn, error).
	requestID string
	log       *zerolog.Logger
	route     string
	// outcome is final only once the answer is recorded: recording may
	// turn executed into lost or store_error (keyed.go).
	outcome string
	status  int
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
	// drainBy is when net/http stops reading what is left of a body the
	// request was answered without reading (boundBody); zero otherwise.
	drainBy time.Time
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
	res.drainBy = time.Now().Add(res.readTimeout)
	_ = res.rc.SetReadDeadline(res.drainBy)
	// The answer is written after that read: its deadline runs from there.
	res.armFrom(time.Now())
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
	if res.drainBy.After(now) {
		// net/http reads what is left of a refused body, up to drainBy,
		// before it writes the answer: with REQUEST_READ_TIMEOUT at or
		// above UPSTREAM_TIMEOUT, a deadline from now would cut the answer
		// off (the client got EOF instead of its 400).
		now = res.drainBy
	}
	res.writeBy(now.Add(res.writeTimeout), deadlineSlack(res.writeTimeout))
}

// info, warn and error start a log line of this request. The request id is
// a field of each line rather than of a logger made per request: that
// logger, carried in a copy of the request, was four allocations on every
// request, replays included, at any LOG_LEVEL (a replay costs little else).
func (res *result) debug() *zerolog.Event { return res.log.Debug().Str("request_id", res.requestID) }

func (res *result) info() *zerolog.Event { return res.log.Info().Str("request_id", res.requestID) }

func (res *result) warn() *zerolog.Event { return res.log.Warn().Str("request_id", res.requestID) }

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
