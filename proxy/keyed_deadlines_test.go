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

// TestWaiterReplayIsNotCutByItsOwnWait: two requests with the same
// key and body (a double submit). The second one's headers arrive first, its
// body a moment later, after the first has claimed the key; with a wait
// policy it waits and replays the first's answer. Every phase is within
// its limit: the second body arrives within REQUEST_READ_TIMEOUT, the first
// upstream call ends within UPSTREAM_TIMEOUT, the wait within WAIT_TIMEOUT,
// and the client reads as fast as it can.
//
// Defect (af8a375, handler.go ServeHTTP and replay): the replay is written
// under the deadline ServeHTTP set at the request's start (start +
// UPSTREAM_TIMEOUT), so the time the proxy itself spent receiving the body,
// talking to Redis and waiting for the first request is taken from the
// client's time to receive the replay. Here the replay starts after that
// deadline has passed; a record larger than net/http's buffers (4 KiB) is
// written to a socket whose deadline is already over and the client gets
// nothing (the same happens when the first request's recording is slow:
// Lease.Complete may retry for 10s). Before af8a375, replay() set
// now + UPSTREAM_TIMEOUT when it began writing.
//
// Correct: the replay gets UPSTREAM_TIMEOUT from when it starts to be
// written (or per write), not from the request's start.
func TestWaiterReplayIsNotCutByItsOwnWait(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 2 * time.Second
		o.RequestReadTimeout = 5 * time.Second
		o.Default.Wait = 5 * time.Second
		o.Default.LockTTL = 8 * time.Second
	})
	big := strings.Repeat("r", 256<<10) // recorded (MAX_STORED 1 MiB), larger than any socket buffer
	g := newGate()
	defer g.open()
	e.setUpstream(g.handler(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, big)
	}))

	// t0: the second request's headers; its one-byte body comes later.
	t0 := time.Now()
	c := dialProxy(t, e)
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: double\r\nContent-Length: 1\r\n\r\n")

	// t0+1.5s: the first request, complete; it claims the key and is held
	// at the upstream.
	time.Sleep(1500 * time.Millisecond)
	first := make(chan response, 1)
	go func() {
		r, err := e.send(t.Context(), e.srv, req{key: "double", body: "x"})
		if err != nil {
			t.Errorf("first request: %v", err)
		}
		first <- r
	}()
	g.wait(t)
	claimedAt := time.Now()

	// The second request's body: it finds the key in flight and waits.
	if _, err := io.WriteString(c, "x"); err != nil {
		t.Fatal(err)
	}
	// The first upstream call answers 1s after it began (UPSTREAM_TIMEOUT
	// is 2s), at about t0+2.5s: the second request's replay starts about
	// half a second after its start + UPSTREAM_TIMEOUT.
	time.Sleep(time.Until(claimedAt.Add(time.Second)))
	g.open()
	<-first // its own answer is not what this test is about

	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("REPLAY LOST %v after the second request's start: %v", time.Since(t0).Round(time.Millisecond), err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusCreated || len(b) != len(big) {
		t.Fatalf("REPLAY CUT: status %d, %d of %d bytes, err %v (replayed %q)", resp.StatusCode, len(b), len(big), err, resp.Header.Get("Idempotent-Replayed"))
	}
	if resp.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
		t.Errorf("replayed %q, upstream calls %d; want a replay and one call", resp.Header.Get("Idempotent-Replayed"), e.calls.Load())
	}
}

// TestFastClientOfStreamingKeyedAnswer: a keyed request whose
// upstream sends its headers at once and the rest of its (small, recordable)
// body 1.3s later, within UPSTREAM_TIMEOUT (2s). The client reads
// everything as soon as it arrives.
//
// Defect (keyed.go execute, onHeaders): the "slow client" cut is one
// absolute write deadline, set when the headers arrive, at half the time
// left (here about 1s after the start). It does not measure the client: a
// client that has taken every byte so far is cut as soon as the upstream is
// slower than that, and gets a truncated body (the answer is recorded, so
// the retry replays it, but the first answer is broken). The README's
// rationale ("a client that cannot take the answer in time") does not
// describe this client.
//
// Correct: re-arm the deadline on each write to the client (each write gets
// half the time then left before the upstream deadline): a stalled client
// is still cut in time for the answer to be read to its end and recorded,
// and a client that keeps up is never cut while the upstream is within
// UPSTREAM_TIMEOUT.
func TestFastClientOfStreamingKeyedAnswer(t *testing.T) {
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = 2 * time.Second
		o.Default.LockTTL = 8 * time.Second
	})
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"part":1,`)
		w.(http.Flusher).Flush()
		time.Sleep(1300 * time.Millisecond) // 65% of UPSTREAM_TIMEOUT, well within it
		_, _ = io.WriteString(w, `"part2":true}`)
	})
	r, err := e.send(t.Context(), e.srv, req{key: "stream", body: "x"})
	switch {
	case err != nil:
		t.Errorf("FAST CLIENT CUT: the upstream finished within UPSTREAM_TIMEOUT, the client read everything at once, and got: %v", err)
	case r.StatusCode != http.StatusCreated || string(r.body) != `{"part":1,"part2":true}`:
		t.Errorf("status %d body %q", r.StatusCode, r.body)
	}
}
