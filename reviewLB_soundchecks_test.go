package main

// Review of c473d45 (logBuffer): checks that PASS, kept as evidence of what
// was found sound. Not findings.

import (
	"encoding/json"
	"log"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// No line is stranded: with a short interval, small size, every level and
// concurrent Flush calls, once the writers stop (no Close) the timer alone
// writes every line, each once, whole, in each writer's order.
func TestReviewLBSoundNoStrandedLines(t *testing.T) {
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

// Fatal: zerolog closes the LevelWriter (io.Closer) before exiting; the
// gathered lines come first, then the fatal line, and a later line goes
// straight through.
func TestReviewLBSoundFatal(t *testing.T) {
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

// Panic: the panic line flushes what was gathered, before it.
func TestReviewLBSoundPanic(t *testing.T) {
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

// The net/http ErrorLog adapter (newStdLog, and proxy's log.New(Logger))
// and the go-redis adapter write at once, after what was gathered.
func TestReviewLBSoundAdapters(t *testing.T) {
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

// A stalled stdout: writers wait (no line dropped), no timer goroutines
// pile up, and all come out once released.
func TestReviewLBSoundStalledWriter(t *testing.T) {
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

// A huge line (an attacker's 1 MB method in the access line) does not keep
// its memory in the buffer.
func TestReviewLBSoundHugeLine(t *testing.T) {
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
