package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
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
	t.Parallel()
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
	t.Parallel()
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

// smallSendBuffers gives every accepted connection a small kernel send
// buffer, as a proxy under memory pressure (or with tuned tcp_wmem) has: a
// client that does not read then blocks the proxy's writes after a few KiB.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// dialSmallRcvbuf dials addr with a small receive buffer: a client that
// does not read stops taking bytes after a few KiB.
func dialSmallRcvbuf(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestKeyedEarlyHintsToStalledClientStillRecorded: a keyed request
// whose upstream answers at once, with a 103 Early Hints (a large Link
// header, as a page with many preloads sends) and then 201. The client
// stalls and does not read. The README ("A client that cannot take the
// answer in time"): each write of a keyed answer must finish within half of
// the UPSTREAM_TIMEOUT still left; past that the client is cut off, and the
// proxy still reads the upstream's answer to the end and records it, so
// the client's retry replays it.
//
// Defect (keyed.go exchange.WriteHeader, ex.arm = res.arm): a 1xx is
// written under the ordinary deadline, now + UPSTREAM_TIMEOUT (+ slack),
// not the slow-client one, and it is written from the Transport's readLoop
// goroutine (ReverseProxy's Got1xxResponse). While that write blocks, the
// Transport cannot read the final answer; ResponseHeaderTimeout (=
// UPSTREAM_TIMEOUT) fires first, the request ends in 504 "may have been
// executed", nothing is recorded, and the retry gets 409 (then, once the
// lock expires, executes again). Meanwhile the handler goroutine writes its
// 504 to the same ResponseWriter and result (writeBy) while readLoop is
// still inside its write: run with -race, the detector reports it.
func TestKeyedEarlyHintsToStalledClientStillRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.UpstreamTimeout = time.Second
		o.Default.LockTTL = 4 * time.Second
	})
	var done atomic.Int32
	e.setUpstream(largeHintsThenCreated(&done))

	srv := smallBufferServer(t, e.h)

	c := dialSmallRcvbuf(t, srv.Listener.Addr().String())
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hints-stall\r\nContent-Length: 1\r\n\r\nb")
	// The client never reads. The upstream answers within milliseconds.
	for end := time.Now().Add(3 * time.Second); done.Load() == 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if done.Load() == 0 {
		t.Fatal("upstream never called")
	}

	// The retry (a fresh, fast client) must replay 201 once the first
	// request has had UPSTREAM_TIMEOUT (1 s) plus the record to finish.
	// Bounded: 6 tries over ~3 s.
	var last response
	for i := 0; i < 6; i++ {
		time.Sleep(500 * time.Millisecond)
		last = e.doTo(e.srv, req{key: "hints-stall", body: "b"})
		if last.StatusCode != http.StatusConflict {
			break
		}
	}
	c.Close()
	if last.StatusCode != http.StatusCreated || last.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after the upstream answered 201 at once: status %d, replayed %q (body %s); want the recorded 201 replayed",
			last.StatusCode, last.Header.Get("Idempotent-Replayed"), last.body)
	}
	if n := e.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

// largeHintsThenCreated is an upstream that answers at once: a 103 Early
// Hints with a ~200 KiB Link header, then 201 "done"; done counts its answers.
func largeHintsThenCreated(done *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", strings.Repeat("</a.css>; rel=preload, ", 200<<10/24)) // ~200 KiB
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
		done.Add(1)
	}
}

// smallBufferServer serves h on 127.0.0.1 with small kernel send buffers
// (smallSendBuffers), closed when the test ends.
func smallBufferServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestFastClientOfSlowUpstreamGetsTheWholeAnswer: the slow-client write deadline is
// absolute from the START of the upstream call (start+UPSTREAM_TIMEOUT/2),
// not from when the answer begins. An upstream that legitimately answers
// after 60% of UPSTREAM_TIMEOUT has its answer cut for a client that reads at
// full speed.
func TestFastClientOfSlowUpstreamGetsTheWholeAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		chunked bool
		size    int
	}{{"content-length-64KiB", false, 64 << 10}, {"chunked-small", true, 200}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.UpstreamTimeout = 2 * time.Second
				o.Default.LockTTL = 8 * time.Second
			})
			body := strings.Repeat("y", tc.size)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				time.Sleep(1200 * time.Millisecond) // 60% of UPSTREAM_TIMEOUT: well within it
				if !tc.chunked {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				w.WriteHeader(http.StatusCreated)
				if tc.chunked {
					w.(http.Flusher).Flush() // no Content-Length: chunked, as a streaming upstream sends it
				}
				_, _ = io.WriteString(w, body)
			})
			r, err := e.send(t.Context(), e.srv, req{key: "slow-" + tc.name, body: "x"})
			switch {
			case err != nil:
				t.Errorf("FAST CLIENT CUT: upstream answered within UPSTREAM_TIMEOUT, client got error: %v", err)
			case r.StatusCode != http.StatusCreated || len(r.body) != len(body):
				t.Errorf("FAST CLIENT CUT: status %d, %d of %d body bytes", r.StatusCode, len(r.body), len(body))
			}
			retry := e.do(req{key: "slow-" + tc.name, body: "x"})
			if retry.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
				t.Errorf("retry: %d replayed=%q; upstream calls %d, want a replay and 1 call", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), e.calls.Load())
			}
		})
	}
}

// A replay carries the recorded headers as the first answer carried them.
// On a route whose key is derived from the message the proxy echoes no key,
// so an upstream's own Idempotency-Key header goes out on the first answer
// and must go out on the replay too (it used to be dropped there).
func TestReplayKeepsUpstreamKeyHeaderOnDerivedRoute(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e = webhookEnv(t, e.backend)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Idempotency-Key", "upstream-own")
			w.WriteHeader(http.StatusCreated)
		})
		h := http.Header{"X-Github-Delivery": {"d-replay-echo"}, "X-Github-Event": {"push"}}
		first := e.do(req{path: "/hooks/github", header: h, body: "{}"})
		dup := e.do(req{path: "/hooks/github", header: h, body: "{}"})
		if first.StatusCode != http.StatusCreated || dup.StatusCode != http.StatusCreated || dup.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("first %d, duplicate %d replayed %q: want 201 and its replay", first.StatusCode, dup.StatusCode, dup.Header.Get("Idempotent-Replayed"))
		}
		want := []string{"upstream-own"}
		if got := first.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
			t.Errorf("first answer's Idempotency-Key %q, want %q", got, want)
		}
		if got := dup.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
			t.Errorf("replay's Idempotency-Key %q, want the recorded %q", got, want)
		}
	})
}

// On a header-keyed route the proxy's echo of the client's key wins over an
// upstream's own, on the first answer and on the replay alike.
func TestReplayEchoWinsOnHeaderRoute(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Idempotency-Key", "upstream-own")
			w.WriteHeader(http.StatusCreated)
		})
		first := e.do(req{key: "client-key", body: "{}"})
		dup := e.do(req{key: "client-key", body: "{}"})
		want := []string{"client-key"}
		for name, r := range map[string]response{"first": first, "replay": dup} {
			if got := r.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
				t.Errorf("%s answer's Idempotency-Key %q, want %q", name, got, want)
			}
		}
	})
}

// TestRecorded499ReplayIsAnswered: answer.write now abandons the
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
func TestRecorded499ReplayIsAnswered(t *testing.T) {
	t.Parallel()
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

// TestAnswerBrokenMidBodyIsLoggedWithItsRequest: an upstream answer whose
// body breaks off is logged as a warning of its request (request_id, the
// read error), keyed or not, and not as ReverseProxy's own line without a
// level or an id, which no one can tie to a request.
func TestAnswerBrokenMidBodyIsLoggedWithItsRequest(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "broken-1"} {
		name := "pass-through"
		if key != "" {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "partial")
				_ = http.NewResponseController(w).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
			})
			// The client sees the answer cut short, or no answer at all
			// (the cut can come before the headers are flushed).
			_, _ = e.send(context.Background(), e.srv, req{key: key, body: "b"})
			access := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
			var a struct {
				ID string `json:"request_id"`
			}
			if err := json.Unmarshal([]byte(access), &a); err != nil || a.ID == "" {
				t.Fatalf("access line %s: %v", access, err)
			}
			var found bool
			for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Errorf("a log line that is not JSON: %q", l)
					continue
				}
				if m["level"] == nil {
					t.Errorf("a log line without a level: %s", l)
				}
				msg, _ := m["message"].(string)
				if strings.Contains(msg, "broke off") {
					found = true
					if m["level"] != "warn" || m["request_id"] != a.ID || m["error"] == nil {
						t.Errorf("the broken answer's line %s: want level warn, request_id %s and the read error", l, a.ID)
					}
				}
			}
			if !found {
				t.Errorf("no line says the answer broke off:\n%s", e.logs)
			}
		})
	}
}

// isEventStream decides whether a keyed answer streams (recorded without
// its body); its allocation-free pre-check must agree with the media type.
func TestIsEventStream(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"text/event-stream":                  true,
		"Text/Event-Stream":                  true,
		"text/event-stream; charset=utf-8":   true,
		"  text/event-stream":                true,
		"\ttext/event-stream ;charset=utf-8": true,
		"text/event-streamx":                 false,
		"text/event-strea":                   false,
		"application/json":                   false,
		"":                                   false,
		"text/event-stream;;":                false, // malformed: not parsed as one
	} {
		if got := proxy.IsEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

// TestIsEventStreamAgreesWithParseMediaType: dccc30a's pre-check
// ("ParseMediaType trims only spaces before the type") trims only spaces
// and tabs, but mime.ParseMediaType trims with strings.TrimSpace: U+00A0
// and U+0085 too (and \v, \f, which net/http's client already refuses in
// a response header; NBSP and NEL, as UTF-8 obs-text, reach the proxy).
// For an upstream Content-Type beginning with one of those, isEventStream
// no longer agrees with the media type that httputil.ReverseProxy itself
// uses to stream the answer (flushInterval -1): the answer is streamed as
// an event stream yet buffered and recorded, where before dccc30a it was
// recorded without its body. The test of dccc30a states the contract:
// "its allocation-free pre-check must agree with the media type".
func TestIsEventStreamAgreesWithParseMediaType(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{
		"text/event-stream",
		" \ttext/event-stream; charset=utf-8",
		"\u00a0text/event-stream",
		"\u0085text/event-stream",
	} {
		mt, _, err := mime.ParseMediaType(ct)
		want := err == nil && mt == "text/event-stream" // ReverseProxy's test, and isEventStream's before dccc30a
		if got := proxy.IsEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v; mime.ParseMediaType says %q (%v): want %v", ct, got, mt, err, want)
		}
	}
}
