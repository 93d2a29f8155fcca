package proxy_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestPassthroughEarlyHintsToStalledClient: a pass-through request whose
// upstream answers at once with a large 103 Early Hints and then 201, to a
// client that does not read. ReverseProxy relays the 1xx from the
// Transport's reader; while that write blocks, the final answer cannot be
// read. Under the ordinary write deadline (UPSTREAM_TIMEOUT) the watchdog
// fired first: 504 and "upstream took neither the request body nor
// answered", an upstream timeout in the log and the metrics, of an upstream
// that answered in milliseconds. Under half of the time left, the 1xx write
// fails first: the request ends with the upstream's 201, or, when net/http
// cancels the request of a client whose write failed before that is read,
// as any pass-through whose client left (499, "context canceled" at debug); never as
// an upstream timeout.
func TestPassthroughEarlyHintsToStalledClient(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = time.Second
		o.Default.LockTTL = 4 * time.Second
	})
	var done atomic.Int32
	e.setUpstream(largeHintsThenCreated(&done))
	logs := e.logs
	srv := smallBufferServer(t, e.h)

	c := dialSmallRcvbuf(t, srv.Listener.Addr().String())
	defer c.Close()
	// No Idempotency-Key: a pass-through.
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb")
	// The client never reads. The request line is logged when the handler
	// ends: within UPSTREAM_TIMEOUT and its slack, bounded here at 5 s.
	var line string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if line = logLine(logs, `"message":"request"`); line != "" {
			break
		}
	}
	if done.Load() != 1 {
		t.Fatalf("upstream answered %d times, want 1", done.Load())
	}
	if line == "" {
		t.Fatal("no access log line within 5 s")
	}
	if !strings.Contains(line, `"status":201`) && !strings.Contains(logs.String(), `"error":"context canceled"`) {
		t.Errorf("access log of an upstream that answered 201 at once, to a client that did not read: %s", line)
	}
	if strings.Contains(line, `"status":504`) || strings.Contains(logs.String(), "UPSTREAM_TIMEOUT") {
		t.Errorf("the stalled client was blamed on the upstream:\n%s", logs)
	}
}

// logLine is the first line of logs that contains s, or "".
func logLine(logs *testutil.SyncBuffer, s string) string {
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
