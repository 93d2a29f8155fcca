package proxy_test

// Review RL (request id in the handler). Answer paths whose X-Request-Id was
// missing or doubled. Neither was introduced by 62cd321 (the middleware it
// replaced set the header at the same point, before the handler); both
// contradicted the README ("An upstream's own X-Request-Id is replaced by
// it ... on pass-through answers alike"; every answer carries the id of its
// access-log line).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// reviewRLLogLines parses the proxy's JSON log.
func reviewRLLogLines(t *testing.T, logs *testutil.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		out = append(out, m)
	}
	return out
}

// reviewRLAccessID is the request_id of the (only) access-log line, once
// it is written.
func reviewRLAccessID(t *testing.T, logs *testutil.SyncBuffer) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, l := range reviewRLLogLines(t, logs) {
			if l["message"] == "request" {
				id, _ := l["request_id"].(string)
				return id
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access-log line:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReviewRLKeyedEarlyHintsThenFailureKeepsRequestID: the upstream sends
// 103 Early Hints, then breaks off before a final answer. ReverseProxy
// clears the header map after relaying a 1xx; the keyed path restores the
// proxy's headers only in exchange.WriteHeader, and execute writes the
// failure's problem (502) straight to the client's writer: the answer
// carries no X-Request-Id (and no Idempotency-Key echo), so the client
// cannot name the request whose outcome is now unknown.
func TestReviewRLKeyedEarlyHintsThenFailureKeepsRequestID(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		fmt.Fprint(brw, "HTTP/1.1 103 Early Hints\r\nLink: </app.css>; rel=preload\r\n\r\n")
		_ = brw.Flush()
		conn.Close() // no final answer: the 103 is read first, then EOF
	})
	r := e.do(req{key: "rl-hints-1", body: `{"amount":1}`})
	if r.StatusCode < 500 {
		t.Fatalf("status %d, want the upstream failure's 5xx: %s", r.StatusCode, r.body)
	}
	id := reviewRLAccessID(t, e.logs)
	if got := r.Header.Values(proxy.RequestIDHeader); len(got) != 1 || got[0] != id {
		t.Errorf("%d answer after a 103: X-Request-Id %q, want [%q] (the access-log line's request_id)", r.StatusCode, got, id)
	}
	if got := r.Header.Values("Idempotency-Key"); len(got) != 1 || got[0] != "rl-hints-1" {
		t.Errorf("%d answer after a 103: Idempotency-Key echo %q, want [rl-hints-1]", r.StatusCode, got)
	}
}

// TestReviewRLUpgradeReplacesUpstreamRequestID: a 101 is written by
// ReverseProxy itself on the hijacked connection (handleUpgradeResponse
// adds the upstream's headers to the proxy's and never calls WriteHeader),
// so statusWriter never restores the proxy's id: an upstream that sends
// X-Request-Id on its 101 (most frameworks do on every answer) gives the
// client two ids.
func TestReviewRLUpgradeReplacesUpstreamRequestID(t *testing.T) {
	routes, err := proxy.ParseRoutes("GET /ws upgrade")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Request-Id: upstream-id\r\n\r\n")
		_ = brw.Flush()
		_, _ = brw.ReadString('\n')
	})
	c := dialProxy(t, e)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "bye\n")
	c.Close() // the tunnel ends; the access line follows
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	id := reviewRLAccessID(t, e.logs)
	if got := resp.Header.Values(proxy.RequestIDHeader); len(got) != 1 || got[0] != id {
		t.Errorf("101: X-Request-Id %q, want [%q] (the access-log line's request_id only)", got, id)
	}
}
