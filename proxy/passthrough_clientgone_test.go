package proxy_test

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

// A pass-through whose client breaks off before the answer is the client's
// doing, not the upstream's: its access line and idemproxy_responses_total
// say 499 (nginx's "client closed request"), never the 502 that an alert on
// upstream failures counts, and nothing blames the upstream.
func TestPassthroughClientLeftIs499(t *testing.T) {
	for _, tc := range []struct {
		name string
		// head and body are what the client sends before it hangs up,
		// once the upstream has the request.
		head, body string
	}{
		{"while the upstream works", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", "b"},
		{"in the middle of its body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", "only ten b"},
		{"in the middle of a chunked body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "a\r\nonly ten b\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.UpstreamTimeout = 5 * time.Second
			})
			arrived := make(chan struct{}, 1)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				// Reads what there is, and answers only after the proxy
				// gave up on the request (bounded at 5 s).
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
				w.WriteHeader(http.StatusCreated)
			})
			c := dialProxy(t, e)
			fmt.Fprint(c, tc.head+tc.body)
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream did not get the request within 5 s")
			}
			c.Close()

			line := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
			if !strings.Contains(line, `"status":499`) {
				t.Errorf("access line of a client that left: %s, want status 499", line)
			}
			if strings.Contains(e.logs.String(), "upstream request failed") {
				t.Errorf("the client's leaving was blamed on the upstream:\n%s", e.logs)
			}
			if n := counter(t, e.reg, "idemproxy_responses_total", map[string]string{"code": "499"}); n != 1 {
				t.Errorf("idemproxy_responses_total{code=499} = %v, want 1", n)
			}
			if got := labelValues(t, e.reg, "idemproxy_responses_total", "code"); len(got) != 1 {
				t.Errorf("idemproxy_responses_total codes %v, want only 499", got)
			}
		})
	}
}

// A pass-through whose client sends a body that cannot be read (malformed
// chunked framing) and stays to hear about it gets 400 body-unreadable, as
// a keyed request does, not a 502 that blames the upstream.
func TestPassthroughUnreadableBodyIs400(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	arrived := make(chan struct{}, 1)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	})
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprint(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a malformed chunked body within 5 s: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	var p map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p["type"] != "urn:idemproxy:problem:body-unreadable" {
		t.Errorf("problem %v (%v), want type body-unreadable", p, err)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("the problem has no X-Request-Id")
	}
	line := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
	if !strings.Contains(line, `"status":400`) || !strings.Contains(line, `"outcome":"no_key"`) {
		t.Errorf("access line %s, want status 400, outcome no_key", line)
	}
	if strings.Contains(e.logs.String(), "upstream request failed") {
		t.Errorf("the client's body was blamed on the upstream:\n%s", e.logs)
	}
}

// waitLogLine is the first line of logs that contains s, waiting for it at
// most within.
func waitLogLine(t *testing.T, logs *testutil.SyncBuffer, s string, within time.Duration) string {
	t.Helper()
	var line string
	testutil.Eventually(t, within, "a log line with "+s, func() bool {
		line = logLine(logs, s)
		return line != ""
	})
	return line
}
