package main

// Review of c473d45 (logBuffer). Unbuffered, zerolog reported every log
// line whose write failed (zerolog.ErrorHandler, or "zerolog: could not
// write event" on stderr). Through the logBuffer, run ignores the error of
// the Flush after start (the "idemproxy started" line) and of the deferred
// Close (the shutdown lines): those lines are lost and nothing says so.

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
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

	up := newUpstream(t)
	listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	env := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=" + listen, "ADMIN_ADDR=" + admin, "LOG_LEVEL=info",
		"UPSTREAM_TIMEOUT=5s", "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=22s"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &failingOut{}
	var stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"idemproxy"}, env, out, &stderr) }()
	waitStatus(t, newClient(t), "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not return within 10s of ctx cancel")
	}

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
