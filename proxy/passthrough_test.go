package proxy_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestPassThroughUpstreamThatNeverReadsTheBody: a pass-through
// request (no key) whose upstream accepted the connection but never reads
// the body nor answers (a wedged process: the kernel still accepts on its
// listen socket) is never ended.
//
// Defect: the only bound on a pass-through forward is
// Transport.ResponseHeaderTimeout, which net/http starts only once the
// request body is completely written. While the upstream does not read,
// the transport's write blocks, the proxy stops reading the client (so
// idleBody's per-Read deadline is never reached: nothing is reading), and
// the request hangs for as long as the client keeps the connection open:
// one goroutine, one upstream connection and one client connection each,
// forever (main.go's http.Server has no WriteTimeout).
//
// Correct: a forward whose body makes no progress towards the upstream for
// UPSTREAM_TIMEOUT (or REQUEST_READ_TIMEOUT) is abandoned with 504/502,
// as a keyed one is (execute bounds it with a context deadline).
func TestPassThroughUpstreamThatNeverReadsTheBody(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 500 * time.Millisecond
		o.RequestReadTimeout = 500 * time.Millisecond
	})
	hold := make(chan struct{})
	defer close(hold) // before the servers' cleanups, which wait for handlers
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		// Never reads r.Body, never answers (bounded: 15s).
		select {
		case <-hold:
		case <-time.After(15 * time.Second):
		}
	})

	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 1<<30)

	// Keep the body flowing as fast as the proxy takes it, for at most 8s.
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		chunk := make([]byte, 64<<10)
		end := time.Now().Add(8 * time.Second)
		for i := 0; i < 100000 && time.Now().Before(end); i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := c.Write(chunk); err != nil && !isNetTimeout(err) {
				return
			}
		}
	}()
	defer func() { close(stop); <-writerDone }()

	// UPSTREAM_TIMEOUT + REQUEST_READ_TIMEOUT + plenty of slack.
	_ = c.SetReadDeadline(time.Now().Add(4 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("pass-through to an upstream that never reads its body: no answer within 4s "+
			"(UPSTREAM_TIMEOUT and REQUEST_READ_TIMEOUT are 500ms): %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode < 500 {
		t.Errorf("status %d, want a 5xx (upstream timed out)", resp.StatusCode)
	}
}

func isNetTimeout(err error) bool {
	type timeout interface{ Timeout() bool }
	te, ok := err.(timeout)
	return ok && te.Timeout()
}

// TestUpgradeOptionImpliesOff: a tunnel carries requests past keys, so a
// rule that allows protocol upgrades is a plain pass-through. Rules that
// would enforce keys and allow upgrades (POST ... upgrade required) are
// refused at start: otherwise any keyed POST carrying "Connection: Upgrade"
// would skip the claim, the replay and "required" on an upstream that
// ignores the Upgrade (RFC 9110 section 7.8).
func TestUpgradeOptionImpliesOff(t *testing.T) {
	for _, rule := range []string{"POST /v1/stream upgrade required", "POST /v1/stream upgrade ttl=1h", "GET /ws upgrade wait=1s"} {
		if _, err := proxy.ParseRoutes(rule); err == nil {
			t.Errorf("ParseRoutes(%q) accepted a rule that enforces keys and tunnels upgrades", rule)
		}
	}
	routes, err := proxy.ParseRoutes("POST /v1/stream upgrade")
	if err != nil {
		t.Fatal(err)
	}
	if !routes[0].Off {
		t.Errorf("upgrade rule not off: %+v", routes[0])
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	for range 2 {
		if r := e.do(req{path: "/v1/stream", key: "k", body: "x"}); r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("an upgrade (off) route replayed")
		}
	}
	if n := e.calls.Load(); n != 2 {
		t.Errorf("upstream calls %d, want 2 (the route is a pass-through)", n)
	}
}

// TestUpgradedConnectionCountedAs101: a WebSocket tunnelled on a
// route with "upgrade" succeeds (101), but the access log and
// idemproxy_responses_total record it as 502: passthrough's deferred
// function turns an unset status into 502, and ReverseProxy writes the 101
// to the hijacked connection without calling WriteHeader. Every successful
// upgrade thus shows as an upstream failure on dashboards and alerts.
//
// Correct: a switched connection is logged and counted as 101.
func TestUpgradedConnectionCountedAs101(t *testing.T) {
	routes, err := proxy.ParseRoutes("GET /ws upgrade")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	e.setUpstream(echoUpgrade)
	status, echo := upgradeOver(t, e, http.MethodGet, "/ws", "websocket")
	if status != http.StatusSwitchingProtocols || !strings.HasPrefix(echo, "echo") {
		t.Fatalf("upgrade: %d %q", status, echo)
	}
	// The handler finishes once the tunnel closes (upgradeOver closed it).
	eventually(t, 5*time.Second, "the upgraded request is counted", func() bool {
		return counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/ws"}) > 0
	})
	bad := counter(t, e.reg, "idemproxy_responses_total", map[string]string{"route": "/ws", "code": "502"})
	ok := counter(t, e.reg, "idemproxy_responses_total", map[string]string{"route": "/ws", "code": "101"})
	if bad != 0 || ok != 1 {
		t.Errorf("successful upgrade counted as code=502 %v times and code=101 %v times, want 0 and 1 (codes seen: %v)",
			bad, ok, labelValues(t, e.reg, "idemproxy_responses_total", "code"))
	}
	if strings.Contains(e.logs.String(), `"status":502`) {
		t.Errorf("access log records the successful upgrade as 502:\n%s", e.logs)
	}
}
