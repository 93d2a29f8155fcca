package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReview68RecordingHeadersCounted: an answer's headers are held while
// Redis takes its record as its body is, by the upstream's header map
// (net/http lets an upstream send up to 10 MiB of them; the proxy's
// Transport sets no MaxResponseHeaderBytes) besides the encoding, which
// is counted. Four answers with about 6 MB of headers each (150 values of 40 KiB), whose completions
// Redis has not taken yet, must not grow the live heap past what
// idemproxy_buffered_bytes counts. (Not introduced by 33a36ae, which made
// it better: before it neither the headers nor their encoding counted.)
func TestReview68RecordingHeadersCounted(t *testing.T) {
	const (
		n      = 4
		values = 150
		each   = 40 << 10 // 150 x 40 KiB = 6 MiB of headers per answer
	)
	e := budgetEnv(t, realBackend, 64<<20, 1<<20, 10*time.Second)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		for i := range values {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), key+strings.Repeat("h", each-len(key))) // whole pages
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	srv, reg, g := gatedCompletesProxy(t, e, n)
	before := liveHeap()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer g.release() // first: the handlers wait for it
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A raw connection, read and dropped: the test process keeps
			// nothing of the answer (a net/http client would hold its
			// headers until the body ends, after the completion).
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URL, "http://"), 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(15 * time.Second))
			fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hdr-%d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", i)
			_, _ = io.Copy(io.Discard, c)
		}()
	}
	g.await(t, n)
	grown := liveHeap() - before
	counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
	t.Logf("%d answers with %d MiB of headers being recorded: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB", n, values*each>>20, counted, float64(grown)/(1<<20))
	if grown > int64(counted)+4<<20 {
		t.Errorf("live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: answers' headers held uncounted while recorded", float64(grown)/(1<<20), counted)
	}
	g.release()
}
