package main

// Review of c473d45 (logBuffer). Unbuffered, zerolog reported every log
// line whose write failed (zerolog.ErrorHandler, or "zerolog: could not
// write event" on stderr). Through the logBuffer, run ignores the error of
// the Flush after start (the "idemproxy started" line) and of the deferred
// Close (the shutdown lines): those lines are lost and nothing says so.

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

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

func TestReviewLBRunReportsEveryFailedLogWrite(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }
	defer func() { zerolog.ErrorHandler = old }()

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
