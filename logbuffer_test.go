package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// writes records each Write call separately.
type writes struct {
	mu       sync.Mutex
	calls    []string
	err      error
	attempts int // calls, failed ones included
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.attempts++
	if w.err != nil {
		return 0, w.err
	}
	w.calls = append(w.calls, string(p))
	return len(p), nil
}

func (w *writes) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.calls...)
}

// waitWrites polls until w has n write calls, at most 5s.
func waitWrites(t *testing.T, w *writes, n int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := w.get()
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLogBufferGathersInfoLinesAndWritesWarnAtOnce(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20) // neither the timer nor the size flushes
	l := zerolog.New(b)
	l.Info().Int("n", 1).Msg("request")
	l.Debug().Int("n", 2).Msg("request")
	if got := w.get(); len(got) != 0 {
		t.Fatalf("info and debug lines were written at once: %q", got)
	}
	l.Warn().Int("n", 3).Msg("upstream request failed")
	got := w.get()
	if len(got) != 1 {
		t.Fatalf("after a warning: %d writes %q, want the gathered lines and the warning in one", len(got), got)
	}
	lines := strings.Split(strings.TrimSuffix(got[0], "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `"n":1`) || !strings.Contains(lines[1], `"n":2`) || !strings.Contains(lines[2], `"n":3`) {
		t.Fatalf("written: %q, want lines n=1, 2, 3 in that order", got[0])
	}
	// A warning with nothing gathered, and a line without a level, go at once.
	l.Error().Int("n", 4).Msg("x")
	l.Log().Int("n", 5).Msg("x")
	if got := w.get(); len(got) != 3 || !strings.Contains(got[1], `"n":4`) || !strings.Contains(got[2], `"n":5`) {
		t.Fatalf("writes: %q, want an error line and a line without a level each written at once", got)
	}
}

func TestLogBufferFlushesWhenFull(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 256)
	l := zerolog.New(b)
	n := 0
	for len(w.get()) == 0 && n < 100 {
		n++
		l.Info().Int("n", n).Str("pad", strings.Repeat("x", 40)).Msg("request")
	}
	got := w.get()
	if len(got) != 1 || len(got[0]) < 256 || strings.Count(got[0], "\n") != n {
		t.Fatalf("after %d lines: writes %q, want one of at least 256 bytes holding all %d", n, got, n)
	}
	if n < 2 {
		t.Fatalf("the first line was written at once")
	}
}

func TestLogBufferFlushesAfterInterval(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, 10*time.Millisecond, 1<<20)
	l := zerolog.New(b)
	for i := 1; i <= 3; i++ { // each round re-arms the timer after the last flush
		l.Info().Int("n", i).Msg("request")
		got := waitWrites(t, w, i)
		if len(got) != i || !strings.Contains(got[i-1], fmt.Sprintf(`"n":%d`, i)) {
			t.Fatalf("round %d: writes %q, want the line written by the timer", i, got)
		}
	}
}

func TestLogBufferCloseWritesTheRest(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	l.Info().Msg("shut down cleanly")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.get(); len(got) != 1 || !strings.Contains(got[0], "shut down cleanly") {
		t.Fatalf("after Close: writes %q, want the gathered line", got)
	}
	l.Info().Msg("late")
	if got := w.get(); len(got) != 2 || !strings.Contains(got[1], "late") {
		t.Fatalf("a line after Close: writes %q, want it written at once", got)
	}
}

// TestLogBufferConcurrentWriters: lines from many goroutines, of every
// level, through every kind of flush, each come out once, whole, and in
// each writer's order.
func TestLogBufferConcurrentWriters(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Millisecond, 512)
	l := zerolog.New(b)
	const writers, each = 8, 400
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				ev := l.Info()
				switch i % 7 {
				case 3:
					ev = l.Warn()
				case 5:
					ev = l.Debug()
				}
				ev.Int("g", g).Int("i", i).Msg("line")
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	next := make([]int, writers)
	for _, line := range strings.Split(strings.TrimSuffix(strings.Join(w.get(), ""), "\n"), "\n") {
		var e struct{ G, I int }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if e.I != next[e.G] {
			t.Fatalf("writer %d: line %d after %d, want each writer's lines once and in order", e.G, e.I, next[e.G]-1)
		}
		next[e.G]++
	}
	for g, n := range next {
		if n != each {
			t.Errorf("writer %d: %d lines out, want %d", g, n, each)
		}
	}
}

func TestLogBufferWriteErrors(t *testing.T) {
	w := &writes{err: errors.New("broken pipe")}
	b := newLogBuffer(w, time.Hour, 1<<20) // the test runs the timer's flush itself
	l := zerolog.New(b)
	var mu sync.Mutex
	var reported []error
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(reported) }
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }
	defer func() { zerolog.ErrorHandler = old }()
	attempts := func() int { w.mu.Lock(); defer w.mu.Unlock(); return w.attempts }

	// A warning's failed write reaches zerolog, which reports it; the line
	// is kept and a retry armed.
	l.Warn().Msg("x")
	if n := count(); n != 1 {
		t.Fatalf("after a failed warning: %d reports, want 1", n)
	}
	if !b.timer.Reset(time.Hour) {
		t.Fatalf("after a failed write: no retry armed")
	}
	// While it fails, an info line is only gathered: the timer retries,
	// not each line.
	before := attempts()
	l.Info().Msg("y")
	if attempts() != before {
		t.Fatalf("an info line after a failed write tried a write of its own")
	}
	b.flushTimer()
	if n := count(); n != 2 {
		t.Fatalf("after the timer's failed retry: %d reports, want 2", n)
	}
	w.mu.Lock()
	w.err = nil
	w.mu.Unlock()
	b.flushTimer()
	if got := strings.Join(w.get(), ""); !strings.Contains(got, `"message":"x"`) || !strings.Contains(got, `"message":"y"`) ||
		strings.Index(got, `"message":"x"`) > strings.Index(got, `"message":"y"`) {
		t.Fatalf("after the writer recovered: %q, want x then y", got)
	}
	w.mu.Lock()
	w.err = errors.New("broken pipe")
	w.mu.Unlock()
	l.Info().Msg("z")
	if err := b.Close(); err == nil {
		t.Errorf("Close: nil error, want the failed write's")
	}
	if b.timer.Stop() {
		t.Errorf("a retry is still armed after Close")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, err := range reported {
		if !strings.Contains(err.Error(), "broken pipe") {
			t.Errorf("reported %v, want it to name the write error", err)
		}
	}
}

// TestLogBufferKeepsWhatAFailedWriteDidNotTake: a write that fails (a full
// disk, then space freed) loses nothing; a writer that keeps failing holds
// at most twice the buffer's size, dropping the oldest lines whole, down to
// its size.
func TestLogBufferKeepsWhatAFailedWriteDidNotTake(t *testing.T) {
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) {}
	defer func() { zerolog.ErrorHandler = old }()

	w := &writes{err: errors.New("no space left on device")}
	const size = 1024
	b := newLogBuffer(w, time.Hour, size)
	l := zerolog.New(b)
	const n = 200 // about 30 bytes each: several times 2×size
	for i := range n {
		l.Info().Int("i", i).Msg("r")
		b.mu.Lock()
		held := len(b.buf)
		b.mu.Unlock()
		if held > 2*size+64 {
			t.Fatalf("line %d: %d bytes held, want at most 2×size and a line", i, held)
		}
	}
	w.mu.Lock()
	w.err = nil // space freed
	w.mu.Unlock()
	l.Warn().Msg("now")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(strings.Join(w.get(), ""), "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `"message":"now"`) {
		t.Fatalf("last line %q, want the warning", last)
	}
	prev := -1
	for _, line := range lines[:len(lines)-1] {
		var e struct{ I int }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v (a line cut when the oldest were dropped?)", line, err)
		}
		if prev >= 0 && e.I != prev+1 {
			t.Fatalf("line %d after %d: the kept lines must be the newest, in order, none missing", e.I, prev)
		}
		prev = e.I
	}
	if prev != n-1 || len(lines)-1 < size/40 {
		t.Fatalf("kept %d lines ending at %d, want the newest (at least size bytes of them) ending at %d", len(lines)-1, prev, n-1)
	}
}

// TestLogBufferWritesAtomicChunks: each write holds whole lines and at most
// pipeBuf bytes, so that it stays atomic on a shared pipe; a longer line
// goes alone and whole.
func TestLogBufferWritesAtomicChunks(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	for i := range 300 {
		l.Info().Int("i", i).Str("pad", strings.Repeat("x", i%90)).Msg("r")
		if i == 150 {
			l.Info().Str("long", strings.Repeat("y", 3*pipeBuf)).Msg("r")
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	calls := w.get()
	if len(calls) < 2 {
		t.Fatalf("%d writes, want the lines in several", len(calls))
	}
	var long int
	for _, c := range calls {
		if !strings.HasSuffix(c, "\n") {
			t.Fatalf("a write ends inside a line: ...%q", c[max(0, len(c)-40):])
		}
		if len(c) > pipeBuf {
			long++
			if strings.Count(c, "\n") != 1 {
				t.Fatalf("a write of %d bytes holds %d lines, want only the one long line", len(c), strings.Count(c, "\n"))
			}
		}
	}
	if long != 1 {
		t.Fatalf("%d writes over pipeBuf, want 1 (the long line)", long)
	}
	if got := strings.Count(strings.Join(calls, ""), "\n"); got != 301 {
		t.Fatalf("%d lines written, want 301", got)
	}
}

// TestRunWritesEveryLogLineBeforeReturning: the access lines and the last
// shutdown line are on stdout when run returns, not a flush interval later.
func TestRunWritesEveryLogLineBeforeReturning(t *testing.T) {
	var stdout testutil.SyncBuffer
	p := startRun(t, &stdout, "LOG_LEVEL=info")
	c := newClient(t)
	const n = 5
	for i := range n {
		if r := mustPost(t, c, "http://"+p.listen+"/v1/orders", "logbuf-"+strconv.Itoa(i), `{"n":1}`); r.status != http.StatusCreated {
			t.Fatalf("POST %d: got %v, want %v", i, r.status, http.StatusCreated)
		}
	}
	if err := p.stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
	out := stdout.String()
	if got := strings.Count(out, `"message":"request"`); got != n {
		t.Errorf("access lines on stdout when run returned: %d, want %d:\n%s", got, n, out)
	}
	if !strings.HasSuffix(strings.TrimSpace(out), `"message":"shut down cleanly"}`) {
		t.Errorf("stdout does not end with the shutdown line:\n%s", out)
	}
}

// BenchmarkAccessLine: one access-log line, as finish writes it, straight
// and through a logBuffer, to a file (as make bench's info phase sends
// stdout) and to a pipe that a reader drains (as a container's stdout).
func BenchmarkAccessLine(b *testing.B) {
	for _, sink := range []string{"file", "pipe"} {
		for _, buffered := range []bool{false, true} {
			name := sink + "/" + map[bool]string{false: "direct", true: "buffered"}[buffered]
			b.Run(name, func(b *testing.B) {
				var f *os.File
				var err error
				if sink == "file" {
					f, err = os.Create(filepath.Join(b.TempDir(), "log"))
				} else {
					var r *os.File
					r, f, err = os.Pipe()
					if err == nil {
						drained := make(chan struct{})
						go func() { _, _ = io.Copy(io.Discard, r); close(drained) }()
						defer func() { <-drained; r.Close() }()
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				var out io.Writer = f
				if buffered {
					lb := newLogBuffer(f, logFlushEvery, logBufferSize)
					defer lb.Close()
					out = lb
				}
				l := zerolog.New(out).With().Timestamp().Logger()
				key := make([]byte, 32)
				b.ReportAllocs()
				for b.Loop() {
					l.Info().Str("request_id", "d4j0a1e8l9k5m2n3o4p5").Str("method", "POST").Str("route", "POST /v1/orders").
						Int("status", 201).Str("outcome", "executed").Str("key_source", "header").Hex("key_hash", key).
						Float64("upstream_ms", 0.412).Float64("total_ms", 0.731).Msg("request")
				}
			})
		}
	}
}
