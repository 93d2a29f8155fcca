package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/scripts"
)

// completeGate holds every complete script at a gate: it reports each, with
// its encoding's length and capacity (complete.lua's second argument), on
// reached, then waits for the gate to open.
type completeGate struct {
	redis.Scripter
	sha     string
	reached chan [2]int
	open    chan struct{}
	once    *sync.Once
}

func (g completeGate) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if sha == g.sha {
		enc, _ := args[1].([]byte)
		g.reached <- [2]int{len(enc), cap(enc)}
		<-g.open
	}
	return g.Scripter.EvalSha(ctx, sha, keys, args...)
}

// release opens the gate (once; later calls do nothing).
func (g completeGate) release() { g.once.Do(func() { close(g.open) }) }

// await waits for n complete scripts at the gate and returns the sums of
// their encodings' lengths and capacities.
func (g completeGate) await(t *testing.T, n int) (lens, caps int) {
	t.Helper()
	for i := range n {
		select {
		case lc := <-g.reached:
			lens += lc[0]
			caps += lc[1]
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d completions reached Redis", i, n)
		}
	}
	return lens, caps
}

// gatedCompletesProxy starts a Handler on e's Redis whose complete scripts
// wait at a gate, up to n at once. The gate opens when the test ends at the
// latest (before the server closes, which waits for the handlers).
func gatedCompletesProxy(t *testing.T, e *env, n int) (*httptest.Server, *prometheus.Registry, completeGate) {
	t.Helper()
	sum := sha1.Sum([]byte(scripts.Complete)) //nolint:gosec // see the import
	g := completeGate{Scripter: e.rdb, sha: hex.EncodeToString(sum[:]), reached: make(chan [2]int, n), open: make(chan struct{}), once: new(sync.Once)}
	srv, reg := storeProxy(t, e, e.opts, func(m *proxy.Metrics) *claim.Store {
		return claim.NewStore(g, "idem:", m.ObserveScript)
	})
	t.Cleanup(g.release)
	return srv, reg, g
}

// answerWith has e's upstream answer every request 200 with body, its
// length announced.
func answerWith(e *env, body []byte) {
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	})
}

// sendDropped sends n keyed requests to srv at once (keys prefix-0 to
// prefix-<n-1>), each answer read and dropped, so that this process holds
// nothing of it; each must be 200 with size bytes. wg waits for them.
func sendDropped(t *testing.T, wg *sync.WaitGroup, srv *httptest.Server, prefix string, n, size int) {
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			r, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/orders", nil)
			if err != nil {
				t.Error(err)
				return
			}
			r.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
			resp, err := srv.Client().Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if got, _ := io.Copy(io.Discard, resp.Body); resp.StatusCode != http.StatusOK || got != int64(size) {
				t.Errorf("request %s-%d: status %d, %d bytes, want 200 and %d", prefix, i, resp.StatusCode, got, size)
			}
		}()
	}
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
			answerWith(e, bytes.Repeat([]byte("a"), size))
			srv, reg, g := gatedCompletesProxy(t, e, n)

			before := liveHeap()
			var wg sync.WaitGroup
			defer wg.Wait()
			defer g.release() // first: the handlers wait for it
			sendDropped(t, &wg, srv, "recorded", n, size)
			g.await(t, n)

			grown := liveHeap() - before
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d completions of %d MiB answers held back: idemproxy_buffered_bytes=%v, live heap grew by %.1f MiB", n, size>>20, counted, float64(grown)/(1<<20))
			if grown > int64(counted)+4<<20 {
				t.Errorf("live heap grew by %.1f MiB while idemproxy_buffered_bytes reads %v: records being written to Redis are held uncounted", float64(grown)/(1<<20), counted)
			}
			if counted > n*(size+256<<10) {
				t.Errorf("idemproxy_buffered_bytes %v for %d records of %d MiB being written: the answer's copy is counted beside its encoding (or kept)", counted, n, size>>20)
			}

			g.release()
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
