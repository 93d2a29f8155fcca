package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Lines at info and below wait in a logBuffer at most this long, or until
// it holds this many bytes.
const (
	logFlushEvery = 100 * time.Millisecond
	logBufferSize = 64 << 10
)

// logBuffer gathers the JSON log's lines at info and below (the access log)
// and writes them in one write, at most logFlushEvery after the first of
// them: at LOG_LEVEL=info every request writes a line, and a write(2) per
// line was a third of that line's cost (issue 14). A line at warn or above,
// or without a level, is written at once, after the lines gathered before
// it, so that what needs attention does not wait and the order holds.
//
// A write that blocks (a stalled log reader) blocks the next lines' writers
// as an unbuffered log would: lines are never dropped. What a crash loses is
// at most logFlushEvery of info lines; a shutdown calls Close.
type logBuffer struct {
	out   io.Writer
	every time.Duration
	size  int

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer // armed while buf holds lines
	closed bool
}

func newLogBuffer(out io.Writer, every time.Duration, size int) *logBuffer {
	b := &logBuffer{out: out, every: every, size: size}
	b.timer = time.AfterFunc(time.Hour, b.flushTimer)
	b.timer.Stop()
	return b
}

// Write is for lines written without a level: they are not delayed.
func (b *logBuffer) Write(p []byte) (int, error) {
	return b.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel is what zerolog calls for each line. p is reused by zerolog
// once it returns, so a gathered line is copied.
func (b *logBuffer) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || (level >= zerolog.WarnLevel && len(b.buf) == 0) {
		return b.out.Write(p)
	}
	if len(b.buf) == 0 {
		b.timer.Reset(b.every)
	}
	b.buf = append(b.buf, p...)
	if level >= zerolog.WarnLevel || len(b.buf) >= b.size {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes the gathered lines now.
func (b *logBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

// Close writes the gathered lines; later lines are written at once.
func (b *logBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return b.flushLocked()
}

func (b *logBuffer) flushLocked() error {
	b.timer.Stop()
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.out.Write(b.buf)
	if cap(b.buf) > 2*b.size {
		b.buf = nil // one long line must not keep its memory
	} else {
		b.buf = b.buf[:0]
	}
	if err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	return nil
}

// flushTimer runs on the timer's goroutine, where no writer waits for the
// error: it is reported as zerolog reports a failed write.
func (b *logBuffer) flushTimer() {
	if err := b.Flush(); err != nil {
		if zerolog.ErrorHandler != nil {
			zerolog.ErrorHandler(err)
		} else {
			fmt.Fprintf(os.Stderr, "zerolog: could not write event: %v\n", err)
		}
	}
}
