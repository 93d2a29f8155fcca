package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// budgetOptions: MAX_BUFFERED_BYTES of four body chunks, and an upstream
// call that may be held at a gate for seconds.
func budgetOptions(o *proxy.Options) {
	o.MaxBufferedBytes = 4 * proxy.BodyChunk
	o.UpstreamTimeout = 10 * time.Second
	o.Default.LockTTL = 20 * time.Second
}

// holdOne sends a keyed request with a body of n bytes to /held, which the
// gate keeps at the upstream, and returns once it is there (its body is
// then buffered, and counted). The returned channel gets its answer once
// the gate opens.
func holdOne(t *testing.T, e *env, g *gate, key string, n int) <-chan response {
	t.Helper()
	done := make(chan response, 1)
	go func() {
		r, err := e.send(context.Background(), e.srv, req{path: "/held", key: key, body: strings.Repeat("h", n)})
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		done <- r
	}()
	g.wait(t)
	return done
}

// gatedHeld holds requests to /held at g and answers every other with
// e.created at once.
func gatedHeld(e *env, g *gate) http.HandlerFunc {
	held := g.handler(e.created)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			held(w, r)
			return
		}
		e.created(w, r)
	}
}

func bufferedBytes(t *testing.T, e *env) float64 {
	t.Helper()
	return counter(t, e.reg, "idemproxy_buffered_bytes", nil)
}

// TestBufferBudgetRefusesBodiesBeyondIt: with MAX_BUFFERED_BYTES taken by
// a request in flight, a keyed request whose body finds no room gets 503
// with Retry-After before anything is claimed or forwarded, while a small
// one still fits; once the first has ended its bytes are free again and
// the refused request, retried with its key, executes.
func TestBufferBudgetRefusesBodiesBeyondIt(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))

		// 40 KiB arrives in three chunks: 48 KiB of the 64 taken.
		first := holdOne(t, e, g, "held", 40<<10)
		if got := bufferedBytes(t, e); got != 3*proxy.BodyChunk {
			t.Errorf("idemproxy_buffered_bytes with the first held: %v, want %d", got, 3*proxy.BodyChunk)
		}

		// 20 KiB needs two more chunks; there is room for one.
		big := strings.Repeat("b", 20<<10)
		r := e.do(req{key: "big", body: big})
		if r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("body beyond the budget: status %d %s, want 503", r.StatusCode, r.body)
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:overloaded" || !strings.Contains(fmt.Sprint(p["detail"]), "MAX_BUFFERED_BYTES=65536") {
			t.Errorf("problem %v, want type overloaded naming MAX_BUFFERED_BYTES=65536", p)
		}
		if ra := r.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1 (the held request only)", got)
		}
		if keys := e.redisKeys(); len(keys) != 1 {
			t.Errorf("Redis keys %v, want the held request's only (nothing claimed for the refused one)", keys)
		}

		// A small body still fits beside the held one.
		if r := e.do(req{key: "small", body: "tiny"}); r.StatusCode != http.StatusCreated {
			t.Errorf("small body: status %d %s, want 201", r.StatusCode, r.body)
		}

		// A second held request of one declared chunk fills the budget;
		// then even a tiny body finds no room.
		second := holdOne(t, e, g, "held-2", proxy.BodyChunk)
		if got := bufferedBytes(t, e); got != 4*proxy.BodyChunk {
			t.Errorf("idemproxy_buffered_bytes with two held: %v, want %d", got, 4*proxy.BodyChunk)
		}
		if r := e.do(req{key: "tiny", body: "tiny"}); r.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("tiny body with the budget full: status %d %s, want 503", r.StatusCode, r.body)
		}

		g.open()
		for _, held := range []<-chan response{first, second} {
			if r := <-held; r.StatusCode != http.StatusCreated {
				t.Fatalf("held request: status %d %s", r.StatusCode, r.body)
			}
		}
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", map[string]string{"stage": "request_body"}); got != 2 {
			t.Errorf("buffer_full_total{stage=request_body} %v, want 2", got)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "overloaded"}); got != 2 {
			t.Errorf("requests_total{outcome=overloaded} %v, want 2", got)
		}

		r = e.do(req{key: "big", body: big})
		if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), fmt.Sprintf(`"body_len":%d`, len(big))) {
			t.Errorf("refused request retried with its key: status %d %s, want it executed (201, its whole body)", r.StatusCode, r.body)
		}
	})
}

// TestBufferBudgetChunkedBody: a body without Content-Length is counted
// chunk by chunk as it arrives and refused at the chunk that finds no room.
func TestBufferBudgetChunkedBody(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		first := holdOne(t, e, g, "held", 40<<10)

		hr, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/orders", io.MultiReader(strings.NewReader(strings.Repeat("c", 20<<10))))
		hr.Header.Set("Idempotency-Key", "chunked")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("chunked body beyond the budget: status %d, Retry-After %q; want 503, 1", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
	})
}

// TestBufferBudgetObserveForwards: in observe mode a body that finds no
// room is forwarded whole, unbuffered, as a proxy without idempotency
// would, and counted.
func TestBufferBudgetObserveForwards(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.Default.Observe = true
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		first := holdOne(t, e, g, "held", 40<<10)

		big := strings.Repeat("o", 40<<10)
		r := e.do(req{key: "observed", body: big})
		if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), fmt.Sprintf(`"body_len":%d`, len(big))) {
			t.Errorf("observe mode, body beyond the budget: status %d %s, want the upstream's 201 with the whole body", r.StatusCode, r.body)
		}
		if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"outcome": "overloaded"}); got != 1 {
			t.Errorf("requests_total{outcome=overloaded} %v, want 1", got)
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
	})
}

// TestBufferBudgetAnswerRecordedWithoutBody: an answer larger than the
// room left reaches its caller whole, and is recorded without its body:
// the retry gets the status and the "not stored" problem, never a second
// execution.
func TestBufferBudgetAnswerRecordedWithoutBody(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		answer := bytes.Repeat([]byte("a"), 100<<10)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(answer); i += 4 << 10 { // in pieces, as a stream
				_, _ = w.Write(answer[i : i+4<<10])
			}
		})
		r := e.do(req{key: "large-answer", body: "x"})
		if r.StatusCode != http.StatusCreated || !bytes.Equal(r.body, answer) {
			t.Fatalf("first: status %d, %d bytes; want 201 and the whole %d-byte answer", r.StatusCode, len(r.body), len(answer))
		}
		r = e.do(req{key: "large-answer", body: "x"})
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: status %d replayed %q, want the recorded 201", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
		if p := r.problem(t); p["type"] != "urn:idemproxy:problem:response-not-stored" {
			t.Errorf("retry: problem %v, want response-not-stored", p)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("upstream calls %d, want 1", got)
		}
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", map[string]string{"stage": "answer"}); got != 1 {
			t.Errorf("buffer_full_total{stage=answer} %v, want 1", got)
		}
		if !strings.Contains(e.logs.String(), "MAX_BUFFERED_BYTES reached while copying the answer") {
			t.Errorf("no warning for the answer recorded without its body; log:\n%s", e.logs)
		}
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
	})
}
