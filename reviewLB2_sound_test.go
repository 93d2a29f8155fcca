package main

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Sound checks (they pass).

func TestReviewLB2SoundChunkEdges(t *testing.T) {
	long := strings.Repeat("x", pipeBuf+5) + "\n"
	cases := []struct {
		buf  string
		want int
	}{
		{"", 0},
		{"\n", 1},
		{"\n\n\n", 3},
		{"abc", 3}, // no newline, short
		{strings.Repeat("y", pipeBuf+9), pipeBuf + 9}, // no newline, long: all
		{strings.Repeat("a", pipeBuf-1) + "\n" + "b\n", pipeBuf},
		{strings.Repeat("a", pipeBuf) + "\nb\n", pipeBuf + 1}, // one line of pipeBuf+1: alone
		{long + "b\n", len(long)},
		{"tail-of-line\n" + long, len("tail-of-line\n")},
	}
	for _, c := range cases {
		if got := chunk([]byte(c.buf)); got != c.want {
			t.Errorf("chunk(%d bytes) = %d, want %d", len(c.buf), got, c.want)
		}
	}
	if got := lineStart([]byte("aa\nbb\ncc"), 4); got != 6 {
		t.Errorf("lineStart = %d", got)
	}
	if got := lineStart([]byte("aa\nbb\ncc"), 7); got != 8 {
		t.Errorf("lineStart no newline = %d", got)
	}
	if got := lineStart([]byte("aa\nbb\ncc"), 3); got != 3 {
		t.Errorf("lineStart at a line's start = %d, want 3 (that line kept)", got)
	}
}

// flaky fails its first `fails` writes (taking `take` bytes of each), then works.
type flaky struct {
	mu          sync.Mutex
	fails, take int
	out         bytes.Buffer
}

func (w *flaky) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fails > 0 {
		w.fails--
		n := min(w.take, len(p))
		w.out.Write(p[:n])
		return n, errors.New("EIO")
	}
	w.out.Write(p)
	return len(p), nil
}

func (w *flaky) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.out.String() }

// No line stranded after failures (full, partial, none taken): after each
// failed flush the timer is armed, and its callback (called here, the
// timer set to an hour so that none runs on its own) writes every line,
// whole, in order; with nothing held no timer is armed.
func TestReviewLB2SoundTimerRetriesToTheEnd(t *testing.T) {
	old := zerolog.ErrorHandler
	var reports atomic.Int64
	zerolog.ErrorHandler = func(error) { reports.Add(1) }
	defer func() { zerolog.ErrorHandler = old }()
	for _, take := range []int{0, 1, 7, 5000} {
		w := &flaky{fails: 5, take: take}
		b := newLogBuffer(w, time.Hour, 1<<20)
		l := zerolog.New(b)
		var want strings.Builder
		for i := range 50 {
			l.Info().Int("i", i).Str("p", strings.Repeat("z", (i*97)%5000)).Msg("r")
			want.WriteString(`{"level":"info","i":` + strconv.Itoa(i) + `,"p":"` + strings.Repeat("z", (i*97)%5000) + `","message":"r"}` + "\n")
		}
		for k := 0; ; k++ {
			b.mu.Lock()
			held := len(b.buf)
			b.mu.Unlock()
			armed := b.timer.Stop()
			if held == 0 {
				if armed {
					t.Fatalf("take=%d: timer armed with nothing held", take)
				}
				break
			}
			if !armed {
				t.Fatalf("take=%d: %d bytes held, no timer armed (stranded)", take, held)
			}
			if k > 100 {
				t.Fatalf("take=%d: still %d bytes held after %d retries", take, held, k)
			}
			b.flushTimer()
		}
		if got := w.String(); got != want.String() {
			t.Fatalf("take=%d: output differs (len %d vs %d)", take, len(got), want.Len())
		}
		_ = b.Close()
	}
	if reports.Load() != 4*5 {
		t.Fatalf("%d reports, want 20 (each failed flush once)", reports.Load())
	}
}

// Close on a failing writer: error returned, timer stopped, nothing held;
// later lines written at once and not kept; Flush after Close is a no-op.
func TestReviewLB2SoundAfterClose(t *testing.T) {
	w := &flaky{fails: 1 << 30}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	l.Info().Msg("a")
	if err := b.Close(); err == nil {
		t.Fatal("Close: nil error")
	}
	if b.timer.Stop() {
		t.Fatal("timer armed after Close")
	}
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) {}
	defer func() { zerolog.ErrorHandler = old }()
	l.Info().Msg("b")
	b.mu.Lock()
	n := len(b.buf)
	b.mu.Unlock()
	if n != 0 || b.timer.Stop() {
		t.Fatalf("after Close: %d bytes held / timer armed", n)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
}

// An ErrorHandler that logs through the same logger (timer flush, size
// flush, warning, Close) does not deadlock: every report is made with the
// mutex released.
func TestReviewLB2SoundErrorHandlerLogsAgain(t *testing.T) {
	w := &flaky{fails: 1 << 30}
	b := newLogBuffer(w, time.Hour, 512)
	l := zerolog.New(b)
	var depth, reports atomic.Int64
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(err error) {
		reports.Add(1)
		if depth.Add(1) == 1 {
			l.Warn().Err(err).Msg("log write failed")
			l.Info().Msg("again")
		}
		depth.Add(-1)
	}
	defer func() { zerolog.ErrorHandler = old }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			l.Info().Int("i", i).Msg("r")
			if i%50 == 0 {
				l.Warn().Msg("w")
			}
		}
		b.flushTimer() // the timer's path, here so that it ends before the handler is restored
		reportLogError(b.Close())
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock")
	}
	if reports.Load() == 0 {
		t.Fatal("no reports")
	}
}
