package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// reviewEOFScript is a request body that answers a scripted list of reads
// and counts the reads that reached it.
type reviewEOFScript struct {
	mu     sync.Mutex
	steps  []reviewEOFStep
	reads  atomic.Int64
	closed atomic.Bool
}

type reviewEOFStep struct {
	data string
	err  error
}

func (s *reviewEOFScript) Read(p []byte) (int, error) {
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

func (s *reviewEOFScript) Close() error { s.closed.Store(true); return nil }

func reviewEOFBody(src io.ReadCloser, d time.Duration, fired *atomic.Int64) *idleBody {
	wd := &watchdog{d: d}
	wd.timer = time.AfterFunc(d, func() { fired.Add(1) })
	return &idleBody{ReadCloser: src, rc: http.NewResponseController(httptest.NewRecorder()), timeout: time.Second, wd: wd}
}

// TestReviewEOFUnitLatch: the latch is set by a read that returns data with
// io.EOF as well as by (0, io.EOF); later reads never reach the server's
// body; a non-EOF error (a timeout, a body the server closed before its end)
// is never turned into io.EOF, so an upload is never silently cut short.
func TestReviewEOFUnitLatch(t *testing.T) {
	var fired atomic.Int64
	src := &reviewEOFScript{steps: []reviewEOFStep{{"ab", nil}, {"cd", io.EOF}}}
	b := reviewEOFBody(src, time.Hour, &fired)
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
	src2 := &reviewEOFScript{steps: []reviewEOFStep{{"ab", nil}, {"cd", nil}}}
	b2 := reviewEOFBody(src2, time.Hour, &fired)
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
	src3 := &reviewEOFScript{steps: []reviewEOFStep{{"", os.ErrDeadlineExceeded}, {"xy", nil}, {"", io.EOF}}}
	b3 := reviewEOFBody(src3, time.Hour, &fired)
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

// TestReviewEOFUnitWatchdogNotExtended: after the body's end, late reads
// neither pause nor reset the watchdog (before 06d58fc each one reset it:
// a reader that kept reading past the end would have kept an upstream that
// never answers alive); it fires UPSTREAM_TIMEOUT after the last real read.
func TestReviewEOFUnitWatchdogNotExtended(t *testing.T) {
	var fired atomic.Int64
	src := &reviewEOFScript{steps: []reviewEOFStep{{"ab", io.EOF}}}
	b := reviewEOFBody(src, 200*time.Millisecond, &fired)
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

// TestReviewEOFUnitRace: Close racing Read, and the hand-off of reads
// between goroutines as the Transport's probeRequestBody does it (a
// channel between them), are clean under -race.
func TestReviewEOFUnitRace(t *testing.T) {
	var fired atomic.Int64
	for range 50 {
		src := &reviewEOFScript{steps: []reviewEOFStep{{"a", nil}, {"b", nil}, {"c", io.EOF}}}
		b := reviewEOFBody(src, time.Hour, &fired)
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
