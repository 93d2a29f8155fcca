package main

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

type countFail struct{ calls atomic.Int64 }

func (w *countFail) Write(p []byte) (int, error) {
	w.calls.Add(1)
	return 0, errors.New("no space left on device")
}

// With the writer failing for good, once 2×size is held every info line
// triggers the size flush: a failed write(2), a report, and dropTo's copy
// of the whole kept buffer (~2×size) under the mutex. Unbuffered costs the
// write and the report only; the retry could wait for the timer instead.
func TestReviewLB2FailingWriterCostsAWriteAndA128KCopyPerLine(t *testing.T) {
	var reports atomic.Int64
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) { reports.Add(1) }
	defer func() { zerolog.ErrorHandler = old }()

	w := &countFail{}
	b := newLogBuffer(w, time.Hour, logBufferSize)
	defer b.Close()
	l := zerolog.New(b)
	line := func(i int) { l.Info().Int("i", i).Str("path", "/v1/payments/abcdef").Int("status", 200).Msg("request") }
	i := 0
	for ; w.calls.Load() == 0 && i < 10000; i++ { // up to the first size flush
		line(i)
	}
	for range 2 * logBufferSize / 40 { // past 2×size
		line(i)
		i++
	}
	c0, r0 := w.calls.Load(), reports.Load()
	const lines = 1000
	var copied int64
	for range lines {
		line(i)
		i++
		b.mu.Lock()
		copied += int64(len(b.buf)) // what the drop moved to the front
		b.mu.Unlock()
	}
	writes, reps := w.calls.Load()-c0, reports.Load()-r0
	t.Logf("per line while failing: %.2f write calls, %.2f reports, %.0f KiB copied", float64(writes)/lines, float64(reps)/lines, float64(copied)/lines/1024)
	if writes > lines/10 {
		t.Errorf("%d failed writes for %d lines (and %d KiB copied each): a retry per line, not per %v", writes, lines, copied/lines/1024, logFlushEvery)
	}
}
