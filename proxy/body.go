package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// bodyChunk is the unit in which a keyed request body is buffered while it
// arrives. A body is never buffered in one piece sized by its declared
// Content-Length: a client may declare a megabyte and send nothing, and
// hundreds of such connections would pin that much memory each.
const bodyChunk = 16 << 10

// BodyChunk is the unit keyed bodies are buffered in: MAX_BUFFERED_BYTES
// must hold a body of MAX_BODY_BYTES and an answer, and this much more.
const BodyChunk = bodyChunk

var chunkPool = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}

// errBodyTimeout: the body did not arrive within REQUEST_READ_TIMEOUT.
var errBodyTimeout = errors.New("request body not received within REQUEST_READ_TIMEOUT")

// readBody reads a keyed request's body, at most limit bytes, within
// timeout (a read deadline set through rc, the request's
// ResponseController). It holds at most what has arrived plus one chunk
// until the body is complete, then copies it into one slice of its real
// size. When the body is too large, it returns what it consumed with the
// error (at most limit plus one read), so that observe mode can still
// forward it whole.
//
// perRead (observe mode) bounds each read by timeout instead of the whole
// body, as for a pass-through body: observe must not refuse a body that a
// proxy without idempotency would have forwarded.
//
// The request is let in only while acct's budget (MAX_BUFFERED_BYTES) has
// room, a request without a body too; then each read's bytes are taken from
// it as they arrive, never what the client declares. When a read does not
// fit, readBody returns what it consumed with errOverBudget. The bytes stay
// taken until the request ends.
func readBody(rc *http.ResponseController, r *http.Request, limit int64, timeout time.Duration, perRead bool, acct *account) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit} // nothing read
	}
	if !acct.room() {
		return nil, errOverBudget
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if err := rc.SetReadDeadline(time.Now().Add(timeout)); err == nil {
		// Cleared for the next request on this connection; a connection
		// whose body timed out is closed by the server anyway.
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	var body io.Reader = r.Body
	if perRead {
		body = deadlineReader{r.Body, rc, timeout}
	}
	b, err := readChunked(body, r.ContentLength, limit, acct)
	if isTimeout(err) {
		return b, errBodyTimeout
	}
	return b, err
}

// deadlineReader gives each read of a request body timeout from its start.
type deadlineReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
}

func (d deadlineReader) Read(p []byte) (int, error) {
	_ = d.rc.SetReadDeadline(time.Now().Add(d.timeout))
	return d.r.Read(p)
}

// unreadBody gives r back the body readBody consumed: prefix, then the rest
// still on the connection. A body read to its declared length is all in
// prefix and is given back alone: the Transport reads once more after
// Content-Length bytes, and past prefix that read would reach the server's
// body, which net/http closes once the answer's headers are flushed (see
// idleBody.ended).
func unreadBody(r *http.Request, prefix []byte) {
	if r.ContentLength > 0 && int64(len(prefix)) == r.ContentLength {
		r.Body = bodyReader(prefix)
		return
	}
	if len(prefix) > 0 {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(prefix), r.Body), r.Body}
	}
}

// readChunked reads all of body (declared bytes, or -1 for unknown) into a
// slice, failing with *http.MaxBytesError past limit, and with errOverBudget
// when acct cannot take a read's bytes.
func readChunked(body io.Reader, declared, limit int64, acct *account) ([]byte, error) {
	// Read through its concrete type: as an io.Reader it would be one more
	// allocation per keyed request.
	counted := countedReader{r: body, acct: acct}
	if declared >= 0 && declared <= bodyChunk {
		// Small and declared: one allocation no larger than a chunk, filled
		// as io.ReadFull would.
		b := make([]byte, declared)
		for n := 0; n < len(b); {
			m, err := counted.Read(b[n:])
			n += m
			switch {
			case err == io.EOF && n == len(b):
			case err == io.EOF && n > 0:
				return b[:n], fmt.Errorf("read request body: %w", io.ErrUnexpectedEOF)
			case err != nil:
				return b[:n], fmt.Errorf("read request body: %w", err)
			}
		}
		return b, nil
	}
	var chunks []*[]byte
	defer func() {
		for _, c := range chunks {
			*c = (*c)[:bodyChunk]
			chunkPool.Put(c)
		}
	}()
	var total int64
	for done := false; !done; {
		c := chunkPool.Get().(*[]byte)
		chunks = append(chunks, c)
		n := 0
		for n < len(*c) {
			m, err := counted.Read((*c)[n:])
			n += m
			if total+int64(n) > limit {
				// Checked per read: a small limit is not read past by a chunk.
				*c = (*c)[:n]
				return joinChunks(chunks, total+int64(n)), &http.MaxBytesError{Limit: limit}
			}
			if err == io.EOF {
				done = true
				break
			}
			if err != nil {
				*c = (*c)[:n]
				return joinChunks(chunks, total+int64(n)), fmt.Errorf("read request body: %w", err)
			}
		}
		*c = (*c)[:n]
		total += int64(n)
		if total > limit {
			return joinChunks(chunks, total), &http.MaxBytesError{Limit: limit}
		}
	}
	if declared >= 0 && total != declared { // net/http enforces it; be sure
		return nil, fmt.Errorf("read request body: %d bytes, Content-Length %d", total, declared)
	}
	return joinChunks(chunks, total), nil
}

// countedReader takes each read's bytes from acct (MAX_BUFFERED_BYTES) as
// they arrive; a read that does not fit fails with errOverBudget (its bytes
// are returned, and not counted: the caller drops them).
type countedReader struct {
	r    io.Reader
	acct *account
}

func (c *countedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 && !c.acct.take(int64(n)) {
		return n, errOverBudget
	}
	return n, err
}

func joinChunks(chunks []*[]byte, total int64) []byte {
	out := make([]byte, 0, total)
	for _, c := range chunks {
		out = append(out, *c...)
	}
	return out
}

// isTimeout: a deadline ran out (a net.Error that says so;
// context.DeadlineExceeded is one).
func isTimeout(err error) bool {
	if err == nil {
		return false // before the target: errors.As makes it escape, an allocation per call
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// idleBody bounds a streamed pass-through request body: each read must
// bring bytes within timeout (a long upload that flows is never cut; one
// that stalls is).
type idleBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	timeout  time.Duration
	timedOut atomic.Bool
	// broke: a read failed other than by the deadline (the client hung
	// up, or sent framing that cannot be read). Read on the Transport's
	// writing goroutine, asked on the handler's.
	broke atomic.Bool
	wd    *watchdog
	// first, until the first read of a body sent with "Expect:
	// 100-continue": the lock a relayed 1xx holds (see
	// statusWriter.informational). nil after, and for other bodies.
	first   *sync.Mutex
	chunked bool // the body has no length
	// ended: a read returned io.EOF. Every later read answers io.EOF
	// without asking the server's body: when the proxy flushes an answer's
	// headers, net/http's server closes a request body that was read to its
	// end, and the Transport's last read (after Content-Length bytes, one
	// more to check that there is no more) can come after that; a "read on
	// closed body" there makes it drop the upstream connection and cut the
	// answer.
	ended atomic.Bool
	// length is the body's Content-Length (-1: chunked), n what was read.
	length int64
	n      atomic.Int64
	due    atomic.Int64 // the deadline of the read under way (unix ns); 0 when none
}

// stalled reports whether the body stopped arriving for REQUEST_READ_TIMEOUT:
// its read timed out, or is still under way past its deadline (net/http
// cancels the request on the timeout before that read returns, and the
// handler may ask first).
func (b *idleBody) stalled(now time.Time) bool {
	due := b.due.Load()
	return b.timedOut.Load() || due != 0 && now.UnixNano() >= due
}

// complete reports whether the client's body was read whole: to its end,
// or to its length (the Transport's read past the last byte, which would
// see the end, may come after the answer's headers).
func (b *idleBody) complete() bool {
	return b.ended.Load() || b.length >= 0 && b.n.Load() >= b.length
}

// maxDrain is the most of a body drain reads to keep the connection, as
// net/http's server reads after a handler (maxPostHandlerReadBytes).
const maxDrain = 256 << 10

// drain reads what is left of a body that the Transport never read (the
// round trip failed before it had a connection: nothing else reads it), at
// most maxDrain, and no reads begun past REQUEST_READ_TIMEOUT from now
// (each read has that much too: twice it in all, whatever a trickling
// client sends). A body read whole lets the connection carry the next
// request (complete); one that is not, or whose client was never told to
// send it (Expect: 100-continue), ends the connection
// (statusWriter.WriteHeader). An upstream that is down must not cost every
// client that sends a body its connection. Only on that failure: the
// buffer is not pooled.
func (b *idleBody) drain() {
	if b.first != nil || b.ended.Load() {
		return
	}
	end := time.Now().Add(b.timeout)
	buf := make([]byte, 32<<10)
	for left := maxDrain; left > 0 && time.Now().Before(end); {
		n, err := b.Read(buf[:min(len(buf), left)])
		left -= n
		if err != nil {
			return
		}
	}
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.ended.Load() {
		return 0, io.EOF
	}
	b.wd.pause()
	defer b.wd.resume()
	due := time.Now().Add(b.timeout)
	b.due.Store(due.UnixNano())
	defer b.due.Store(0) // after timedOut is set below
	_ = b.rc.SetReadDeadline(due)
	if m := b.first; m != nil {
		// net/http writes its "100 Continue" on the body's first read, and
		// must not write it into a relayed 1xx: under the lock. A read of
		// nothing makes it write now, without waiting for the body (a
		// length-delimited body's empty read returns at once); a chunked
		// one's waits for the first chunk all the same, so the lock is
		// held across that read (a 1xx waits for it, REQUEST_READ_TIMEOUT
		// at most).
		b.first = nil
		m.Lock()
		if b.chunked {
			defer m.Unlock()
		} else {
			_, _ = b.ReadCloser.Read(p[:0])
			m.Unlock()
		}
	}
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	switch {
	case err == io.EOF:
		b.ended.Store(true)
		// net/http now reads the connection in the background to notice a
		// client that hangs up; a deadline left armed would fire there and
		// cancel the request while the upstream is still answering.
		_ = b.rc.SetReadDeadline(time.Time{})
	case isTimeout(err):
		b.timedOut.Store(true)
	case err != nil:
		b.broke.Store(true)
	}
	return n, err
}

func bodyReader(b []byte) io.ReadCloser {
	if len(b) == 0 {
		return http.NoBody
	}
	return io.NopCloser(bytes.NewReader(b))
}
