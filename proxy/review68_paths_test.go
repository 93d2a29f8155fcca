package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// review68Body is the deterministic body of (key, n bytes): every answer
// differs, so a pooled buffer reused too early would show in a replay.
func review68Body(key string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(i*7+len(key)*13+int(key[len(key)-1]))%36]
	}
	copy(b, key)
	return b
}

// TestReview68CountReturnsToZeroAcrossPaths (soundness check, passes on
// HEAD): every way an executed answer ends (large and small copies, a body
// the upstream aborts, one past MAX_STORED_RESPONSE_BYTES, 103 then the
// answer, trailers, 204, a released 5xx, an event stream, a client that
// leaves mid-answer) run concurrently, several rounds, on both backends:
// MAX_BUFFERED_BYTES returns to 0, and every stored answer replays byte for
// byte (no pooled copy reused while it still held another's answer).
func TestReview68CountReturnsToZeroAcrossPaths(t *testing.T) {
	const rounds = 6
	for _, backend := range bothBackends {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, func(o *proxy.Options) {
				budgetSizes(o, 4<<20, 64<<10, 5*time.Second)
			})
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				key := r.Header.Get("Idempotency-Key")
				fl := w.(http.Flusher)
				switch {
				case strings.HasPrefix(r.URL.Path, "/big"), strings.HasPrefix(r.URL.Path, "/leave"):
					b := review68Body(key, 40000+len(key))
					w.Header().Set("Content-Length", fmt.Sprint(len(b)))
					_, _ = w.Write(b)
				case strings.HasPrefix(r.URL.Path, "/small"):
					b := review68Body(key, 3000)
					for i := 0; i < len(b); i += 1000 {
						_, _ = w.Write(b[i : i+1000])
						fl.Flush()
					}
				case strings.HasPrefix(r.URL.Path, "/abort"):
					w.Header().Set("Content-Length", "10000")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write(review68Body(key, 5000))
					fl.Flush()
					panic(http.ErrAbortHandler)
				case strings.HasPrefix(r.URL.Path, "/toolarge"):
					b := review68Body(key, 100<<10)
					for i := 0; i < len(b); i += 10 << 10 {
						_, _ = w.Write(b[i : i+10<<10])
						fl.Flush()
					}
				case strings.HasPrefix(r.URL.Path, "/early"):
					w.Header().Set("Link", "</a.css>; rel=preload")
					w.WriteHeader(http.StatusEarlyHints)
					w.Header().Del("Link")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write(review68Body(key, 20000))
				case strings.HasPrefix(r.URL.Path, "/trailer"):
					w.Header().Set("Trailer", "X-Sum")
					_, _ = w.Write(review68Body(key, 30000))
					w.Header().Set("X-Sum", "sum-"+key)
				case strings.HasPrefix(r.URL.Path, "/nobody"):
					w.WriteHeader(http.StatusNoContent)
				case strings.HasPrefix(r.URL.Path, "/fail"):
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = w.Write(review68Body(key, 20000))
				case strings.HasPrefix(r.URL.Path, "/sse"):
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: one\n\n")
					fl.Flush()
					_, _ = io.WriteString(w, "data: two\n\n")
				}
			})
			paths := []string{"/big", "/small", "/abort", "/toolarge", "/early", "/trailer", "/nobody", "/fail", "/sse", "/leave"}
			type first struct {
				status  int
				body    []byte
				trailer string
				ok      bool // read to its end without error
			}
			var (
				mu     sync.Mutex
				firsts = map[string]first{}
				wg     sync.WaitGroup
			)
			for round := range rounds {
				for _, p := range paths {
					key := fmt.Sprintf("r68-%s-%d", p[1:], round)
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+p, strings.NewReader("body-"+key))
						hr.Header.Set("Idempotency-Key", key)
						resp, err := e.srv.Client().Do(hr)
						if err != nil {
							t.Errorf("%s: %v", key, err)
							return
						}
						defer resp.Body.Close()
						if p == "/leave" { // the client leaves after the first bytes
							_, _ = io.ReadFull(resp.Body, make([]byte, 100))
							return
						}
						b, err := io.ReadAll(resp.Body)
						mu.Lock()
						firsts[key] = first{status: resp.StatusCode, body: b, trailer: resp.Trailer.Get("X-Sum"), ok: err == nil}
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			eventually(t, 5*time.Second, "idemproxy_buffered_bytes back to 0", func() bool { return bufferedBytes(t, e) == 0 })

			for round := range rounds {
				for _, p := range paths {
					key := fmt.Sprintf("r68-%s-%d", p[1:], round)
					f := firsts[key]
					r := e.doTo(e.srv, req{path: p, key: key, body: "body-" + key})
					switch p {
					case "/big", "/small", "/early", "/trailer", "/leave":
						want := review68Body(key, map[string]int{"/big": 40000 + len(key), "/leave": 40000 + len(key), "/small": 3000, "/early": 20000, "/trailer": 30000}[p])
						if p != "/leave" && (!f.ok || !bytes.Equal(f.body, want)) {
							t.Errorf("%s first: %d bytes (ok %v), not the upstream's %d", key, len(f.body), f.ok, len(want))
						}
						if r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, want) {
							t.Errorf("%s replay: status %d replayed %q, %d bytes, equal %v", key, r.StatusCode, r.Header.Get("Idempotent-Replayed"), len(r.body), bytes.Equal(r.body, want))
						}
						if p == "/trailer" && (f.trailer != "sum-"+key || r.Trailer.Get("X-Sum") != "sum-"+key) {
							t.Errorf("%s trailer: first %q, replay %q", key, f.trailer, r.Trailer.Get("X-Sum"))
						}
					case "/nobody":
						if r.StatusCode != http.StatusNoContent || r.Header.Get("Idempotent-Replayed") != "true" {
							t.Errorf("%s replay: %d", key, r.StatusCode)
						}
					case "/abort", "/toolarge", "/sse":
						if r.Header.Get("Idempotent-Replayed") != "true" {
							t.Errorf("%s replay: %d, not replayed", key, r.StatusCode)
						}
					}
				}
			}
			eventually(t, 5*time.Second, "idemproxy_buffered_bytes back to 0 after the replays", func() bool { return bufferedBytes(t, e) == 0 })
		})
	}
}
