package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReviewDLCoalescedDeadlineOnRealConnection pins, over real TCP (not the
// deadlineWriter of deadline_coalesce_test.go), the two sides of the kept
// write deadline on a pass-through stream whose writes follow each other
// far more often than the slack (UPSTREAM_TIMEOUT 400ms, slack 50ms,
// a write every 5ms):
//   - a client that reads at full speed gets the whole stream, which lasts
//     three times UPSTREAM_TIMEOUT: the kept deadline keeps sliding;
//   - a client that stops reading is cut within UPSTREAM_TIMEOUT plus its
//     slack of the proxy's blocked write (asserted loosely: within 4 x
//     UPSTREAM_TIMEOUT of the stall, the buffers' fill time included).
//
// Passes at aeeff14: evidence, not a defect.
func TestReviewDLCoalescedDeadlineOnRealConnection(t *testing.T) {
	const timeout = 400 * time.Millisecond
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = timeout })
	var failedAt atomic.Int64 // unix nanos of the upstream's first failed write
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := 240 // 3 x UPSTREAM_TIMEOUT of writes
		if r.URL.Query().Get("endless") != "" {
			n = 2000 // at most 10s; ends when the proxy gives up
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		chunk := strings.Repeat("s", 1024)
		for i := 0; i < n; i++ {
			if _, err := io.WriteString(w, chunk); err != nil {
				failedAt.CompareAndSwap(0, time.Now().UnixNano())
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("fast client", func(t *testing.T) {
		start := time.Now()
		r, err := e.send(t.Context(), e.srv, req{path: "/stream", body: "x"})
		if err != nil {
			t.Fatalf("fast client cut after %v: %v", time.Since(start), err)
		}
		if len(r.body) != 240*1024 {
			t.Fatalf("fast client got %d of %d bytes in %v", len(r.body), 240*1024, time.Since(start))
		}
		if d := time.Since(start); d < 2*timeout {
			t.Fatalf("stream lasted %v, want over 2 x UPSTREAM_TIMEOUT for the test to mean anything", d)
		}
	})

	t.Run("stalled client", func(t *testing.T) {
		// Small kernel buffers on both ends (see smallSendBuffers): the
		// proxy's writes block after a few KiB, not after megabytes.
		srv := smallBufferServer(t, e.h)
		c := dialSmallRcvbuf(t, srv.Listener.Addr().String())
		defer c.Close()
		fmt.Fprintf(c, "POST /stream?endless=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 8<<10)); err != nil {
			t.Fatal(err)
		}
		stall := time.Now() // never read again
		for end := time.Now().Add(10 * time.Second); failedAt.Load() == 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		if failedAt.Load() == 0 {
			t.Fatal("a client that stopped reading held the stream for 10s")
		}
		if d := time.Unix(0, failedAt.Load()).Sub(stall); d > 4*timeout {
			t.Errorf("stalled client cut %v after it stopped reading, want within ~UPSTREAM_TIMEOUT+slack (asserted < %v)", d, 4*timeout)
		} else {
			t.Logf("stalled client cut %v after it stopped reading", d)
		}
	})
}
