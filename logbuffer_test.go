package main

// Tests of logbuffer.go: the JSON log's lines at info and below gathered and
// written together, warnings at once, every line whole and in order, and
// what happens when stdout fails or stalls; then run's use of it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

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

// TestLogBufferStrandsNoLine: with a short interval, small size, every level
// and concurrent Flush calls, once the writers stop (no Close) the timer
// alone writes every line, each once, whole, in each writer's order.
func TestLogBufferStrandsNoLine(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		w := &writes{}
		b := newLogBuffer(w, 200*time.Microsecond, 700)
		l := zerolog.New(b)
		const writers, each = 6, 300
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var flusher sync.WaitGroup
		flusher.Go(func() {
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_ = b.Flush()
				runtime.Gosched()
			}
		})
		for g := range writers {
			wg.Go(func() {
				for i := range each {
					ev := l.Info()
					switch (i + g + round) % 11 {
					case 2:
						ev = l.Debug()
					case 5:
						ev = l.Warn()
					case 7:
						ev = l.Trace()
					}
					if (i+g)%37 == 0 {
						l.Log().Int("g", g).Int("i", i).Msg("nolevel")
						continue
					}
					ev.Int("g", g).Int("i", i).Msg("line")
				}
			})
		}
		wg.Wait()
		close(stop)
		flusher.Wait()
		want := writers * each
		deadline := time.Now().Add(5 * time.Second)
		var lines []string
		for {
			lines = strings.Split(strings.TrimSuffix(strings.Join(w.get(), ""), "\n"), "\n")
			if len(lines) >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		next := make([]int, writers)
		for _, line := range lines {
			var e struct{ G, I int }
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("round %d: line %q: %v", round, line, err)
			}
			if e.I != next[e.G] {
				t.Fatalf("round %d: writer %d: line %d after %d", round, e.G, e.I, next[e.G]-1)
			}
			next[e.G]++
		}
		if len(lines) != want {
			t.Fatalf("round %d: %d lines out without Close, want %d (stranded)", round, len(lines), want)
		}
	}
}

// TestLogBufferStalledWriter: on a stalled stdout writers wait (no line
// dropped), no timer goroutines pile up, and all come out once released.
func TestLogBufferStalledWriter(t *testing.T) {
	out := &blockingOut{release: make(chan struct{})}
	b := newLogBuffer(out, time.Millisecond, 4096)
	l := zerolog.New(b)
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	const writers, each = 20, 50
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				l.Info().Int("g", g).Int("i", i).Str("pad", strings.Repeat("x", 100)).Msg("line")
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // let the timer fire many times while stalled
	if extra := runtime.NumGoroutine() - base; extra > writers+3 {
		t.Errorf("%d goroutines more than before, want at most the writers and a timer or two", extra)
	}
	// (b.mu is held by the stalled write: the buffer cannot grow meanwhile.)
	close(out.release)
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if got := strings.Count(string(out.data), "\n"); got != writers*each {
		t.Fatalf("%d lines, want %d", got, writers*each)
	}
}

// blockingOut blocks every write until released.
type blockingOut struct {
	release chan struct{}
	n       atomic.Int64
	mu      sync.Mutex
	data    []byte
}

func (o *blockingOut) Write(p []byte) (int, error) {
	<-o.release
	o.mu.Lock()
	o.data = append(o.data, p...)
	o.mu.Unlock()
	o.n.Add(1)
	return len(p), nil
}

// TestLogBufferFatal: zerolog closes the LevelWriter (io.Closer) before
// exiting; the gathered lines come first, then the fatal line, and a later
// line goes straight through.
func TestLogBufferFatal(t *testing.T) {
	oldExit := zerolog.FatalExitFunc
	exited := false
	zerolog.FatalExitFunc = func() { exited = true }
	defer func() { zerolog.FatalExitFunc = oldExit }()
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	l.Info().Msg("a")
	l.Fatal().Msg("b")
	l.Info().Msg("c")
	got := w.get()
	if !exited || len(got) != 2 || !strings.Contains(got[0], `"a"`) || !strings.Contains(got[0], `"b"`) || !strings.Contains(got[1], `"c"`) {
		t.Fatalf("exited %v, writes %q", exited, got)
	}
}

// TestLogBufferPanic: the panic line flushes what was gathered, before it.
func TestLogBufferPanic(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	l.Info().Msg("a")
	func() {
		defer func() { _ = recover() }()
		l.Panic().Msg("b")
	}()
	got := w.get()
	if len(got) != 1 || strings.Index(got[0], `"a"`) > strings.Index(got[0], `"b"`) {
		t.Fatalf("writes %q", got)
	}
}

// TestLogBufferAdaptersWriteAtOnce: the net/http ErrorLog adapter (newStdLog,
// and proxy's log.New(Logger)) and the go-redis adapter write at once, after
// what was gathered.
func TestLogBufferAdaptersWriteAtOnce(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, 1<<20)
	l := zerolog.New(b)
	l.Info().Msg("gathered")
	newStdLog(l).Printf("http: superfluous response.WriteHeader call")
	log.New(l, "", 0).Printf("httputil: ReverseProxy read error during body copy")
	l.Info().Msg("gathered2")
	redisLogger{l}.Printf(t.Context(), "redis: dial tcp 127.0.0.1:1: connection refused")
	got := w.get()
	if len(got) != 3 || !strings.Contains(got[0], "gathered") || !strings.Contains(got[0], "superfluous") ||
		!strings.Contains(got[1], "ReverseProxy") || !strings.Contains(got[2], "gathered2") || !strings.Contains(got[2], "go-redis") {
		t.Fatalf("writes %q", got)
	}
}

// TestLogBufferHugeLineNotKept: a huge line (an attacker's 1 MB method in the
// access line) does not keep its memory in the buffer.
func TestLogBufferHugeLineNotKept(t *testing.T) {
	w := &writes{}
	b := newLogBuffer(w, time.Hour, logBufferSize)
	l := zerolog.New(b)
	l.Info().Str("method", strings.Repeat("A", 1<<20)).Msg("request")
	l.Info().Msg("small")
	b.mu.Lock()
	c := cap(b.buf)
	b.mu.Unlock()
	if c > 2*logBufferSize {
		t.Fatalf("cap %d after a 1 MiB line", c)
	}
	_ = b.Close()
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

// TestLogBufferChunkEdges: chunk cuts a write at a line's end, at most
// pipeBuf bytes unless one line is longer; lineStart finds where the next
// whole line begins.
func TestLogBufferChunkEdges(t *testing.T) {
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

func TestLogBufferWriteErrors(t *testing.T) {
	w := &writes{err: errors.New("broken pipe")}
	b := newLogBuffer(w, time.Hour, 1<<20) // the test runs the timer's flush itself
	l := zerolog.New(b)
	var mu sync.Mutex
	var reported []error
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(reported) }
	onLogWriteError(t, func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() })
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
	onLogWriteError(t, func(error) {})

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

// TestLogBufferFailedWriteLosesAtMostOneLine: README: "Lines are never
// dropped". A write that fails once (a full disk when stdout is a file, as
// make bench's info phase sends it, then space freed) loses one line
// unbuffered; through the logBuffer it used to lose every line gathered with
// it (up to 64 KiB, some 200 access lines), other requests' lines included,
// and only the one goroutine whose line triggered the flush (or the timer)
// heard of it.
func TestLogBufferFailedWriteLosesAtMostOneLine(t *testing.T) {
	onLogWriteError(t, func(error) {}) // the failure is expected; keep stderr quiet

	out := &failOnce{}
	b := newLogBuffer(out, time.Hour, logBufferSize) // only the warning flushes
	l := zerolog.New(b)
	const n = 20
	for i := range n {
		l.Info().Int("i", i).Msg("request")
	}
	l.Warn().Msg("upstream request failed") // one write: the 20 gathered lines and this one; it fails
	l.Info().Msg("after")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if written, logged := len(out.lines), n+2; logged-written > 1 {
		t.Errorf("one failed write: %d of %d lines written, %d lost (unbuffered: 1 lost); README says lines are never dropped", written, logged, logged-written)
	}
}

// failOnce fails its first write, then takes every write.
type failOnce struct {
	mu     sync.Mutex
	failed bool
	lines  []string
}

func (f *failOnce) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failed {
		f.failed = true
		return 0, errors.New("no space left on device")
	}
	f.lines = append(f.lines, strings.Split(strings.TrimSuffix(string(p), "\n"), "\n")...)
	return len(p), nil
}

// TestLogBufferRetriesAFailedWarning: the doc comment ("A write that fails
// keeps what it did not write for the next one") and README ("what it did
// not take is tried again") promise a retry. A warning written at once
// because nothing was gathered used not to be kept, while the same warning
// after one gathered info line was: whether a failed warning survived
// depended on the traffic before it.
func TestLogBufferRetriesAFailedWarning(t *testing.T) {
	onLogWriteError(t, func(error) {})
	for _, withInfo := range []bool{true, false} {
		w := &flaky{fails: 1}
		b := newLogBuffer(w, time.Hour, 1<<20)
		l := zerolog.New(b)
		if withInfo {
			l.Info().Msg("before")
		}
		l.Warn().Msg("disk full") // its write fails
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.String(), "disk full") {
			t.Errorf("gathered info before it: %v: the failed warning was not tried again (output %q)", withInfo, w.String())
		}
	}
}

// TestLogBufferPartialWriteLosesNothing: a write that took part of a line
// and failed loses nothing once the writer works again.
func TestLogBufferPartialWriteLosesNothing(t *testing.T) {
	onLogWriteError(t, func(error) {})

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

// TestLogBufferPartialWriteThenDropKeepsLinesWhole: after a partial write
// the buffer starts with the rest of a line whose head is already out. If
// the writer keeps failing until the buffer passes 2×size, the oldest lines
// are dropped; dropping that rest would make the next successful write
// continue the half line with another line, and the output would hold a line
// that is not JSON.
func TestLogBufferPartialWriteThenDropKeepsLinesWhole(t *testing.T) {
	onLogWriteError(t, func(error) {})

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

// TestLogBufferShortWriteWithoutErrorStops: flushLocked guards against a
// Writer claiming n > len(p); on one that returns (0, nil) it must not loop
// for ever holding the mutex (every logger blocked), but stop with
// io.ErrShortWrite, as bufio.Writer does.
func TestLogBufferShortWriteWithoutErrorStops(t *testing.T) {
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

// TestLogBufferFailingWriterRetriedByTheTimer: with the writer failing for
// good, once 2×size is held, retrying at every info line's size flush would
// cost a failed write(2), a report, and a copy of the whole kept buffer
// (~2×size) under the mutex, per line (unbuffered costs the write and the
// report only). The retry waits for the timer instead.
func TestLogBufferFailingWriterRetriedByTheTimer(t *testing.T) {
	var reports atomic.Int64
	onLogWriteError(t, func(error) { reports.Add(1) })

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

type countFail struct{ calls atomic.Int64 }

func (w *countFail) Write(p []byte) (int, error) {
	w.calls.Add(1)
	return 0, errors.New("no space left on device")
}

// TestLogBufferTimerRetriesToTheEnd: no line stranded after failures (full,
// partial, none taken): after each failed flush the timer is armed, and its
// callback (called here, the timer set to an hour so that none runs on its
// own) writes every line, whole, in order; with nothing held no timer is
// armed.
func TestLogBufferTimerRetriesToTheEnd(t *testing.T) {
	var reports atomic.Int64
	onLogWriteError(t, func(error) { reports.Add(1) })
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

// TestLogBufferAfterClose: Close on a failing writer: error returned, timer
// stopped, nothing held; later lines written at once and not kept; Flush
// after Close is a no-op.
func TestLogBufferAfterClose(t *testing.T) {
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
	onLogWriteError(t, func(error) {})
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

// TestLogBufferErrorHandlerMayLog: an ErrorHandler that logs through the same
// logger (timer flush, size flush, warning, Close) does not deadlock: every
// report is made with the mutex released.
func TestLogBufferErrorHandlerMayLog(t *testing.T) {
	w := &flaky{fails: 1 << 30}
	b := newLogBuffer(w, time.Hour, 512)
	l := zerolog.New(b)
	var depth, reports atomic.Int64
	onLogWriteError(t, func(err error) {
		reports.Add(1)
		if depth.Add(1) == 1 {
			l.Warn().Err(err).Msg("log write failed")
			l.Info().Msg("again")
		}
		depth.Add(-1)
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			l.Info().Int("i", i).Msg("r")
			if i%50 == 0 {
				l.Warn().Msg("w")
			}
		}
		b.flushTimer() // the timer's path, here so that it ends before the handler is put back
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

// TestRunReportsEveryFailedLogWrite: unbuffered, zerolog reports every log
// line whose write failed (zerolog.ErrorHandler, or "zerolog: could not
// write event" on stderr). Through the logBuffer, run used to ignore the
// error of the Flush after start (the "idemproxy started" line) and of the
// deferred Close (the shutdown lines): those lines were lost and nothing
// said so.
func TestRunReportsEveryFailedLogWrite(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	onLogWriteError(t, func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() })

	out := &failingOut{}
	p := startRun(t, out, "LOG_LEVEL=info")
	_ = p.stop() // run's own error is not the point: what was reported is

	mu.Lock()
	nReported := len(reported)
	mu.Unlock()
	var lost []string
	for _, w := range out.get() {
		for _, line := range strings.Split(strings.TrimSuffix(w, "\n"), "\n") {
			if strings.Contains(line, "idemproxy started") || strings.Contains(line, "shut down cleanly") {
				lost = append(lost, line)
			}
		}
	}
	if failedWrites := len(out.get()); nReported < failedWrites {
		t.Errorf("%d writes to stdout failed, %d failures reported (zerolog.ErrorHandler); unreported, the lines %q are lost silently", failedWrites, nReported, lost)
	}
}

// failingOut fails every write and remembers what it was asked to write.
type failingOut struct {
	mu     sync.Mutex
	failed []string
}

func (f *failingOut) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, string(p))
	return 0, errors.New("write /dev/stdout: no space left on device")
}

func (f *failingOut) get() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.failed...)
}

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

// onLogWriteError makes f receive what zerolog reports (a log write that
// failed) until the test ends. zerolog.ErrorHandler is the process's: a
// test that uses this must not run in parallel.
func onLogWriteError(t *testing.T, f func(error)) {
	t.Helper()
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = f
	t.Cleanup(func() { zerolog.ErrorHandler = old })
}
