package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview16bRecorded499ReplayIsAnswered: answer.write now abandons the
// connection (panic(http.ErrAbortHandler)) for any answer whose status is
// 499, not only for the proxy's own "client left" answer. An upstream may
// answer 499 itself (grpc-gateway and ESPv2 map gRPC CANCELLED to 499, some
// APIs use it for "request cancelled"); recorded without its body (too large
// to store, an event stream, or cut off), its replay is
// notStoredAnswer(499).write: the retrying client, which is there and
// waiting, gets the connection closed without an answer, on every retry
// until the record's TTL, and the access log and metrics say "client
// closed". Before 9544416 it was told 499 response-not-stored, as for any
// other recorded status.
func TestReview16bRecorded499ReplayIsAnswered(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.MaxStoredBytes = 16 })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(499)
		fmt.Fprint(w, strings.Repeat("x", 64)) // too large to record: BodyNotStored
	})
	first := e.do(req{key: "r499", body: "b"})
	if first.StatusCode != 499 {
		t.Fatalf("first answer %d, want the upstream's 499", first.StatusCode)
	}
	resp, err := e.send(t.Context(), e.srv, req{key: "r499", body: "b"})
	if err != nil {
		t.Fatalf("the retry (a replay of a recorded 499 without its body) got no answer: %v\nproxy log:\n%s", err, e.logs)
	}
	if resp.StatusCode != 499 || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: status %d, Idempotent-Replayed %q; want 499 and true", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if e.calls.Load() != 1 {
		t.Errorf("upstream calls %d, want 1", e.calls.Load())
	}
}
