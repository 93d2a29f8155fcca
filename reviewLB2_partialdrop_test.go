package main

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// partialOut: the first write takes `first` bytes and fails (a disk that
// fills mid-write: write(2) returns a short count, then ENOSPC); later
// writes fail with nothing written until ok; then all succeed.
type partialOut struct {
	mu    sync.Mutex
	first int
	calls int
	ok    bool
	out   strings.Builder
}

func (w *partialOut) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	switch {
	case w.ok:
		w.out.Write(p)
		return len(p), nil
	case w.calls == 1:
		n := min(w.first, len(p))
		w.out.Write(p[:n])
		return n, errors.New("write /dev/stdout: no space left on device")
	default:
		return 0, errors.New("write /dev/stdout: no space left on device")
	}
}

// After a partial write the buffer starts with the rest of a line whose
// head is already out. If the writer keeps failing until the buffer passes
// 2×size, dropTo drops that rest; the next successful write then continues
// the half line with another line: the output holds a line that is not JSON.
func TestReviewLB2PartialWriteThenDropCorruptsALine(t *testing.T) {
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) {}
	defer func() { zerolog.ErrorHandler = old }()

	w := &partialOut{first: 10}
	const size = 1024
	b := newLogBuffer(w, time.Hour, size)
	l := zerolog.New(b)
	for i := range 200 { // ~30 bytes each: past size (the partial write), then past 2×size (the drop)
		l.Info().Int("i", i).Msg("r")
	}
	w.mu.Lock()
	w.ok = true
	w.mu.Unlock()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(w.out.String(), "\n"), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("output line %q is not JSON: %v (the head of a partly written line, then another line)", line, err)
		}
	}
}

// Without the drop, the same partial write loses nothing (sound).
func TestReviewLB2PartialWriteWithoutDropIsWhole(t *testing.T) {
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) {}
	defer func() { zerolog.ErrorHandler = old }()

	w := &partialOut{first: 10}
	const size = 1024
	b := newLogBuffer(w, time.Hour, size)
	l := zerolog.New(b)
	for i := range 40 { // past size, under 2×size
		l.Info().Int("i", i).Msg("r")
	}
	w.mu.Lock()
	w.ok = true
	w.mu.Unlock()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(w.out.String(), "\n"), "\n")
	for k, line := range lines {
		var e struct{ I int }
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.I != k {
			t.Fatalf("line %d %q: %v", k, line, err)
		}
	}
	if len(lines) != 40 {
		t.Fatalf("%d lines, want 40", len(lines))
	}
}
