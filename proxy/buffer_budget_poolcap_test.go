package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestBufferBudgetPooledCopiesBounded: a keyed request in flight whose
// upstream has not answered yet holds no answer buffer, so memory does not
// grow with concurrency beyond what idemproxy_buffered_bytes counts. One P
// (GOMAXPROCS=1) makes sync.Pool hand on the buffer a 1 MiB answer just
// returned; sixteen requests are then held at the upstream. (Found by
// review: each took a pooled buffer grown by an earlier answer at once,
// uncounted: 10 to 16 MiB against a 4 MiB budget.)
func TestBufferBudgetPooledCopiesBounded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const (
		rounds = 16
		max    = 1 << 20
		budget = 4 << 20
	)
	// redis-server, not miniredis: the twelve 1 MiB records must not sit in
	// this process's heap.
	e := budgetEnv(t, realBackend, budget, max, 15*time.Second)
	big := bytes.Repeat([]byte("b"), max)
	g := newGate()
	defer g.open()
	held := g.handler(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/held" {
			held(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		_, _ = w.Write(big)
	})

	before := liveHeap()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer g.open()
	for i := range rounds {
		if r := e.do(req{path: "/big", key: fmt.Sprintf("big-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != max {
			t.Fatalf("big %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
			defer cancel()
			if _, err := e.send(ctx, e.srv, req{path: "/held", key: fmt.Sprintf("held-%d", i)}); err != nil {
				t.Errorf("held %d: %v", i, err)
			}
		}()
		g.wait(t)
	}
	heapWithinCount(t, e, before, "keyed requests in flight with empty bodies", "pooled answer buffers keep an earlier answer's capacity, uncounted")
	g.open()
}

// TestBufferBudgetSmallAnswerCountsSmall: the copy is counted by its
// buffer's capacity, so a buffer grown by a large answer must not be handed
// to the next one from the pool: a small answer would count (and keep out
// other requests) as much as the largest before it.
func TestBufferBudgetSmallAnswerCountsSmall(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: the pool hands back what was just put
	e := newEnv(t, miniBackend, budgetOptions)
	large := bytes.Repeat([]byte("l"), 40<<10)
	rest := newGate() // ends the small answer
	defer rest.open()
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/large" {
			_, _ = w.Write(large)
			return
		}
		_, _ = io.WriteString(w, "small")
		w.(http.Flusher).Flush()
		select { // the answer is being recorded while the test looks
		case <-rest.release:
		case <-time.After(5 * time.Second):
		}
	})
	for i := range 3 {
		if r := e.do(req{path: "/large", key: fmt.Sprintf("large-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != len(large) {
			t.Fatalf("large %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := e.send(context.Background(), e.srv, req{path: "/small", key: "small"}); err != nil {
			t.Errorf("small: %v", err)
		}
	}()
	eventually(t, 5*time.Second, "the small answer's copy counted", func() bool { return bufferedBytes(t, e) > 0 })
	if got := bufferedBytes(t, e); got > 16<<10 {
		t.Errorf("a 5-byte answer being recorded counts %v bytes, want at most 16 KiB (a buffer a 40 KiB answer grew was handed on)", got)
	}
	rest.open()
	<-done
}
