package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

func observe(o *proxy.Options) { o.Default.Observe = true }

// wantForwarded checks that an answer is the upstream's own, untouched:
// its status, and none of the headers the proxy adds when it enforces.
func wantForwarded(t *testing.T, r response, status int) {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("status %d (%s), want the upstream's %d", r.StatusCode, r.body, status)
	}
	for _, h := range []string{"Idempotent-Replayed", "Idempotency-Key", "Retry-After"} {
		if v := r.Header.Get(h); v != "" {
			t.Errorf("%s: %q on an observed answer, want none", h, v)
		}
	}
}

func outcomes(t *testing.T, e *env, names ...string) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for _, n := range names {
		got[n] = counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": n})
	}
	return got
}

// TestObserveChangesNoAnswer: every request is forwarded and answered by
// the upstream; the first is claimed and recorded exactly as in enforce, and
// each duplicate is counted as what enforcing would have done.
func TestObserveChangesNoAnswer(t *testing.T) {
	t.Parallel()
	forBoth(t, func(o *proxy.Options) {
		observe(o)
		o.MaxBodyBytes = 64
	}, func(t *testing.T, e *env) {
		first := e.do(req{key: "o1", body: "b"})
		wantForwarded(t, first, http.StatusCreated)
		dup := e.do(req{key: "o1", body: "b"})
		wantForwarded(t, dup, http.StatusCreated)
		if string(dup.body) == string(first.body) {
			t.Errorf("duplicate answered %s, the first's body: want the upstream's fresh answer", dup.body)
		}
		wantForwarded(t, e.do(req{key: "o1", body: "other"}), http.StatusCreated)
		wantForwarded(t, e.do(req{key: strings.Repeat("k", 300), body: "b"}), http.StatusCreated)

		// A chunked body over MAX_BODY_BYTES is forwarded whole, unclaimed.
		var seen atomic.Int64
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			seen.Store(int64(len(b)))
			e.created(w, r)
		})
		big := strings.Repeat("x", 100<<10)
		hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", io.MultiReader(strings.NewReader(big))) // no length: chunked
		hr.Header.Set("Idempotency-Key", "big")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || seen.Load() != int64(len(big)) {
			t.Errorf("large body: %d, upstream saw %d bytes, want 201 and %d", resp.StatusCode, seen.Load(), len(big))
		}
		if got := e.calls.Load(); got != 5 {
			t.Errorf("upstream calls %d, want 5 (every request)", got)
		}
		want := map[string]float64{"executed": 1, "would_replay": 1, "would_mismatch": 1, "would_reject": 2}
		if got := outcomes(t, e, "executed", "would_replay", "would_mismatch", "would_reject"); !equalMaps(got, want) {
			t.Errorf("outcomes %v, want %v", got, want)
		}

		// The first record was never overwritten: enforcing now replays it.
		enforce := e.opts
		enforce.Default.Observe = false
		_, srv, _ := e.newProxy(enforce)
		r := e.doTo(srv, req{key: "o1", body: "b"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
			t.Errorf("enforce after observe: %d %s, want the first answer %s replayed", r.StatusCode, r.body, first.body)
		}
	})
}

func equalMaps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestObserveInFlightAndRequired: a duplicate of a request still in flight
// is forwarded at once (would_conflict), even with a wait policy; a route
// that requires a key forwards a request without one (would_reject).
func TestObserveInFlightAndRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		observe(o)
		o.Default.Wait = 5 * time.Second
		o.Default.Required = true
	})
	g := newGate()
	defer g.open()
	e.setUpstream(g.first(e.created, e.created))
	done := make(chan response, 1)
	go func() {
		r, _ := e.send(context.Background(), e.srv, req{key: "slow", body: "b"})
		done <- r
	}()
	g.wait(t)
	start := time.Now()
	wantForwarded(t, e.do(req{key: "slow", body: "b"}), http.StatusCreated)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("duplicate took %v: observe must not wait", d)
	}
	wantForwarded(t, e.do(req{body: "no key"}), http.StatusCreated)
	g.open()
	wantForwarded(t, <-done, http.StatusCreated)
	want := map[string]float64{"executed": 1, "would_conflict": 1, "would_reject": 1}
	if got := outcomes(t, e, "executed", "would_conflict", "would_reject"); !equalMaps(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
}

// TestObserveAcrossReplicas: two replicas on one Redis count one first
// request and one would-be replay, whichever replica sees which.
func TestObserveAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, observe)
	_, srvB, regB := e.newProxy(e.opts)
	wantForwarded(t, e.do(req{key: "r1", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.doTo(srvB, req{key: "r1", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.doTo(srvB, req{key: "r1", body: "c"}), http.StatusCreated)
	if got := e.calls.Load(); got != 3 {
		t.Errorf("upstream calls %d, want 3", got)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "executed"}); got != 1 {
		t.Errorf("replica A executed %v, want 1", got)
	}
	if got := counter(t, regB, "idemproxy_requests_total", map[string]string{"outcome": "would_replay"}); got != 1 {
		t.Errorf("replica B would_replay %v, want 1", got)
	}
	if got := counter(t, regB, "idemproxy_requests_total", map[string]string{"outcome": "would_mismatch"}); got != 1 {
		t.Errorf("replica B would_mismatch %v, want 1", got)
	}
}

// TestObserveRedisDown: Redis unreachable in observe is forwarded, never
// 503, and counted store_error.
func TestObserveRedisDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, observe)
	e.redis.Kill()
	wantForwarded(t, e.do(req{key: "down", body: "b"}), http.StatusCreated)
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "store_error"}); got != 1 {
		t.Errorf("store_error %v, want 1", got)
	}
}

// TestObserveRoute: the route option observe applies to its route only; a
// held unknown key counts as would_replay there.
func TestObserveRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /v1/shadow/* observe unknown=hold")
	})
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "s", body: "b"}), http.StatusCreated)
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "s", body: "b"}), http.StatusCreated)
	if r := e.do(req{path: "/v1/orders", key: "t", body: "b"}); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotency-Key") != "t" {
		t.Fatalf("enforced route: %d, key echo %q", r.StatusCode, r.Header.Get("Idempotency-Key"))
	}
	if r := e.do(req{path: "/v1/orders", key: "t", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("enforced route's duplicate not replayed")
	}
	// An unknown outcome on the observed route.
	k := claim.NewKey([]string{""}, "u")
	lease, _, err := claim.NewStore(e.rdb, "idem:", nil).Acquire(context.Background(), k,
		fingerprintOf(http.MethodPost, "/v1/shadow/1", "", "b"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Hold(context.Background(), http.StatusGatewayTimeout, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantForwarded(t, e.do(req{path: "/v1/shadow/1", key: "u", body: "b"}), http.StatusCreated)
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "would_replay", "route": "/v1/shadow/*"}); got != 2 {
		t.Errorf("would_replay on the observed route %v, want 2", got)
	}
}

// TestDocsURL: with DOCS_URL every problem the proxy writes links to it;
// the upstream's answers and replays do not.
func TestDocsURL(t *testing.T) {
	t.Parallel()
	const link = `<https://docs.example.com/idempotency>; rel="describedby"`
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.DocsURL = "https://docs.example.com/idempotency"
		o.Routes = mustRoutes(t, "POST /v1/required/* required")
	})
	first := e.do(req{key: "d", body: "b"})
	if first.StatusCode != http.StatusCreated || first.Header.Get("Link") != "" {
		t.Errorf("upstream answer: %d Link %q, want none", first.StatusCode, first.Header.Get("Link"))
	}
	if r := e.do(req{key: "d", body: "b"}); r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Link") != "" {
		t.Errorf("replay: Link %q, want none", r.Header.Get("Link"))
	}
	for name, r := range map[string]response{
		"422": e.do(req{key: "d", body: "other"}),
		"400": e.do(req{path: "/v1/required/1", body: "b"}),
	} {
		r.problem(t)
		if got := r.Header.Get("Link"); got != link {
			t.Errorf("%s: Link %q, want %q", name, got, link)
		}
	}
	e.redis.Kill()
	r := e.do(req{key: "e", body: "b"})
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Link") != link {
		t.Errorf("503: %d Link %q, want %q", r.StatusCode, r.Header.Get("Link"), link)
	}
	e.upstream.Close()
	r = e.do(req{method: http.MethodGet, path: "/v1/orders"})
	if r.StatusCode != http.StatusBadGateway || r.Header.Get("Link") != link {
		t.Errorf("pass-through 502: %d Link %q, want %q", r.StatusCode, r.Header.Get("Link"), link)
	}
}

// slowPost writes a keyed POST to the proxy by hand, its body in pieces
// with a pause between them, and reads the answer. chunked sends the body
// with Transfer-Encoding: chunked instead of a Content-Length. Every step is
// bounded by a deadline.
func slowPost(t *testing.T, e *env, key string, pieces []string, pause time.Duration, chunked bool) (int, string) {
	t.Helper()
	conn := dialProxy(t, e)
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

// TestObserveSlowBodyForwardedWhole: in observe mode a keyed body
// that keeps flowing but takes longer in all than REQUEST_READ_TIMEOUT is,
// per the README ("a body ... too slow; such a request is forwarded
// unclaimed, its body whole") and the contract ("changes no answer"),
// forwarded and answered by the upstream. The same body without a key (a
// plain pass-through, REQUEST_READ_TIMEOUT between reads) reaches the
// upstream. But readBody's read deadline fires on the connection, net/http
// cancels the request's context on that read error, and the forward that
// follows fails: the client gets the proxy's own error, not the upstream's
// answer, and the upstream never sees the request.
func TestObserveSlowBodyForwardedWhole(t *testing.T) {
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

// TestObserveUpstreamFailureDetailTellsTheTruth: on an observed
// route the first request's upstream times out. The proxy writes its own
// 504 (as a pass-through would), but its detail is enforce's promise:
// with unknown=hold "it is not executed again: retries with this key get
// this status (outcome-unknown) until an operator purges the key" (with
// expire: "retries with this key get 409 until the claim expires"). In
// observe mode the retry is forwarded and executed at once, as the test
// shows: a client author reading the detail is told the opposite of what
// happens. Observe should not describe enforcement it does not do (the
// pass-through's plain detail, or one that says the route only observes).
func TestObserveUpstreamFailureDetailTellsTheTruth(t *testing.T) {
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

// lateTransport answers its first `plain` calls at once (201, body
// read whole), and every later call as lateCheckTransport does: the answer
// is handed back after Content-Length bytes, and the Transport's extra read
// (transfer.go writeBody, nextra) happens only once the client has the
// answer's headers; an error there cuts the answer, as the Transport does.
type lateTransport struct {
	plain            int64
	calls            *atomic.Int64
	clientHasHeaders chan struct{}
	checkErr         chan error
}

func (l lateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if l.calls.Add(1) <= l.plain {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		return &http.Response{
			StatusCode: http.StatusCreated, ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/json"}},
			Body:          io.NopCloser(strings.NewReader(fmt.Sprintf(`{"len":%d}`, len(b)))),
			ContentLength: -1,
			Request:       r,
		}, nil
	}
	return lateCheckTransport{clientHasHeaders: l.clientHasHeaders, checkErr: l.checkErr}.RoundTrip(r)
}

// TestObserveDuplicateLateRead: in observe mode a duplicate (same
// key, same body) is forwarded with the body readBody consumed in memory
// put back in front of the server's body (unreadBody: MultiReader(prefix,
// r.Body)). The server's body was read to its end by readBody, so when the
// proxy flushes the answer's headers net/http discards nothing and closes
// it. The Transport's check read after Content-Length bytes goes through
// idleBody (ended is false: the in-memory prefix never returned io.EOF to
// idleBody) into the MultiReader, which moves past the prefix to the closed
// server body: "http: invalid Read on closed Body", and the Transport drops
// the connection the streamed answer comes on. The fix of 06d58fc covers a
// body read through idleBody to its end, not this one.
func TestObserveDuplicateLateRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		body string
	}{
		{"would_replay", `{"event":"ping"}`},
		{"would_mismatch", `{"event":"pong"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt := lateTransport{plain: 1, calls: new(atomic.Int64), clientHasHeaders: make(chan struct{}), checkErr: make(chan error, 1)}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				observe(o)
				o.Transport = lt
			})
			first := e.do(req{key: "dup-1", body: `{"event":"ping"}`})
			if first.StatusCode != http.StatusCreated {
				t.Fatalf("first: status %d %s", first.StatusCode, first.body)
			}

			c := dialProxy(t, e)
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: dup-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(tc.body), tc.body)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			close(lt.clientHasHeaders)
			got, err := io.ReadAll(resp.Body)
			var cerr error
			select {
			case cerr = <-lt.checkErr:
			case <-time.After(5 * time.Second):
				t.Fatal("the check read never happened")
			}
			if cerr != nil {
				t.Errorf("the Transport's read after the body's end got %v, want io.EOF", cerr)
			}
			if err != nil || !strings.Contains(string(got), "data: done") {
				t.Fatalf("ANSWER CUT: status %d, body %q, err %v; want the upstream's whole stream", resp.StatusCode, got, err)
			}
		})
	}
}

// holdCheck wraps a request body as a loaded machine orders it:
// once the Transport has had Content-Length bytes, its next read (the check
// read of transfer.go writeBody) waits until the client has the answer's
// headers, then goes to the real body.
type holdCheck struct {
	io.ReadCloser
	left      int64
	hold      <-chan struct{}
	checkErr  chan<- error
	checkDone chan struct{}
}

func (b *holdCheck) Read(p []byte) (int, error) {
	if b.left > 0 {
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := b.ReadCloser.Read(p)
		b.left -= int64(n)
		return n, err
	}
	select {
	case <-b.hold:
	case <-time.After(5 * time.Second):
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.checkErr <- nil
	} else {
		b.checkErr <- fmt.Errorf("check read: n=%d err=%v", n, err)
	}
	close(b.checkDone)
	return n, err
}

type holdTransport struct {
	rt        http.RoundTripper
	late      func(r *http.Request) bool
	hold      chan struct{}
	checkErr  chan error
	checkDone chan struct{}
}

func (h holdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.late(r) && r.Body != nil && r.ContentLength > 0 {
		r = r.Clone(r.Context())
		r.Body = &holdCheck{ReadCloser: r.Body, left: r.ContentLength, hold: h.hold, checkErr: h.checkErr, checkDone: h.checkDone}
	}
	return h.rt.RoundTrip(r)
}

// TestLateCheckReadWithRealTransport: the same order with net/http's own
// Transport and a real upstream that streams its answer. pass-through is the
// case 06d58fc fixed (it passes); observe-duplicate is the in-memory prefix
// of unreadBody (it fails: the Transport drops the upstream connection and
// the client's stream is cut).
func TestLateCheckReadWithRealTransport(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		observe bool
		key     string
	}{
		{"pass-through", false, ""},
		{"observe-duplicate", true, "dup-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			ht := holdTransport{
				rt:        proxy.NewTransport(),
				late:      func(*http.Request) bool { return calls.Add(1) == 2 || !tc.observe },
				hold:      make(chan struct{}),
				checkErr:  make(chan error, 1),
				checkDone: make(chan struct{}),
			}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Observe = tc.observe
				o.Transport = ht
			})
			var n atomic.Int64
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if n.Add(1) == 1 && tc.observe {
					w.WriteHeader(http.StatusCreated)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				select {
				case <-ht.checkDone:
				case <-time.After(5 * time.Second):
				}
				time.Sleep(100 * time.Millisecond)
				_, _ = io.WriteString(w, "data: done\n\n")
			})
			body := `{"event":"ping"}`
			if tc.observe {
				if r := e.do(req{key: tc.key, body: body}); r.StatusCode != http.StatusCreated {
					t.Fatalf("first: %d %s", r.StatusCode, r.body)
				}
			}
			c := dialProxy(t, e)
			defer c.Close()
			head := "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			if tc.key != "" {
				head += "Idempotency-Key: " + tc.key + "\r\n"
			}
			fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			close(ht.hold)
			got, err := io.ReadAll(resp.Body)
			select {
			case cerr := <-ht.checkErr:
				if cerr != nil {
					t.Errorf("%v, want io.EOF", cerr)
				}
			case <-time.After(5 * time.Second):
				t.Error("no check read")
			}
			if err != nil || !strings.Contains(string(got), "data: done") {
				t.Fatalf("ANSWER CUT: status %d, body %q, err %v; want the upstream's whole stream", resp.StatusCode, got, err)
			}
		})
	}
}
