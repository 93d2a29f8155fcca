package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestFastClientOfSlowUpstreamGetsTheWholeAnswer: the slow-client write deadline is
// absolute from the START of the upstream call (start+UPSTREAM_TIMEOUT/2),
// not from when the answer begins. An upstream that legitimately answers
// after 60% of UPSTREAM_TIMEOUT has its answer cut for a client that reads at
// full speed.
func TestFastClientOfSlowUpstreamGetsTheWholeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		chunked bool
		size    int
	}{{"content-length-64KiB", false, 64 << 10}, {"chunked-small", true, 200}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.UpstreamTimeout = 2 * time.Second
				o.Default.LockTTL = 8 * time.Second
			})
			body := strings.Repeat("y", tc.size)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				time.Sleep(1200 * time.Millisecond) // 60% of UPSTREAM_TIMEOUT: well within it
				if !tc.chunked {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				w.WriteHeader(http.StatusCreated)
				if tc.chunked {
					w.(http.Flusher).Flush() // no Content-Length: chunked, as a streaming upstream sends it
				}
				_, _ = io.WriteString(w, body)
			})
			r, err := e.send(t.Context(), e.srv, req{key: "slow-" + tc.name, body: "x"})
			switch {
			case err != nil:
				t.Errorf("FAST CLIENT CUT: upstream answered within UPSTREAM_TIMEOUT, client got error: %v", err)
			case r.StatusCode != http.StatusCreated || len(r.body) != len(body):
				t.Errorf("FAST CLIENT CUT: status %d, %d of %d body bytes", r.StatusCode, len(r.body), len(body))
			}
			retry := e.do(req{key: "slow-" + tc.name, body: "x"})
			if retry.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Errorf("retry: %d replayed=%q; upstream calls %d, want a replay and 1 call", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), e.calls.Load())
			}
		})
	}
}
