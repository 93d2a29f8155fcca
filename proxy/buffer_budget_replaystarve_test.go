package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBufferBudgetLargeReplayNotStarved: a replay is let in under a new
// request's rule (the count below MAX_BUFFERED_BYTES), then counts its
// record, so a retry of a completed request is never refused where a new
// execution of the same size gets in. (Found by review: a replay had to fit
// whole, and a 40 KiB replay got 503 while a new request with the same
// 40 KiB answer was executed, so under steady load large replays starved.)
func TestBufferBudgetLargeReplayNotStarved(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		answer := bytes.Repeat([]byte("a"), 40<<10)
		held := g.handler(e.created)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/held":
				held(w, r)
			case "/large":
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
				_, _ = w.Write(answer)
			default:
				e.created(w, r)
			}
		})
		body := strings.Repeat("b", 30<<10)
		if r := e.do(req{path: "/large", key: "done", body: body}); r.StatusCode != http.StatusOK {
			t.Fatalf("first: status %d", r.StatusCode)
		}
		eventually(t, 5*time.Second, "nothing held", func() bool { return bufferedBytes(t, e) == 0 })

		first := holdOne(t, e, g, "held", 30<<10) // 30 of the 64 KiB

		fresh := e.do(req{path: "/large", key: "fresh", body: body})
		retry := e.do(req{path: "/large", key: "done", body: body})
		t.Logf("new request: %d (%d bytes); retry of the completed one: %d %s",
			fresh.StatusCode, len(fresh.body), retry.StatusCode, retry.Header.Get("Retry-After"))
		if fresh.StatusCode != http.StatusOK {
			t.Fatalf("new request: status %d (the scenario needs it admitted)", fresh.StatusCode)
		}
		if retry.StatusCode != http.StatusOK || retry.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry of a completed request (40 KiB record) refused with %d while a new request with the same body and answer was executed: "+
				"large replays are starved by the admission rule (new: used < max; replay: used+len <= max)", retry.StatusCode)
		}
		g.open()
		<-first
	})
}
