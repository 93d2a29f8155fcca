package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/scripts"
)

// capturingCompletes is gatedCompletes that also notes each encoding's
// length and capacity (complete.lua's second argument).
type capturingCompletes struct {
	redis.Scripter
	sha     string
	reached chan [2]int
	open    chan struct{}
}

func (g capturingCompletes) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if sha == g.sha {
		enc, _ := args[1].([]byte)
		g.reached <- [2]int{len(enc), cap(enc)}
		<-g.open
	}
	return g.Scripter.EvalSha(ctx, sha, keys, args...)
}

// TestReview68RecordingCountsEncodingCapacity: while Redis takes a record,
// what the process holds is the encoding's allocation, cap(enc), not
// len(enc): Record.Encode allocates an over-estimate (10 bytes per header
// value, 20 per name, 43 more) and the allocator rounds it up (to a size
// class, or to whole 8 KiB pages above 32 KiB). The copy the encoding
// replaces was counted by its capacity; the encoding is counted by its
// length. For answers just above 32 KiB that is ~20 % uncounted per
// recording (up to 8 KiB each), more for answers with many short header
// values, which the upstream chooses.
func TestReview68RecordingCountsEncodingCapacity(t *testing.T) {
	const (
		n    = 4
		size = 32<<10 + 1
	)
	for _, backend := range bothBackends {
		t.Run(backend, func(t *testing.T) {
			e := budgetEnv(t, backend, 4<<20, 1<<20, 10*time.Second)
			body := bytes.Repeat([]byte("c"), size)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				_, _ = w.Write(body)
			})
			sum := sha1.Sum([]byte(scripts.Complete)) //nolint:gosec // see the import
			g := capturingCompletes{Scripter: e.rdb, sha: hex.EncodeToString(sum[:]), reached: make(chan [2]int, n), open: make(chan struct{})}
			var once sync.Once
			openGate := func() { once.Do(func() { close(g.open) }) }
			defer openGate()
			srv, reg := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
				return claim.NewStore(g, "idem:", m.ObserveScript)
			})
			var wg sync.WaitGroup
			defer wg.Wait()
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					r, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/orders", nil)
					r.Header.Set("Idempotency-Key", fmt.Sprintf("enccap-%d", i))
					resp, err := srv.Client().Do(r)
					if err != nil {
						t.Error(err)
						return
					}
					defer resp.Body.Close()
					_, _ = io.Copy(io.Discard, resp.Body)
				}()
			}
			var lens, caps int
			for i := range n {
				select {
				case lc := <-g.reached:
					lens += lc[0]
					caps += lc[1]
				case <-time.After(5 * time.Second):
					t.Fatalf("%d of %d completions reached Redis", i, n)
				}
			}
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d encodings held: len %d, cap %d; idemproxy_buffered_bytes=%v", n, lens, caps, counted)
			if counted < float64(caps) {
				t.Errorf("idemproxy_buffered_bytes %v while %d encodings of %d bytes' capacity (%d long) are held: %d bytes held uncounted", counted, n, caps, lens, caps-int(counted))
			}
			openGate()
			wg.Wait()
			eventually(t, 2*time.Second, "idemproxy_buffered_bytes back to 0", func() bool { return counter(t, reg, "idemproxy_buffered_bytes", nil) == 0 })
		})
	}
}
