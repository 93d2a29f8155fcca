package e2e

// Shared by the tests against real Redis topologies (cluster_test.go,
// sentinel_test.go) and the soak (soak_test.go): an upstream that counts
// executions per key, the binary started with its log kept, keyed requests
// and their answers, a load that runs during a failover, and plain clients
// to single Redis nodes.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// fleetUpstream is the protected API: it counts executions per idempotency
// key (KeyCalls) and answers 201 with a body unique to each execution.
type fleetUpstream struct {
	*testutil.Upstream
	delay atomic.Int64 // ns spent "executing" each request
}

func newFleetUpstream(t *testing.T) *fleetUpstream {
	u := &fleetUpstream{}
	u.Upstream = testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		_, _ = io.Copy(io.Discard, r.Body)
		n := u.KeyCalls(key)
		if d := time.Duration(u.delay.Load()); d > 0 {
			time.Sleep(d)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "executed %s #%d nonce %s\n", key, n, fleetNonce())
	})
	return u
}

func fleetNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fleetKeyHash is the key_hash the proxy logs for key, sent without any
// scope header (SCOPE_HEADERS=Authorization, absent).
func fleetKeyHash(key string) string { return claim.NewKey([]string{""}, key).String() }

// fleetRedisKey is the Redis key of key's record (KEY_PREFIX "idem:").
func fleetRedisKey(key string) string {
	k := claim.NewKey([]string{""}, key)
	return "idem:{" + hex.EncodeToString(k[:]) + "}"
}

// fleetProxy is the binary with a client sized for a load.
type fleetProxy struct {
	*proxy
	client *http.Client
}

// startFleetProxy starts the binary with the given extra environment (it
// overrides the defaults below); it is killed when the test ends.
func startFleetProxy(t *testing.T, upstream string, extra ...string) *fleetProxy {
	t.Helper()
	p := &fleetProxy{
		proxy: startProxy(t, append([]string{"UPSTREAM_URL=" + upstream, "LOG_LEVEL=warn"}, extra...)...),
		client: &http.Client{
			Timeout:   20 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256},
		},
	}
	t.Cleanup(p.client.CloseIdleConnections)
	return p
}

// keyHashes returns the key_hash of every log line whose message contains
// msg.
func (p *fleetProxy) keyHashes(msg string) map[string]bool {
	out := map[string]bool{}
	for _, m := range p.logLines() {
		hash, _ := m["key_hash"].(string)
		if s, _ := m["message"].(string); hash != "" && strings.Contains(s, msg) {
			out[hash] = true
		}
	}
	return out
}

// fleetAnswer is what one keyed request got.
type fleetAnswer struct {
	status   int
	replayed bool
	body     string
	err      error
}

// send POSTs /v1/orders with key, the body derived from the key (so every
// send of one key has the same fingerprint).
func (p *fleetProxy) send(key string) fleetAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url("/v1/orders"), strings.NewReader(`{"order":"`+key+`"}`))
	if err != nil {
		return fleetAnswer{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return fleetAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fleetAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(b), err: err}
}

// sendUntil retries key until ok accepts the answer, at most timeout.
func (p *fleetProxy) sendUntil(key string, timeout time.Duration, ok func(fleetAnswer) bool) (fleetAnswer, int) {
	deadline := time.Now().Add(timeout)
	tries := 0
	for {
		a := p.send(key)
		tries++
		if ok(a) || time.Now().After(deadline) {
			return a, tries
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fleetExecuted(a fleetAnswer) bool {
	return a.err == nil && a.status == http.StatusCreated && !a.replayed
}

// fleetClientName names the test's own connections to Redis nodes.
const fleetClientName = "idemproxy-test"

// fleetNodeClients holds one client per (test, node), closed when that test
// ends.
var fleetNodeClients sync.Map

type fleetNodeKey struct {
	t    *testing.T
	addr string
}

// fleetNodeClient is a plain client to one node (not cluster-aware): a
// command for a key of another node's slot gets MOVED, which is what we want
// when checking where a record lives. Its connections carry a name, so that
// sentinelForeignConns can tell them from the proxy's.
func fleetNodeClient(t *testing.T, s *redistest.Server) *redis.Client {
	k := fleetNodeKey{t, s.Addr()}
	if c, ok := fleetNodeClients.Load(k); ok {
		return c.(*redis.Client)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, ClientName: fleetClientName})
	fleetNodeClients.Store(k, c)
	t.Cleanup(func() {
		fleetNodeClients.Delete(k)
		_ = c.Close()
	})
	return c
}

// fleetKeys returns n distinct keys named prefix-0 ... prefix-(n-1), with a
// random part so that reruns never meet old records.
func fleetKeys(prefix string, n int) []string {
	run := fleetNonce()[:6]
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%s-%d", prefix, run, i)
	}
	return keys
}

// sendAll sends every key once from workers goroutines and returns the
// answers by key.
func (p *fleetProxy) sendAll(keys []string, workers int) map[string]fleetAnswer {
	var mu sync.Mutex
	out := make(map[string]fleetAnswer, len(keys))
	ch := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := range ch {
				a := p.send(k)
				mu.Lock()
				out[k] = a
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
	return out
}

// fleetLoad sends keyed requests from a few goroutines until stopped (or a
// per-goroutine cap is reached): repeats of keys that are already recorded,
// and fresh keys, each fresh key sent once. It counts what came back.
type fleetLoad struct {
	p       *fleetProxy
	repeats []string // recorded keys: must only ever replay
	bodies  map[string]string
	prefix  string

	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	fresh   map[string]fleetAnswer
	freshAt map[string]time.Time // when the fresh key was sent
	doneAt  map[string]time.Time // when its answer came back
	status  map[string]int       // "201", "201 replayed", "409", "503", "error", ...
	bad     []string
}

func startFleetLoad(p *fleetProxy, repeats []string, bodies map[string]string, prefix string, workers int) *fleetLoad {
	l := &fleetLoad{p: p, repeats: repeats, bodies: bodies, prefix: prefix + "-" + fleetNonce()[:6],
		stop: make(chan struct{}), fresh: map[string]fleetAnswer{}, freshAt: map[string]time.Time{}, doneAt: map[string]time.Time{},
		status: map[string]int{}}
	for w := range workers {
		l.wg.Go(func() {
			const maxSends = 5000
			for i := range maxSends {
				select {
				case <-l.stop:
					return
				default:
				}
				if i%2 == 0 {
					k := repeats[(w*7919+i)%len(repeats)]
					a := p.send(k)
					l.note(a)
					if a.err == nil && a.status == http.StatusCreated && (!a.replayed || a.body != bodies[k]) {
						l.mu.Lock()
						l.bad = append(l.bad, fmt.Sprintf("recorded %s: status %d replayed=%v body %q, want replay of %q", k, a.status, a.replayed, a.body, bodies[k]))
						l.mu.Unlock()
					}
					continue
				}
				k := fmt.Sprintf("%s-%d-%d", l.prefix, w, i)
				sent := time.Now()
				a := p.send(k)
				l.note(a)
				l.mu.Lock()
				l.fresh[k], l.freshAt[k], l.doneAt[k] = a, sent, time.Now()
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *fleetLoad) note(a fleetAnswer) {
	label := "error"
	switch {
	case a.err != nil:
	case a.replayed:
		label = fmt.Sprintf("%d replayed", a.status)
	default:
		label = fmt.Sprint(a.status)
	}
	l.mu.Lock()
	l.status[label]++
	l.mu.Unlock()
}

func (l *fleetLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// settle resends every fresh key of the load until it is no longer in flight
// (a claim whose recording failed holds its key until LOCK_TTL) and returns
// the final answers.
func (l *fleetLoad) settle(timeout time.Duration) map[string]fleetAnswer {
	keys := make([]string, 0, len(l.fresh))
	for k := range l.fresh {
		keys = append(keys, k)
	}
	var mu sync.Mutex
	out := map[string]fleetAnswer{}
	ch := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range ch {
				a, _ := l.p.sendUntil(k, timeout, func(a fleetAnswer) bool { return a.err == nil && a.status == http.StatusCreated })
				mu.Lock()
				out[k] = a
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
	return out
}

// fleetWantReplayed resends keys recorded before a failover: each must replay
// its recorded body (bodies[key]) and have executed once only.
func fleetWantReplayed(t *testing.T, p *fleetProxy, up *fleetUpstream, recorded []string, bodies map[string]string) {
	t.Helper()
	for k, a := range p.sendAll(recorded, 8) {
		if a.err != nil || !a.replayed || a.body != bodies[k] {
			t.Errorf("recorded %s after failover: status %d replayed=%v err=%v body %q, want replay of %q",
				k, a.status, a.replayed, a.err, a.body, bodies[k])
		}
		if n := up.KeyCalls(k); n != 1 {
			t.Errorf("recorded %s executed %d times, want 1", k, n)
		}
	}
}
