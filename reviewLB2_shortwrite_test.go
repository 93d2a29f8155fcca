package main

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// zeroNil breaks io.Writer's contract, returning (0, nil), up to limit
// calls; then an error (which bounds the test).
type zeroNil struct{ calls, limit atomic.Int64 }

func (w *zeroNil) Write(p []byte) (int, error) {
	if w.calls.Add(1) > w.limit.Load() {
		return 0, errShortLimit
	}
	return 0, nil
}

var errShortLimit = errorString("limit reached")

type errorString string

func (e errorString) Error() string { return string(e) }

// flushLocked guards against a Writer claiming n > len(p) but loops for
// ever, holding the mutex (every logger blocked), on one that returns
// (0, nil). bufio.Writer returns io.ErrShortWrite here.
func TestReviewLB2ShortWriteWithoutErrorSpins(t *testing.T) {
	w := &zeroNil{}
	w.limit.Store(1_000_000)
	b := newLogBuffer(w, time.Hour, 1<<10)
	l := zerolog.New(b)
	l.Info().Msg("a")
	done := make(chan error, 1)
	go func() { done <- b.Flush() }()
	select {
	case err := <-done:
		if n := w.calls.Load(); n > 10 {
			t.Fatalf("Flush made %d write calls on a writer returning (0, nil) (stopped only by the test's limit: %v); want it to stop with io.ErrShortWrite", n, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Flush did not return in 30s")
	}
}
