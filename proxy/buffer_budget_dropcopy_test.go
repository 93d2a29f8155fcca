package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestBufferBudgetDroppedCopyFreed: an answer that streams past
// MAX_STORED_RESPONSE_BYTES drops its copy, and the copy's memory goes with
// it, not when the stream ends (up to UPSTREAM_TIMEOUT later). Twelve such
// streams stay open after their copies are dropped; the live heap must not
// hold their 12 MiB while idemproxy_buffered_bytes reads 0. (Found by review:
// the copy was Reset, which keeps its capacity.)
func TestBufferBudgetDroppedCopyFreed(t *testing.T) {
	const (
		streams = 12
		max     = 1 << 20
		budget  = 4 << 20
	)
	e := budgetEnv(t, miniBackend, budget, max, 15*time.Second)
	piece := bytes.Repeat([]byte("s"), 32<<10)
	release := newGate() // (opened before the streams are waited for, below)
	past := make(chan struct{}, streams)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		for n := 0; n <= max; n += len(piece) { // one piece past the limit
			_, _ = w.Write(piece)
			w.(http.Flusher).Flush()
		}
		select { // the stream stays open
		case <-release.release:
		case <-time.After(12 * time.Second):
		}
	})

	before := liveHeap()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer release.open()
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			signalled := false
			ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
			defer cancel()
			hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/stream", nil)
			hr.Header.Set("Idempotency-Key", "stream-"+string(rune('a'+i)))
			resp, err := e.srv.Client().Do(hr)
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 32<<10)
			var got int
			for {
				n, err := resp.Body.Read(buf)
				got += n
				if got > max && !signalled {
					// The proxy wrote past the limit to the client: its copy was dropped first.
					signalled = true
					past <- struct{}{}
				}
				if err != nil {
					return
				}
			}
		}()
		select { // one at a time: each copy grows to 1 MiB alone, well within the budget
		case <-past:
		case <-time.After(5 * time.Second):
			t.Fatalf("stream %d: the client did not get past the limit", i)
		}
		eventually(t, 5*time.Second, "the dropped copy given back", func() bool { return bufferedBytes(t, e) == 0 })
	}

	heapWithinCount(t, e, before, "streams past MAX_STORED_RESPONSE_BYTES, copies dropped", "dropped answer copies keep their memory, uncounted")
	release.open()
}
