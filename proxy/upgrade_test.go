package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// echoUpgrade is an upstream that switches to any protocol asked for and
// echoes one line inside the tunnel; plain requests get 200 naming the
// Upgrade header it saw.
func echoUpgrade(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "" {
		fmt.Fprintf(w, "plain, upgrade=%q", r.Header.Get("Upgrade"))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
	_ = brw.Flush()
	line, _ := brw.ReadString('\n')
	fmt.Fprintf(brw, "echo %s", line)
	_ = brw.Flush()
}

// upgradeOver sends an upgrade request on a raw connection and returns the
// status, and the tunnel's echo when it switched.
func upgradeOver(t *testing.T, e *env, method, path, protocol string) (int, string) {
	t.Helper()
	return upgradeOverAfter(t, e, method, path, protocol, 0)
}

// upgradeOverAfter waits idle before using the tunnel.
func upgradeOverAfter(t *testing.T, e *env, method, path, protocol string, idle time.Duration) (int, string) {
	t.Helper()
	c := dialProxy(t, e)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: %s\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 0\r\n\r\n", method, path, protocol)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s Upgrade %s: %v", method, path, protocol, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	time.Sleep(idle) // an idle tunnel, not a race: nothing else runs meanwhile
	fmt.Fprintf(c, "GET /inside HTTP/1.1\n")
	line, _ := br.ReadString('\n')
	return resp.StatusCode, line
}

// TestUpgradeRefusedUnlessRouteAllows: a 101 tunnel would carry requests
// past keys, REQUIRE_KEY and ROUTES. h2c is never tunnelled (the Upgrade is
// ignored and the request answered in HTTP/1.1); other protocols only on a
// route with the option "upgrade".
func TestUpgradeRefusedUnlessRouteAllows(t *testing.T) {
	routes, err := proxy.ParseRoutes("GET /ws upgrade; POST /ws/off off upgrade")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	e.setUpstream(echoUpgrade)

	status, body := upgradeOver(t, e, http.MethodGet, "/v1/orders", "h2c")
	if status != http.StatusOK || !strings.Contains(body, `upgrade=""`) {
		t.Errorf("h2c on a plain route: %d %q, want 200 without the Upgrade reaching the upstream", status, body)
	}
	status, body = upgradeOver(t, e, http.MethodGet, "/ws", "h2c")
	if status != http.StatusOK || !strings.Contains(body, `upgrade=""`) {
		t.Errorf("h2c on an upgrade route: %d %q, want it ignored too", status, body)
	}
	status, body = upgradeOver(t, e, http.MethodGet, "/v1/orders", "websocket")
	if status != http.StatusBadRequest || !strings.Contains(body, "urn:idemproxy:problem:upgrade-refused") {
		t.Errorf("websocket on a plain route: %d %q, want 400 upgrade-refused", status, body)
	}
	status, body = upgradeOver(t, e, http.MethodPost, "/v1/orders", "websocket")
	if status != http.StatusBadRequest {
		t.Errorf("websocket POST on a keyed route: %d %q, want 400", status, body)
	}
	status, body = upgradeOver(t, e, http.MethodGet, "/ws", "websocket")
	if status != http.StatusSwitchingProtocols || body != "echo GET /inside HTTP/1.1\n" {
		t.Errorf("websocket on the upgrade route: %d %q, want 101 and the tunnel", status, body)
	}
	status, _ = upgradeOver(t, e, http.MethodPost, "/ws/off", "websocket")
	if status != http.StatusSwitchingProtocols {
		t.Errorf("off upgrade route: %d, want 101", status)
	}
	// A tunnel has no deadlines: idle for twice UPSTREAM_TIMEOUT, it still works.
	status, body = upgradeOverAfter(t, e, http.MethodGet, "/ws", "websocket", 2*e.opts.UpstreamTimeout)
	if status != http.StatusSwitchingProtocols || body != "echo GET /inside HTTP/1.1\n" {
		t.Errorf("idle tunnel: %d %q, want the echo after %v idle", status, body, 2*e.opts.UpstreamTimeout)
	}
}

func TestRoutesUpgradeOption(t *testing.T) {
	for _, bad := range []string{"GET /ws upgrade=yes", "GET /ws off ttl=1h upgrade"} {
		if _, err := proxy.ParseRoutes(bad); err == nil {
			t.Errorf("ParseRoutes(%q) accepted", bad)
		}
	}
}
