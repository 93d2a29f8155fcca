package proxy_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestProblemAnswersHaveAWriteDeadline: a client pipelines requests
// that the proxy answers itself (here 400 key-invalid; equally 409, 422,
// 408, 503) and never reads. Only replays and pass-through writes carry a
// write deadline; writeProblem's answers do not, and main.go's http.Server
// has no WriteTimeout (it must not: streams). Once the socket buffers are
// full, the connection goroutine blocks in its final flush for ever: an
// attacker holds one goroutine and one socket per connection indefinitely
// (IdleTimeout does not apply to an active connection; SIGTERM then waits
// the whole SHUTDOWN_TIMEOUT).
//
// The server here is configured as main.go configures the real one.
//
// Correct: every answer the proxy writes itself goes out under a write
// deadline (UPSTREAM_TIMEOUT, as replays), so the connection is closed
// when the client stops reading.
func TestProblemAnswersHaveAWriteDeadline(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.UpstreamTimeout = 300 * time.Millisecond })

	var mu sync.Mutex
	states := map[net.Conn]http.ConnState{}
	logger := zerolog.Nop() // thousands of access lines otherwise
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", nil), func() proxy.Options { o := e.opts; o.Logger = logger; return o }())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, // as main.go
		ConnState: func(c net.Conn, s http.ConnState) {
			mu.Lock()
			states[c] = s
			mu.Unlock()
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close() // closes every connection, unblocking the stuck flush

	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Pipelined keyed requests with a key over MAX_KEY_LENGTH: answered 400
	// by the proxy without Redis or upstream. Never read.
	one := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 0\r\n\r\n", strings.Repeat("k", 300))
	batch := []byte(strings.Repeat(one, 64))
	stalled := false
	end := time.Now().Add(10 * time.Second)
	for i := 0; i < 20000 && time.Now().Before(end); i++ {
		_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write(batch); err != nil {
			if isNetTimeout(err) {
				stalled = true
				break
			}
			t.Fatalf("write: %v", err)
		}
	}
	if !stalled {
		t.Skip("the proxy kept reading; socket buffers too large to stall it here")
	}

	// The proxy is now blocked writing an answer nobody reads. With a write
	// deadline of UPSTREAM_TIMEOUT (300ms) it would close the connection.
	closed := false
	var last http.ConnState
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); { // generous: a loaded machine
		mu.Lock()
		for _, s := range states {
			last = s
		}
		mu.Unlock()
		if last == http.StateClosed {
			closed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !closed {
		t.Errorf("a client that never reads the proxy's own 400 answers holds its connection (state %v) 10s later; "+
			"UPSTREAM_TIMEOUT is 300ms and no write deadline ended it", last)
	}
}
