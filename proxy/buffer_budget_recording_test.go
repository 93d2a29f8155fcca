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

// gatedCompletes holds every complete script at a gate: it reports each on
// reached, then waits for open to be closed.
type gatedCompletes struct {
	redis.Scripter
	sha     string
	reached chan struct{}
	open    chan struct{}
}

func (g gatedCompletes) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if sha == g.sha {
		g.reached <- struct{}{}
		<-g.open
	}
	return g.Scripter.EvalSha(ctx, sha, keys, args...)
}

// TestBufferBudgetRecordingCounted: while Redis takes an answer's record
// (up to claim.CompleteBudget with retries), the record's encoding holds the
// answer. MAX_BUFFERED_BYTES counts it, and the answer's copy, which it
// replaces, goes: four 3 MiB answers whose completions Redis has not taken
// yet grow the live heap by no more than idemproxy_buffered_bytes counts,
// and the count is the encodings', not the copies' and the encodings'.
// (Left out of the count until 2026-11-25: each held both, half of it
// uncounted.)
func TestBufferBudgetRecordingCounted(t *testing.T) {
	const (
		n    = 4
		size = 3 << 20
	)
	for _, backend := range bothBackends { // one at a time: the heap is the process's
		t.Run(backend, func(t *testing.T) {
			e := budgetEnv(t, backend, 64<<20, 4<<20, 10*time.Second)
			big := bytes.Repeat([]byte("a"), size)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", fmt.Sprint(len(big)))
				_, _ = w.Write(big)
			})
			sum := sha1.Sum([]byte(scripts.Complete)) //nolint:gosec // see the import
			g := gatedCompletes{Scripter: e.rdb, sha: hex.EncodeToString(sum[:]), reached: make(chan struct{}, n), open: make(chan struct{})}
			var once sync.Once
			openGate := func() { once.Do(func() { close(g.open) }) }
			defer openGate()
			srv, reg := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
				return claim.NewStore(g, "idem:", m.ObserveScript)
			})

			before := liveHeap()
			var wg sync.WaitGroup
			defer wg.Wait()
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", nil)
					if err != nil {
						t.Error(err)
						return
					}
					r.Header.Set("Idempotency-Key", fmt.Sprintf("recorded-%d", i))
					resp, err := srv.Client().Do(r)
					if err != nil {
						t.Error(err)
						return
					}
					defer resp.Body.Close()
					// Read and dropped: this process holds nothing of it.
					if got, _ := io.Copy(io.Discard, resp.Body); resp.StatusCode != http.StatusOK || got != size {
						t.Errorf("request %d: status %d, %d bytes", i, resp.StatusCode, got)
					}
				}()
			}
			for i := range n {
				select {
				case <-g.reached:
				case <-time.After(5 * time.Second):
					t.Fatalf("%d of %d completions reached Redis", i, n)
				}
			}

			grown := liveHeap() - before
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d completions of %d MiB answers held back: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB", n, size>>20, counted, float64(grown)/(1<<20))
			if grown > int64(counted)+4<<20 {
				t.Errorf("live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: records being written to Redis are held uncounted", float64(grown)/(1<<20), counted)
			}
			if counted > n*(size+256<<10) {
				t.Errorf("idemproxy_buffered_bytes %v for %d records of %d MiB being written: the answer's copy is counted beside its encoding (or kept)", counted, n, size>>20)
			}

			openGate()
			wg.Wait()
			got := counter(t, reg, "idemproxy_buffered_bytes", nil)
			for deadline := time.Now().Add(2 * time.Second); got != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				got = counter(t, reg, "idemproxy_buffered_bytes", nil)
			}
			if got != 0 {
				t.Errorf("idemproxy_buffered_bytes %v once recorded, want 0", got)
			}
			for i := range n {
				if r := e.doTo(srv, req{key: fmt.Sprintf("recorded-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != size || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry %d: status %d, %d bytes, replayed %q: want the recorded answer", i, r.StatusCode, len(r.body), r.Header.Get("Idempotent-Replayed"))
				}
			}
		})
	}
}
