package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// deadlineWriter is a ResponseWriter that keeps the write deadline the
// handler puts on it, as a server connection does, and checks it at every
// write against the window the handler promises: never already passed, and
// never later than UPSTREAM_TIMEOUT plus its slack from the write.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	t        *testing.T
	timeout  time.Duration
	deadline time.Time
	sets     int // non-zero deadlines set
	writes   int
}

func (w *deadlineWriter) SetReadDeadline(time.Time) error { return nil }

func (w *deadlineWriter) SetWriteDeadline(d time.Time) error {
	if !d.IsZero() {
		w.sets++
	}
	w.deadline = d
	return nil
}

func (w *deadlineWriter) check(what string) {
	w.t.Helper()
	now := time.Now()
	switch {
	case w.deadline.IsZero():
		w.t.Errorf("%s with no write deadline", what)
	case !w.deadline.After(now):
		w.t.Errorf("%s with a write deadline %v in the past", what, now.Sub(w.deadline))
	case w.deadline.Sub(now) > w.timeout+deadlineSlack(w.timeout):
		w.t.Errorf("%s with a write deadline %v ahead, more than UPSTREAM_TIMEOUT %v plus its slack", what, w.deadline.Sub(now), w.timeout)
	}
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.check("WriteHeader")
	w.ResponseRecorder.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.check("Write")
	w.writes++
	return w.ResponseRecorder.Write(p)
}

// finalFlush checks the deadline left for net/http's flush after the
// handler returns: the whole UPSTREAM_TIMEOUT, at most its slack more.
func (w *deadlineWriter) finalFlush() {
	w.t.Helper()
	// A quarter of it spared for a loaded machine between the handler's
	// end and this check; still above the slow-client deadline (half, and
	// an eighth of that), which the final flush must not inherit.
	ahead := time.Until(w.deadline)
	if ahead < w.timeout*3/4 || ahead > w.timeout+deadlineSlack(w.timeout) {
		w.t.Errorf("final flush: write deadline %v ahead, want UPSTREAM_TIMEOUT %v to %v", ahead, w.timeout, w.timeout+deadlineSlack(w.timeout))
	}
}

func coalesceHandler(t *testing.T, upstream roundTripperFunc, timeout time.Duration) *Handler {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	o := memoryOptions(nil)
	o.Transport = upstream
	o.UpstreamTimeout = timeout
	h, err := New(claim.NewStore(rdb, "idem:", nil), o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func coalesceServe(t *testing.T, h *Handler, key string, timeout time.Duration) *deadlineWriter {
	t.Helper()
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":1}`))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder(), t: t, timeout: timeout}
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d, want 201: %s", w.Code, w.Body)
	}
	w.finalFlush()
	return w
}

// TestWriteDeadlineSetOncePerAnswer: the stages of one answer arm the write
// deadline within microseconds of each other; each set is a runtime timer
// update on the connection, so one that is still UPSTREAM_TIMEOUT ahead is
// kept. A replay sets it once (it set it three times: at the start, before
// the answer, for the final flush), a first request three times (start, the
// slow-client deadline of the upstream copy, the final flush: it was four),
// and every write still has its deadline.
func TestWriteDeadlineSetOncePerAnswer(t *testing.T) {
	t.Parallel()
	const timeout = 10 * time.Second
	h := coalesceHandler(t, memoryUpstream, timeout)
	first := coalesceServe(t, h, "k1", timeout)
	if first.sets > 3 {
		t.Errorf("first request: write deadline set %d times, want at most 3", first.sets)
	}
	replay := coalesceServe(t, h, "k1", timeout)
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second request not replayed: %v", replay.Header())
	}
	if replay.sets != 1 {
		t.Errorf("replay: write deadline set %d times, want 1", replay.sets)
	}
	plain := coalesceServe(t, h, "", timeout)
	if plain.sets != 1 {
		t.Errorf("pass-through: write deadline set %d times, want 1", plain.sets)
	}
}

// slowBody is an upstream answer body read one byte at a time, with a
// pause before some of the bytes.
type slowBody struct {
	left  int
	pause map[int]time.Duration // before the byte with this many left
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	time.Sleep(b.pause[b.left])
	p[0] = 'y'
	b.left--
	return 1, nil
}

func (b *slowBody) Close() error { return nil }

// TestWriteDeadlineRearmedAfterAPause: a stream copied write by write keeps
// one deadline while the writes follow each other, and gets a new one, the
// whole UPSTREAM_TIMEOUT from the write, after a pause longer than the
// slack: every write is checked (deadlineWriter).
func TestWriteDeadlineRearmedAfterAPause(t *testing.T) {
	t.Parallel()
	const timeout = 800 * time.Millisecond // slack 100 ms
	pauses := map[int]time.Duration{40: 150 * time.Millisecond, 20: 150 * time.Millisecond}
	for _, key := range []string{"", "k-stream"} { // pass-through; keyed (the slow-client deadline)
		t.Run("key="+key, func(t *testing.T) {
			h := coalesceHandler(t, func(r *http.Request) (*http.Response, error) {
				if r.Body != nil {
					_, _ = io.Copy(io.Discard, r.Body)
				}
				return &http.Response{
					StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}},
					Body: &slowBody{left: 60, pause: pauses}, ContentLength: -1, Request: r,
				}, nil
			}, timeout)
			w := coalesceServe(t, h, key, timeout)
			if w.Body.Len() != 60 {
				t.Fatalf("body %d bytes, want 60", w.Body.Len())
			}
			// Without the pauses one set for the stream; each pause needs
			// one more. The keyed path has more stages, each with its own
			// (5 sets here); a loaded machine may add a few, never one per
			// write (60 writes: 63 and 124 sets before).
			if w.writes < 3 || w.sets < 3 || w.sets > 20 {
				t.Errorf("%d writes, write deadline set %d times; want at least 3 writes and 3 to 20 sets (not one per write)", w.writes, w.sets)
			}
		})
	}
}

// TestFailedHijackForgetsTheDeadline: a protocol switch lifts the write
// deadline before it takes the connection; when the hijack fails, the
// answer that follows must get a deadline again, not keep the one it
// believes is still set.
func TestFailedHijackForgetsTheDeadline(t *testing.T) {
	t.Parallel()
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder(), t: t, timeout: time.Minute}
	res := &result{rc: http.NewResponseController(w), writeTimeout: time.Minute}
	sw := &statusWriter{ResponseWriter: w, rc: res.rc, res: res}
	res.arm()
	if _, _, err := sw.Hijack(); err == nil {
		t.Fatal("Hijack of a recorder succeeded")
	}
	if !w.deadline.IsZero() {
		t.Fatal("Hijack left the write deadline set")
	}
	sw.WriteHeader(http.StatusBadGateway) // checks the deadline is set again
	if w.sets != 2 {
		t.Errorf("write deadline set %d times, want 2 (before and after the failed hijack)", w.sets)
	}
}

// scriptedBody is a request body that answers a scripted list of reads
// and counts the reads that reached it.
type scriptedBody struct {
	mu     sync.Mutex
	steps  []scriptedRead
	reads  atomic.Int64
	closed atomic.Bool
}

type scriptedRead struct {
	data string
	err  error
}

func (s *scriptedBody) Read(p []byte) (int, error) {
	s.reads.Add(1)
	if s.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.steps) == 0 {
		return 0, io.EOF
	}
	st := s.steps[0]
	s.steps = s.steps[1:]
	return copy(p, st.data), st.err
}

func (s *scriptedBody) Close() error { s.closed.Store(true); return nil }

func newIdleBody(src io.ReadCloser, d time.Duration, fired *atomic.Int64) *idleBody {
	wd := &watchdog{d: d}
	wd.timer = time.AfterFunc(d, func() { fired.Add(1) })
	return &idleBody{ReadCloser: src, rc: http.NewResponseController(httptest.NewRecorder()), timeout: time.Second, wd: wd}
}

// TestIdleBodyEOFLatch: the latch is set by a read that returns data with
// io.EOF as well as by (0, io.EOF); later reads never reach the server's
// body; a non-EOF error (a timeout, a body the server closed before its end)
// is never turned into io.EOF, so an upload is never silently cut short.
func TestIdleBodyEOFLatch(t *testing.T) {
	t.Parallel()
	var fired atomic.Int64
	src := &scriptedBody{steps: []scriptedRead{{"ab", nil}, {"cd", io.EOF}}}
	b := newIdleBody(src, time.Hour, &fired)
	defer b.wd.stop()
	got, err := io.ReadAll(b)
	if string(got) != "abcd" || err != nil {
		t.Fatalf("ReadAll %q %v", got, err)
	}
	_ = src.Close() // as net/http does when the answer's headers are flushed
	before := src.reads.Load()
	for range 3 {
		if n, err := b.Read(make([]byte, 4)); n != 0 || err != io.EOF {
			t.Fatalf("late read: %d %v, want 0 io.EOF", n, err)
		}
	}
	if src.reads.Load() != before {
		t.Errorf("late reads reached the closed server body")
	}

	// Closed before its end: the error stays an error on every read.
	src2 := &scriptedBody{steps: []scriptedRead{{"ab", nil}, {"cd", nil}}}
	b2 := newIdleBody(src2, time.Hour, &fired)
	defer b2.wd.stop()
	if n, err := b2.Read(make([]byte, 2)); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	_ = src2.Close()
	for range 3 {
		if _, err := b2.Read(make([]byte, 2)); !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("read after an early close: %v, want ErrBodyReadAfterClose (an EOF here would truncate the upload silently)", err)
		}
	}

	// A timeout, then more data, then the end: not latched by the timeout.
	src3 := &scriptedBody{steps: []scriptedRead{{"", os.ErrDeadlineExceeded}, {"xy", nil}, {"", io.EOF}}}
	b3 := newIdleBody(src3, time.Hour, &fired)
	defer b3.wd.stop()
	if _, err := b3.Read(make([]byte, 2)); !isTimeout(err) || !b3.timedOut.Load() {
		t.Fatalf("timeout read: %v timedOut=%v", err, b3.timedOut.Load())
	}
	if n, err := b3.Read(make([]byte, 2)); n != 2 || err != nil {
		t.Fatalf("read after timeout: %d %v, want the data", n, err)
	}
	if _, err := b3.Read(make([]byte, 2)); err != io.EOF {
		t.Fatal(err)
	}
}

// TestIdleBodyLateReadsDoNotExtendWatchdog: after the body's end, late reads
// neither pause nor reset the watchdog (before 06d58fc each one reset it:
// a reader that kept reading past the end would have kept an upstream that
// never answers alive); it fires UPSTREAM_TIMEOUT after the last real read.
func TestIdleBodyLateReadsDoNotExtendWatchdog(t *testing.T) {
	t.Parallel()
	var fired atomic.Int64
	src := &scriptedBody{steps: []scriptedRead{{"ab", io.EOF}}}
	b := newIdleBody(src, 200*time.Millisecond, &fired)
	defer b.wd.stop()
	start := time.Now()
	_, _ = b.Read(make([]byte, 4))
	for i := 0; i < 40 && fired.Load() == 0; i++ { // bounded: 40 × 10ms
		_, _ = b.Read(make([]byte, 4))
		time.Sleep(10 * time.Millisecond)
	}
	if fired.Load() != 1 {
		t.Fatalf("watchdog did not fire within %v of the body's end (late reads kept resetting it)", time.Since(start))
	}
}

// TestIdleBodyCloseRacingRead: Close racing Read, and the hand-off of reads
// between goroutines as the Transport's probeRequestBody does it (a
// channel between them), are clean under -race.
func TestIdleBodyCloseRacingRead(t *testing.T) {
	t.Parallel()
	var fired atomic.Int64
	for range 50 {
		src := &scriptedBody{steps: []scriptedRead{{"a", nil}, {"b", nil}, {"c", io.EOF}}}
		b := newIdleBody(src, time.Hour, &fired)
		ch := make(chan struct{})
		go func() { _, _ = b.Read(make([]byte, 1)); close(ch) }()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.Close() }()
		<-ch
		for range 4 {
			_, _ = b.Read(make([]byte, 1))
		}
		wg.Wait()
		b.wd.stop()
	}
}

// isTimeout runs on every keyed body read: no allocation when there is no
// error (errors.As's target escapes once declared).
func TestIsTimeoutNilDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = isTimeout(nil) }); n != 0 {
		t.Errorf("isTimeout(nil) allocates %v times, want 0", n)
	}
}

// context.DeadlineExceeded is a net.Error that times out: isTimeout alone
// gives upstreamAnswer and the trace their 504 / "timeout".
func TestIsTimeoutDeadlineExceeded(t *testing.T) {
	t.Parallel()
	if !isTimeout(fmt.Errorf("round trip: %w", context.DeadlineExceeded)) {
		t.Error("isTimeout(wrapped context.DeadlineExceeded) = false")
	}
	if isTimeout(context.Canceled) {
		t.Error("isTimeout(context.Canceled) = true")
	}
}
