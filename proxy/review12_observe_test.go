package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// slowPost writes a keyed POST to the proxy by hand, its body in pieces
// with a pause between them, and reads the answer. chunked sends the body
// with Transfer-Encoding: chunked instead of a Content-Length. Every step is
// bounded by a deadline.
func slowPost(t *testing.T, e *env, key string, pieces []string, pause time.Duration, chunked bool) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	head := "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key + "\r\n"
	if chunked {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	} else {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", total)
	}
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	for i, p := range pieces {
		if i > 0 {
			time.Sleep(pause)
		}
		if chunked {
			p = fmt.Sprintf("%x\r\n%s\r\n", len(p), p)
		}
		if _, err := io.WriteString(conn, p); err != nil {
			return 0, "write: " + err.Error()
		}
	}
	if chunked {
		_, _ = io.WriteString(conn, "0\r\n\r\n")
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "read: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReview12ObserveSlowBodyForwardedWhole: in observe mode a keyed body
// that keeps flowing but takes longer in all than REQUEST_READ_TIMEOUT is,
// per the README ("a body ... too slow; such a request is forwarded
// unclaimed, its body whole") and the contract ("changes no answer"),
// forwarded and answered by the upstream. The same body without a key (a
// plain pass-through, REQUEST_READ_TIMEOUT between reads) reaches the
// upstream. But readBody's read deadline fires on the connection, net/http
// cancels the request's context on that read error, and the forward that
// follows fails: the client gets the proxy's own error, not the upstream's
// answer, and the upstream never sees the request.
func TestReview12ObserveSlowBodyForwardedWhole(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				observe(o)
				o.RequestReadTimeout = 300 * time.Millisecond
				o.MaxBodyBytes = 16 // chunked: also too large (a body both too large and slow)
			})
			var seen atomic.Int64
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				seen.Store(int64(len(b)))
				e.created(w, r)
			})
			pieces := []string{"aaaaa", "bbbbb", "ccccc", "ddddd", "eeeee", "fffff"} // 30 bytes over ~750 ms, 150 ms apart
			if !chunked {
				e.opts.MaxBodyBytes = 1 << 20
				e.h, e.srv, e.reg = e.newProxy(e.opts)
			}
			status, body := slowPost(t, e, "slow-"+fmt.Sprint(chunked), pieces, 150*time.Millisecond, chunked)
			if status != http.StatusCreated || seen.Load() != 30 {
				t.Errorf("observe, slow body: %d %s; upstream saw %d bytes; want the upstream's 201 with all 30 bytes",
					status, strings.TrimSpace(body), seen.Load())
			}
			// Too large: forwarded unclaimed. Only slow: read read by read, as a
			// pass-through body is, then claimed and executed as a first request.
			want := map[bool]string{true: "would_reject", false: "executed"}[chunked]
			if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": want}); got != 1 {
				t.Errorf("%s %v, want 1", want, got)
			}
		})
	}
}

// TestReview12ObserveUpstreamFailureDetailTellsTheTruth: on an observed
// route the first request's upstream times out. The proxy writes its own
// 504 (as a pass-through would), but its detail is enforce's promise:
// with unknown=hold "it is not executed again: retries with this key get
// this status (outcome-unknown) until an operator purges the key" (with
// expire: "retries with this key get 409 until the claim expires"). In
// observe mode the retry is forwarded and executed at once, as the test
// shows: a client author reading the detail is told the opposite of what
// happens. Observe should not describe enforcement it does not do (the
// pass-through's plain detail, or one that says the route only observes).
func TestReview12ObserveUpstreamFailureDetailTellsTheTruth(t *testing.T) {
	for _, unknown := range []string{"hold", "expire"} {
		t.Run(unknown, func(t *testing.T) {
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.UpstreamTimeout = 300 * time.Millisecond
				o.Default.LockTTL = 400 * time.Millisecond
				o.Routes = mustRoutes(t, "POST /v1/shadow/* observe unknown="+unknown)
			})
			g := newGate()
			defer g.open()
			e.setUpstream(g.first(e.created, e.created))
			r := e.do(req{path: "/v1/shadow/1", key: "k", body: "b"})
			if r.StatusCode != http.StatusGatewayTimeout {
				t.Fatalf("first: %d %s, want 504", r.StatusCode, r.body)
			}
			detail, _ := r.problem(t)["detail"].(string)
			retry := e.do(req{path: "/v1/shadow/1", key: "k", body: "b"})
			if retry.StatusCode != http.StatusCreated || e.calls.Load() != 2 {
				t.Fatalf("retry: %d, calls %d; want it forwarded and executed (observe)", retry.StatusCode, e.calls.Load())
			}
			for _, promise := range []string{"not executed again", "get 409", "purges the key"} {
				if strings.Contains(detail, promise) {
					t.Errorf("observe, unknown=%s: first answer's detail %q promises %q, but the retry was forwarded and executed", unknown, detail, promise)
				}
			}
		})
	}
}
