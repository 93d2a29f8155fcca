package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// countingConn counts the writes made on a connection to the upstream.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A keyed request's body is in memory: its headers and body go to the
// upstream in one write. ReverseProxy wraps a request body in a reader the
// Transport does not know to be in memory, and the Transport then flushes
// the headers first: two writes, and two reads for the upstream.
func TestKeyedRequestIsOneWrite(t *testing.T) {
	// Not forBoth: its subtests run in parallel, and each needs a counter of
	// its own (a shared one was reset by the other subtest mid-request).
	for _, b := range bothBackends {
		t.Run(b, func(t *testing.T) { testKeyedRequestIsOneWrite(t, b) })
	}
}

func testKeyedRequestIsOneWrite(t *testing.T, backend string) {
	var writes atomic.Int64
	e := newEnv(t, backend, func(o *proxy.Options) {
		tr := proxy.NewTransport()
		dial := tr.DialContext
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, &writes}, nil
		}
		o.Transport = tr
	})
	body := `{"amount":100,"note":"` + strings.Repeat("x", 2000) + `"}`
	for i, key := range []string{"one-write-1", "one-write-2"} {
		writes.Store(0)
		resp := e.do(req{key: key, body: body})
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		if got := writes.Load(); got != 1 {
			t.Errorf("request %d: %d writes to the upstream, want 1 (headers and body together)", i, got)
		}
		if want := fmt.Sprintf(`"body_len":%d`, len(body)); !strings.Contains(string(resp.body), want) {
			t.Errorf("request %d: upstream saw %s, want the whole body", i, resp.body)
		}
	}
}
