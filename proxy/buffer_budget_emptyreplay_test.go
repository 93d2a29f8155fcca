package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestBufferBudgetEmptyReplayAlwaysFits: a replay of an empty body holds no
// memory and is never refused, even with the count past MAX_BUFFERED_BYTES
// (where a recorded answer may take it). A WAIT_TIMEOUT waiter let in with
// room waits; another request's answer takes the count past the limit; the
// first completes with an empty body, and the waiter gets its replay.
// (Found by review: it got 503.)
func TestBufferBudgetEmptyReplayAlwaysFits(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.Default.Wait = 8 * time.Second
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		rest := newGate() // ends the stream
		defer rest.open()
		gatedEmpty := g.handler(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/empty":
				gatedEmpty(w, r)
			case "/stream":
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte(strings.Repeat("s", 36<<10)))
				w.(http.Flusher).Flush()
				select {
				case <-rest.release:
				case <-time.After(8 * time.Second):
				}
				_, _ = w.Write([]byte("end"))
			default:
				e.created(w, r)
			}
		})
		send := func(r req) <-chan response {
			ch := make(chan response, 1)
			go func() {
				resp, err := e.send(context.Background(), e.srv, r)
				if err != nil {
					t.Errorf("%s: %v", r.key, err)
				}
				ch <- resp
			}()
			return ch
		}
		first := send(req{path: "/empty", key: "k", body: "x"})
		g.wait(t)
		waiter := send(req{path: "/empty", key: "k", body: "x"})
		eventually(t, 5*time.Second, "the waiter let in (its byte counted)", func() bool { return bufferedBytes(t, e) == 2 })

		stream := send(req{path: "/stream", key: "s", body: strings.Repeat("b", 30<<10)})
		eventually(t, 5*time.Second, "an answer counted past the limit", func() bool { return bufferedBytes(t, e) > 64<<10 })

		g.open()
		if r := <-first; r.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", r.StatusCode)
		}
		w := <-waiter
		rest.open()
		<-stream
		if w.StatusCode != http.StatusCreated || w.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("waiter for an empty answer: status %d %s; want the 201 replayed (it holds no bytes)", w.StatusCode, w.body)
		}
	})
}
