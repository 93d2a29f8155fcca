package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Lines at info and below wait in a logBuffer about this long (the timer's
// goroutine must get the CPU), or until it holds this many bytes.
const (
	logFlushEvery = 100 * time.Millisecond
	logBufferSize = 64 << 10
)

// pipeBuf is the most a write(2) to a pipe may carry and stay atomic
// (PIPE_BUF on Linux).
const pipeBuf = 4096

// logBuffer gathers the JSON log's lines at info and below (the access log)
// and writes them together, about logFlushEvery after the first of them:
// at LOG_LEVEL=info every request writes a line, and a write(2) per line
// was nearly all that line cost (measured under load). A line at warn or above, or
// without a level, is written at once, after the lines gathered before it,
// so that what needs attention does not wait and the order holds.
//
// Each write holds whole lines and at most pipeBuf bytes (a longer line
// goes alone), so that it stays atomic on a pipe that another process
// writes to as well (a tty, stderr sent to stdout), as a line was when
// written on its own.
//
// A write that blocks (a stalled log reader) blocks the next lines' writers
// as an unbuffered log would. A write that fails keeps what it did not
// write, and the timer tries again (a warning tries at once); while it
// fails, past 2×size the oldest lines are dropped, down to size. Every
// failure is returned, or reported as zerolog reports one. What a crash
// loses is the lines gathered since the last write; a shutdown calls Close,
// and lines after it are written at once and not kept.
type logBuffer struct {
	out   io.Writer
	every time.Duration
	size  int

	mu      sync.Mutex
	buf     []byte
	timer   *time.Timer // armed while buf holds lines
	failing bool        // the last write failed: the timer retries, not each line
	midLine bool        // buf starts with the rest of a line whose beginning was written
	closed  bool
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
// once it returns, so the line is copied; a line written at once goes
// through the buffer too, so that a failed write keeps it as well.
func (b *logBuffer) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.out.Write(p)
	}
	if len(b.buf) == 0 {
		b.timer.Reset(b.every)
	}
	b.buf = append(b.buf, p...)
	switch {
	case level >= zerolog.WarnLevel, len(b.buf) >= b.size && !b.failing:
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	case len(b.buf) > 2*b.size: // the writer fails; the timer tries again
		b.dropLocked()
	}
	return len(p), nil
}

// Flush writes the gathered lines now.
func (b *logBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

// Close writes the gathered lines; later lines are written at once. Lines
// that its write fails to take are not tried again.
func (b *logBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	err := b.flushLocked()
	b.timer.Stop()
	b.buf = nil
	return err
}

func (b *logBuffer) flushLocked() error {
	b.timer.Stop()
	var off int
	var err error
	for off < len(b.buf) && err == nil {
		c := chunk(b.buf[off:])
		var n int
		n, err = b.out.Write(b.buf[off : off+c])
		n = min(max(n, 0), c) // a Writer that claims more must not cut the buffer
		if err == nil && n < c {
			err = io.ErrShortWrite // as bufio.Writer: never spin on a Writer that takes nothing
		}
		off += n
	}
	if off > 0 {
		b.midLine = b.buf[off-1] != '\n'
	}
	b.buf = b.buf[:copy(b.buf, b.buf[off:])]
	b.failing = err != nil
	if err != nil {
		if len(b.buf) > 2*b.size {
			b.dropLocked()
		}
		if len(b.buf) > 0 {
			b.timer.Reset(b.every) // the kept lines are tried again
		}
		return fmt.Errorf("write log: %w", err)
	}
	if cap(b.buf) > 4*b.size {
		b.buf = nil // a burst of long lines must not keep its memory
	}
	return nil
}

// dropLocked drops the oldest whole lines, down to size bytes, while the
// writer fails (it runs past 2×size, so the copy is paid once per size
// bytes of new lines, not on every line). The rest of a line whose
// beginning was written stays, so that the line comes out whole.
func (b *logBuffer) dropLocked() {
	keep := 0
	if b.midLine {
		if keep = bytes.IndexByte(b.buf, '\n') + 1; keep == 0 {
			return // all of it is that line's rest
		}
	}
	from := lineStart(b.buf, max(keep, len(b.buf)-b.size))
	b.buf = b.buf[:keep+copy(b.buf[keep:], b.buf[from:])]
}

// chunk is how much of buf one write takes: whole lines, at most pipeBuf
// bytes, or one longer line alone.
func chunk(buf []byte) int {
	if len(buf) <= pipeBuf {
		return len(buf)
	}
	if i := bytes.LastIndexByte(buf[:pipeBuf], '\n'); i >= 0 {
		return i + 1
	}
	if i := bytes.IndexByte(buf, '\n'); i >= 0 {
		return i + 1
	}
	return len(buf)
}

// lineStart is where the first line that starts at or after n starts
// (len(buf) if none).
func lineStart(buf []byte, n int) int {
	if n == 0 || buf[n-1] == '\n' {
		return n
	}
	if i := bytes.IndexByte(buf[n:], '\n'); i >= 0 {
		return n + i + 1
	}
	return len(buf)
}

// flushTimer runs on the timer's goroutine, where no writer waits for the
// error.
func (b *logBuffer) flushTimer() {
	reportLogError(b.Flush())
}

// reportLogError reports a failed log write as zerolog reports one.
func reportLogError(err error) {
	if err == nil {
		return
	}
	if zerolog.ErrorHandler != nil {
		zerolog.ErrorHandler(err)
	} else {
		fmt.Fprintf(os.Stderr, "zerolog: could not write event: %v\n", err)
	}
}
