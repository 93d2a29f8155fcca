package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// How an armed faultConn's write fails.
type faultMode int

const (
	// Not a byte reaches the socket: the upstream had reset it.
	faultNothing faultMode = iota
	// Half the write reaches the socket, then it fails: (n>0, error).
	faultShort
	// The whole write reaches the socket, and the layer reports
	// (0, error): as crypto/tls does when a record went out in part.
	faultUnreported
)

// fault is shared by the connections of one Transport. Armed, the next
// write on any of them fails (mode), and that connection is dead from then
// on: every later write fails with nothing sent, as on a reset socket.
type fault struct {
	mode     faultMode
	armed    atomic.Bool
	failDial atomic.Bool // the next dial fails (not a *net.OpError)
	dials    atomic.Int64
}

var errResetByTest = &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}

// faultConn is a layer over an upstream connection that declares the
// connection it wraps (NetConn), as crypto/tls does: it stands for the
// socket failing, below the layers above it.
type faultConn struct {
	net.Conn
	f    *fault
	dead atomic.Bool
}

func (c *faultConn) NetConn() net.Conn { return c.Conn }

func (c *faultConn) Write(p []byte) (int, error) {
	if c.dead.Load() {
		return 0, errResetByTest
	}
	if !c.f.armed.CompareAndSwap(true, false) {
		return c.Conn.Write(p)
	}
	c.dead.Store(true)
	switch c.f.mode {
	case faultShort:
		n, _ := c.Conn.Write(p[:len(p)/2])
		return n, errResetByTest
	case faultUnreported:
		_, _ = c.Conn.Write(p)
		return 0, errResetByTest
	}
	return 0, errResetByTest
}

// opaqueConn hides the connection under it: the proxy cannot know what
// reached the socket.
type opaqueConn struct{ net.Conn }

// withFault makes tr dial through f; opaque hides each connection.
func withFault(tr *http.Transport, f *fault, opaque bool) *http.Transport {
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if f.failDial.CompareAndSwap(true, false) {
			return nil, errors.New("test: dial refused")
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		f.dials.Add(1)
		fc := &faultConn{Conn: c, f: f}
		if opaque {
			return opaqueConn{fc}, nil
		}
		return fc, nil
	}
	return tr
}

func problemType(t *testing.T, r response) any { t.Helper(); return r.problem(t)["type"] }

const (
	typeFailed      = "urn:idemproxy:problem:upstream-failed"
	typeUnreachable = "urn:idemproxy:problem:upstream-unreachable"
	typeUnknown     = "urn:idemproxy:problem:outcome-unknown"
)

var resendBody = `{"amount":100,"note":"` + strings.Repeat("x", 200) + `"}`

// TestResendNeverOnceBytesReachedTheSocket: the Transport resends a request
// whose write failed on a reused connection when it counted nothing
// written. A layer can say so while bytes did reach the socket (a TLS
// record sent in part returns 0); and a short write is written. Either way
// the request may have been executed: it is never sent again, and the
// upstream executes it at most once.
func TestResendNeverOnceBytesReachedTheSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode faultMode
		hold bool
	}{
		{"short", faultShort, false},
		{"unreported", faultUnreported, false},
		{"unreported-hold", faultUnreported, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fault{mode: tc.mode}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Hold = tc.hold
				o.Transport = withFault(proxy.NewTransport(), f, false)
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up: status %d", r.StatusCode)
			}
			// The copy that reaches the upstream whole is held until the proxy
			// has answered: its own 201 must not beat the write error (it would
			// be a legitimate answer on the first connection). A resent copy
			// would be answered at once.
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			t.Cleanup(open)
			var calls atomic.Int64
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Idempotency-Key") == "sent-1" && calls.Add(1) == 1 {
					select {
					case <-release:
					case <-time.After(5 * time.Second):
					}
				}
				e.created(w, r)
			})
			f.armed.Store(true)
			r := e.do(req{key: "sent-1", body: resendBody})
			open()
			t.Logf("client got %d %s (dials %d)", r.StatusCode, r.body, f.dials.Load())
			if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeFailed {
				t.Errorf("status %d %s, want 502 %s: the request may have been executed", r.StatusCode, r.body, typeFailed)
			}
			// A resend would have been answered before the proxy answered.
			if n := e.upstream.KeyCalls("sent-1"); n > 1 {
				t.Fatalf("DOUBLE EXECUTION: upstream executed key sent-1 %d times", n)
			}
			if n := f.dials.Load(); n != 1 {
				t.Errorf("%d dials, want 1: no resend on a new connection", n)
			}
			if tc.mode == faultUnreported { // the whole request reached the upstream
				eventually(t, 5*time.Second, "the upstream executes the copy that reached it", func() bool {
					return e.upstream.KeyCalls("sent-1") >= 1
				})
			}
			r2 := e.do(req{key: "sent-1", body: resendBody})
			switch {
			case tc.hold && (r2.StatusCode != http.StatusBadGateway || problemType(t, r2) != typeUnknown):
				t.Errorf("client retry: %d %s, want 502 %s", r2.StatusCode, r2.body, typeUnknown)
			case !tc.hold && r2.StatusCode != http.StatusConflict:
				t.Errorf("client retry: %d %s, want 409 (claim kept)", r2.StatusCode, r2.body)
			}
			if n := e.upstream.KeyCalls("sent-1"); n > 1 {
				t.Errorf("DOUBLE EXECUTION: upstream executed key sent-1 %d times", n)
			}
		})
	}
}

// TestResendNotOnAFreshConnection: a fresh connection whose first write
// fails is not retried by the Transport. Not a byte reached its socket (the
// proxy counts them), so the request never left: the claim is released and
// the client's retry executes, once.
func TestResendNotOnAFreshConnection(t *testing.T) {
	f := &fault{mode: faultNothing}
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Transport = withFault(proxy.NewTransport(), f, false)
	})
	f.armed.Store(true)
	r := e.do(req{key: "fresh-1", body: resendBody})
	if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeUnreachable {
		t.Errorf("status %d %s, want 502 %s: nothing was sent", r.StatusCode, r.body, typeUnreachable)
	}
	if n := f.dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: the Transport retries on reused connections only", n)
	}
	if n := e.upstream.KeyCalls("fresh-1"); n != 0 {
		t.Errorf("upstream executed key fresh-1 %d times, want 0", n)
	}
	if r2 := e.do(req{key: "fresh-1", body: resendBody}); r2.StatusCode != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("client retry: %d replayed=%q %s, want it executed (201)", r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), r2.body)
	}
	if n := e.upstream.KeyCalls("fresh-1"); n != 1 {
		t.Errorf("upstream executed key fresh-1 %d times, want 1", n)
	}
}

// TestResendRefusedWithoutTheWriteCounter: on connections that do not count
// their writes (a Transport of the caller's own, or a layer that hides the
// counting connection), the proxy cannot know that nothing left: it refuses
// the resend, as it always did.
func TestResendRefusedWithoutTheWriteCounter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tr     func() *http.Transport
		opaque bool
	}{
		{"own-transport", func() *http.Transport {
			return &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
		}, false},
		{"opaque-layer", proxy.NewTransport, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fault{mode: faultNothing}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Transport = withFault(tc.tr(), f, tc.opaque)
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up: status %d", r.StatusCode)
			}
			f.armed.Store(true)
			r := e.do(req{key: "own-1", body: resendBody})
			if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeFailed {
				t.Errorf("status %d %s, want 502 %s", r.StatusCode, r.body, typeFailed)
			}
			if n := f.dials.Load(); n != 1 {
				t.Errorf("%d dials, want 1 (no resend)", n)
			}
			if n := e.upstream.KeyCalls("own-1"); n != 0 {
				t.Errorf("upstream executed key own-1 %d times, want 0", n)
			}
		})
	}
}

// TestResendThenFailure: after a resend, the answer is decided by the
// attempt that was resent. Its dial failing: the request never left (the
// first attempt wrote nothing), the claim is released and the client's
// retry executes. Its request written and then the connection lost: it may
// have been executed, the claim is kept.
func TestResendThenFailure(t *testing.T) {
	t.Run("dial-fails", func(t *testing.T) {
		f := &fault{mode: faultNothing}
		e := newEnv(t, miniBackend, func(o *proxy.Options) {
			o.Transport = withFault(proxy.NewTransport(), f, false)
		})
		if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
			t.Fatalf("warm-up: status %d", r.StatusCode)
		}
		f.failDial.Store(true)
		f.armed.Store(true)
		r := e.do(req{key: "redial-1", body: resendBody})
		if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeUnreachable {
			t.Errorf("status %d %s, want 502 %s: nothing was sent", r.StatusCode, r.body, typeUnreachable)
		}
		if f.failDial.Load() {
			t.Fatal("the Transport did not resend (the failing dial was not reached)")
		}
		if r2 := e.do(req{key: "redial-1", body: resendBody}); r2.StatusCode != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") == "true" {
			t.Errorf("client retry: %d replayed=%q %s, want it executed (201)", r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), r2.body)
		}
		if n := e.upstream.KeyCalls("redial-1"); n != 1 {
			t.Errorf("upstream executed key redial-1 %d times, want 1", n)
		}
	})
	t.Run("written-then-lost", func(t *testing.T) {
		upstream, executed := hangUpOnce(t, "lost-1")
		f := &fault{mode: faultNothing}
		e := newEnv(t, miniBackend, func(o *proxy.Options) {
			o.Upstream = upstream
			o.Transport = withFault(proxy.NewTransport(), f, false)
		})
		if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusOK {
			t.Fatalf("warm-up: status %d", r.StatusCode)
		}
		f.armed.Store(true)
		r := e.do(req{key: "lost-1", body: resendBody})
		if r.StatusCode != http.StatusBadGateway || problemType(t, r) != typeFailed {
			t.Errorf("status %d %s, want 502 %s: the resent request was written", r.StatusCode, r.body, typeFailed)
		}
		if n := f.dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2 (one resend)", n)
		}
		if r2 := e.do(req{key: "lost-1", body: resendBody}); r2.StatusCode != http.StatusConflict {
			t.Errorf("client retry: %d %s, want 409", r2.StatusCode, r2.body)
		}
		if n := executed.Load(); n != 1 {
			t.Errorf("upstream executed key lost-1 %d times, want 1", n)
		}
	})
}

// tlsUpstream is an https upstream counting calls per key. With hold, the
// first call with a key waits for hold to close (at most 5 s) before
// answering: a copy of a request that reached it must not answer before
// the proxy has decided on the write error. The Transport, from
// NewTransport, trusts it.
func tlsUpstream(t *testing.T, hold <-chan struct{}) (*url.URL, *http.Transport, func(string) int64) {
	t.Helper()
	var mu sync.Mutex
	calls := map[string]int64{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		first := calls[r.Header.Get("Idempotency-Key")] == 1
		mu.Unlock()
		if hold != nil && first && r.Header.Get("Idempotency-Key") != "" {
			select {
			case <-hold:
			case <-time.After(5 * time.Second):
			}
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	}))
	t.Cleanup(srv.Close)
	tr := proxy.NewTransport()
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	u, _ := url.Parse(srv.URL)
	return u, tr, func(key string) int64 { mu.Lock(); defer mu.Unlock(); return calls[key] }
}

// TestResendOverTLS: with an https upstream the write counter sits under
// crypto/tls. The handshake's bytes, written before the Transport hands
// the connection to a request, do not count as the request's: a request
// whose write to a reused connection sent nothing is resent on a new one
// (which makes its own handshake). One whose TLS write reached the socket
// and was reported as nothing is never resent.
func TestResendOverTLS(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       faultMode
		wantStatus int
		wantDials  int64
	}{
		{"nothing-written", faultNothing, http.StatusCreated, 2},
		{"unreported", faultUnreported, http.StatusBadGateway, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The copy that reaches the upstream whole (unreported) is held
			// until the proxy has answered: its own 201 must not beat the
			// write error. Nothing reaches it otherwise: the resend answers.
			var hold chan struct{}
			if tc.mode == faultUnreported {
				hold = make(chan struct{})
			}
			var once sync.Once
			release := func() {
				if hold != nil {
					once.Do(func() { close(hold) })
				}
			}
			t.Cleanup(release)
			upstream, tr, calls := tlsUpstream(t, hold)
			f := &fault{mode: tc.mode}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Upstream = upstream
				o.Transport = withFault(tr, f, false)
			})
			if r := e.do(req{body: "warm"}); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up: status %d %s", r.StatusCode, r.body)
			}
			f.armed.Store(true)
			r := e.do(req{key: "tls-1", body: resendBody})
			release()
			t.Logf("client got %d %s (dials %d)", r.StatusCode, r.body, f.dials.Load())
			if r.StatusCode != tc.wantStatus {
				t.Errorf("status %d, want %d", r.StatusCode, tc.wantStatus)
			}
			if n := f.dials.Load(); n != tc.wantDials {
				t.Errorf("%d dials, want %d", n, tc.wantDials)
			}
			if n := calls("tls-1"); n > 1 || (tc.mode == faultNothing && n != 1) {
				t.Errorf("upstream executed key tls-1 %d times", n)
			}
		})
	}
}

// TestUpgradeTunnelHalfClose: the upstream connection of a 101 tunnel is
// a write-counting one; a client's half-close still reaches the upstream
// (CloseWrite), which then answers through the tunnel's other half.
func TestUpgradeTunnelHalfClose(t *testing.T) {
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
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
		_ = brw.Flush()
		got, err := io.ReadAll(brw) // up to the client's half-close
		fmt.Fprintf(brw, "got %q err=%v", got, err)
		_ = brw.Flush()
	})
	c := dialProxy(t, e)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	_, _ = io.WriteString(c, "hello")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if want := `got "hello" err=<nil>`; string(rest) != want {
		t.Errorf("through the tunnel after the half-close: %q (%v), want %q", rest, err, want)
	}
}
