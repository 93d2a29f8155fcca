package main

// Tests against real Redis topologies: a 3-master Redis Cluster with one
// replica per master, and Redis Sentinel (1 master, 1 replica, 3 sentinels).
// They start their own redis-server processes on free loopback ports
// (internal/redistest) and the proxy through start(), as in production.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// scaleUpstream is the protected API: it counts executions per idempotency
// key and answers 201 with a body unique to each execution.
type scaleUpstream struct {
	srv   *httptest.Server
	delay atomic.Int64 // ns spent "executing" each request
	execs sync.Map     // key -> *atomic.Int64
	total atomic.Int64
}

func newScaleUpstream(t *testing.T) *scaleUpstream {
	u := &scaleUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		_, _ = io.Copy(io.Discard, r.Body)
		v, _ := u.execs.LoadOrStore(key, new(atomic.Int64))
		n := v.(*atomic.Int64).Add(1)
		u.total.Add(1)
		if d := time.Duration(u.delay.Load()); d > 0 {
			time.Sleep(d)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "executed %s #%d nonce %s\n", key, n, scaleNonce())
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *scaleUpstream) count(key string) int64 {
	if v, ok := u.execs.Load(key); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

func scaleNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// scaleLog collects the proxy's JSON log lines, so a test can find what the
// proxy said about a key (by key_hash) and show the tail when it fails.
type scaleLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *scaleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// keyHashes returns the key_hash of every line whose message contains msg.
func (l *scaleLog) keyHashes(msg string) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]bool{}
	for line := range strings.SplitSeq(l.buf.String(), "\n") {
		var e struct {
			Message string `json:"message"`
			KeyHash string `json:"key_hash"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.KeyHash != "" && strings.Contains(e.Message, msg) {
			out[e.KeyHash] = true
		}
	}
	return out
}

func (l *scaleLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(l.buf.String()), "\n")
	lines = lines[max(0, len(lines)-n):]
	for i, line := range lines {
		if len(line) > 400 {
			lines[i] = line[:400] + "..."
		}
	}
	return strings.Join(lines, "\n")
}

// scaleKeyHash is the key_hash the proxy logs for key, sent without any
// scope header (SCOPE_HEADERS=Authorization, absent).
func scaleKeyHash(key string) string { return claim.NewKey([]string{""}, key).String() }

// scaleRedisKey is the Redis key of key's record (KEY_PREFIX "idem:").
func scaleRedisKey(key string) string {
	k := claim.NewKey([]string{""}, key)
	return "idem:{" + hex.EncodeToString(k[:]) + "}"
}

// scaleProxy is a proxy started in-process through start().
type scaleProxy struct {
	app    *app
	url    string
	log    *scaleLog
	client *http.Client
}

// startScaleProxy starts the proxy with the given extra environment (it
// overrides the defaults below) and stops it when the test ends.
func startScaleProxy(t *testing.T, upstream string, extra ...string) *scaleProxy {
	t.Helper()
	environ := append([]string{
		"UPSTREAM_URL=" + upstream,
		"LISTEN_ADDR=127.0.0.1:0",
		"ADMIN_ADDR=127.0.0.1:0",
		"LOG_LEVEL=warn",
	}, extra...)
	cfg, err := loadConfig(environ)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	lg := &scaleLog{}
	a, err := start(cfg, zerolog.New(lg).Level(cfg.level).With().Timestamp().Logger())
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	p := &scaleProxy{
		app: a, url: "http://" + a.proxyAddr.String(), log: lg,
		client: &http.Client{
			Timeout:   20 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256},
		},
	}
	t.Cleanup(func() {
		if err := a.shutdown(10 * time.Second); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
		p.client.CloseIdleConnections()
		if t.Failed() {
			t.Logf("proxy log tail:\n%s", lg.tail(8))
		}
	})
	return p
}

// scaleAnswer is what one keyed request got.
type scaleAnswer struct {
	status   int
	replayed bool
	body     string
	err      error
}

// send POSTs /v1/orders with key, the body derived from the key (so every
// send of one key has the same fingerprint).
func (p *scaleProxy) send(key string) scaleAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/v1/orders", strings.NewReader(`{"order":"`+key+`"}`))
	if err != nil {
		return scaleAnswer{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return scaleAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return scaleAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(b), err: err}
}

// sendUntil retries key until ok accepts the answer, at most timeout.
func (p *scaleProxy) sendUntil(key string, timeout time.Duration, ok func(scaleAnswer) bool) (scaleAnswer, int) {
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

func scaleExecuted(a scaleAnswer) bool {
	return a.err == nil && a.status == http.StatusCreated && !a.replayed
}

// scriptHashes are the SHA1s of the three Lua scripts, as EVALSHA names them.
func scaleScriptHashes() []string {
	return []string{
		redis.NewScript(scripts.Claim).Hash(),
		redis.NewScript(scripts.Complete).Hash(),
		redis.NewScript(scripts.Release).Hash(),
	}
}

// scaleNodeClients holds one client per (test, node), closed when that test
// ends.
var scaleNodeClients sync.Map

type scaleNodeKey struct {
	t    *testing.T
	addr string
}

// scaleNodeClient is a plain client to one node (not cluster-aware): a
// command for a key of another node's slot gets MOVED, which is what we want
// when checking where a record lives. Its connections carry a name, so that
// scaleForeignConns can tell them from the proxy's.
func scaleNodeClient(t *testing.T, s *redistest.Server) *redis.Client {
	k := scaleNodeKey{t, s.Addr()}
	if c, ok := scaleNodeClients.Load(k); ok {
		return c.(*redis.Client)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, ClientName: scaleClientName})
	scaleNodeClients.Store(k, c)
	t.Cleanup(func() {
		scaleNodeClients.Delete(k)
		_ = c.Close()
	})
	return c
}

// scaleKeys returns n distinct keys named prefix-0 ... prefix-(n-1), with a
// random part so that reruns never meet old records.
func scaleKeys(prefix string, n int) []string {
	run := scaleNonce()[:6]
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%s-%d", prefix, run, i)
	}
	return keys
}

// sendAll sends every key once from workers goroutines and returns the
// answers by key.
func (p *scaleProxy) sendAll(keys []string, workers int) map[string]scaleAnswer {
	var mu sync.Mutex
	out := make(map[string]scaleAnswer, len(keys))
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

// TestCluster runs the proxy on a 3-master Redis Cluster (one replica each)
// with REDIS_MODE=cluster and the six nodes as seeds.
func TestCluster(t *testing.T) {
	t0 := time.Now()
	c := redistest.StartCluster(t)
	t.Logf("cluster of %d nodes healthy in %s", len(c.Nodes()), time.Since(t0).Round(time.Millisecond))
	up := newScaleUpstream(t)
	p := startScaleProxy(t, up.srv.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","))

	// Hundreds of keys: each executes once, its record lands on the master
	// that owns its hash slot, all three masters get some, and a second send
	// replays the first answer.
	t.Run("spread and replay", func(t *testing.T) {
		keys := scaleKeys("spread", 300)
		first := p.sendAll(keys, 8)
		perMaster := map[string]int{}
		for _, k := range keys {
			a := first[k]
			if !scaleExecuted(a) {
				t.Fatalf("first send of %s: got status %d replayed=%v err=%v, want 201 executed", k, a.status, a.replayed, a.err)
			}
			// The record key of the proxy's Lua scripts, on its slot's master.
			m := c.NodeForKey(scaleRedisKey(k))
			st, err := scaleNodeClient(t, m).HGet(context.Background(), scaleRedisKey(k), "st").Result()
			if err != nil || st != "c" {
				t.Fatalf("record of %s on %s (slot %d): st=%q err=%v, want completed", k, m.Addr(), c.KeySlot(scaleRedisKey(k)), st, err)
			}
			perMaster[m.Addr()]++
		}
		t.Logf("records per master: %v", perMaster)
		if len(perMaster) != 3 {
			t.Fatalf("records landed on %d masters, want all 3: %v", len(perMaster), perMaster)
		}
		second := p.sendAll(keys, 8)
		for _, k := range keys {
			a := second[k]
			if a.err != nil || a.status != http.StatusCreated || !a.replayed || a.body != first[k].body {
				t.Errorf("second send of %s: status %d replayed=%v err=%v body %q, want a replay of %q",
					k, a.status, a.replayed, a.err, a.body, first[k].body)
			}
			if n := up.count(k); n != 1 {
				t.Errorf("%s executed %d times, want 1", k, n)
			}
		}
	})

	// Concurrent duplicates: 20 keys x 10 simultaneous sends. Each key
	// executes once; the other sends get a replay of that answer or 409.
	t.Run("concurrent duplicates", func(t *testing.T) {
		up.delay.Store(int64(100 * time.Millisecond))
		defer up.delay.Store(0)
		keys := scaleKeys("dup", 20)
		const sends = 10
		var mu sync.Mutex
		answers := map[string][]scaleAnswer{}
		startGate := make(chan struct{})
		var wg sync.WaitGroup
		for _, k := range keys {
			for range sends {
				wg.Go(func() {
					<-startGate
					a := p.send(k)
					mu.Lock()
					answers[k] = append(answers[k], a)
					mu.Unlock()
				})
			}
		}
		close(startGate)
		wg.Wait()
		var conflicts, replays int
		for _, k := range keys {
			var winner string
			execs := 0
			for _, a := range answers[k] {
				switch {
				case scaleExecuted(a):
					execs++
					winner = a.body
				case a.err == nil && a.status == http.StatusConflict:
					conflicts++
				case a.err == nil && a.status == http.StatusCreated && a.replayed:
					replays++
				default:
					t.Errorf("%s: unexpected answer status %d err=%v body %q", k, a.status, a.err, a.body)
				}
			}
			if execs != 1 || up.count(k) != 1 {
				t.Errorf("%s: %d executed answers, upstream ran it %d times; want 1 and 1", k, execs, up.count(k))
				continue
			}
			for _, a := range answers[k] {
				if a.replayed && a.body != winner {
					t.Errorf("%s: replay %q differs from the executed answer %q", k, a.body, winner)
				}
			}
			if a := p.send(k); !a.replayed || a.body != winner {
				t.Errorf("%s: later send got status %d replayed=%v body %q, want replay of %q", k, a.status, a.replayed, a.body, winner)
			}
		}
		t.Logf("%d keys x %d concurrent sends: %d executions, %d replays, %d conflicts (409)",
			len(keys), sends, len(keys), replays, conflicts)
	})

	// NOSCRIPT: a node that was restarted or promoted has an empty script
	// cache. After SCRIPT FLUSH on every node, claims, completions and
	// replays must still work (EVALSHA falls back to EVAL), on all masters.
	t.Run("NOSCRIPT after SCRIPT FLUSH", func(t *testing.T) {
		old := scaleKeys("noscript-old", 60)
		oldAnswers := p.sendAll(old, 4)
		c.FlushScripts()
		ctx := context.Background()
		before := map[string]int64{}
		for _, m := range c.Masters() {
			ex, err := scaleNodeClient(t, m).ScriptExists(ctx, scaleScriptHashes()...).Result()
			if err != nil || ex[0] || ex[1] {
				t.Fatalf("%s after SCRIPT FLUSH: exists=%v err=%v, want no scripts", m.Addr(), ex, err)
			}
			before[m.Addr()] = scaleNoScriptErrors(t, m)
		}
		fresh := p.sendAll(scaleKeys("noscript-new", 60), 4)
		for k, a := range fresh {
			if !scaleExecuted(a) || up.count(k) != 1 {
				t.Errorf("fresh %s after SCRIPT FLUSH: status %d replayed=%v err=%v, executed %d times; want 201 executed once",
					k, a.status, a.replayed, a.err, up.count(k))
			}
		}
		for k, a := range p.sendAll(old, 4) {
			if !a.replayed || a.body != oldAnswers[k].body || up.count(k) != 1 {
				t.Errorf("old %s after SCRIPT FLUSH: status %d replayed=%v err=%v, executed %d times; want a replay",
					k, a.status, a.replayed, a.err, up.count(k))
			}
		}
		for _, m := range c.Masters() {
			ex, err := scaleNodeClient(t, m).ScriptExists(ctx, scaleScriptHashes()...).Result()
			after := scaleNoScriptErrors(t, m)
			t.Logf("%s: NOSCRIPT errors %d -> %d, scripts cached again %v", m.Addr(), before[m.Addr()], after, ex)
			if err != nil || !ex[0] || !ex[1] || after <= before[m.Addr()] {
				t.Errorf("%s: scripts cached %v (err %v), NOSCRIPT %d -> %d; want the EVAL fallback to have run there",
					m.Addr(), ex, err, before[m.Addr()], after)
			}
		}
	})
}

// TestClusterWaitReplicas: with REDIS_WAIT_REPLICAS=1 on Cluster, WAIT goes
// to the master that ran the script (not a random node), so every claim and
// completion is acknowledged by that shard's replica before the answer.
func TestClusterWaitReplicas(t *testing.T) {
	c := redistest.StartCluster(t)
	up := newScaleUpstream(t)
	p := startScaleProxy(t, up.srv.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=2s")
	ctx := context.Background()
	waits := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range c.Masters() {
			info, err := scaleNodeClient(t, m).Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatalf("INFO commandstats on %s: %v", m.Addr(), err)
			}
			for line := range strings.SplitSeq(info, "\r\n") {
				if v, ok := strings.CutPrefix(line, "cmdstat_wait:calls="); ok {
					var n int64
					_, _ = fmt.Sscan(strings.SplitN(v, ",", 2)[0], &n)
					out[m.Addr()] = n
				}
			}
		}
		return out
	}
	noscript := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range c.Masters() {
			out[m.Addr()] = scaleNoScriptErrors(t, m)
		}
		return out
	}
	before, beforeNS := waits(), noscript()
	keys := scaleKeys("wait", 30)
	perMaster := map[string]int64{}
	for k, a := range p.sendAll(keys, 4) {
		if !scaleExecuted(a) || up.count(k) != 1 {
			t.Fatalf("%s: status %d err %v, executed %d times; want 201 once", k, a.status, a.err, up.count(k))
		}
		m := c.NodeForKey(scaleRedisKey(k))
		perMaster[m.Addr()] += 2 // one WAIT after the claim, one after the completion
		// Acknowledged means: the shard's replica has the completed record now.
		replica := redis.NewClient(&redis.Options{Addr: c.ReplicaOf(m).Addr(),
			OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
		st, err := replica.HGet(ctx, scaleRedisKey(k), "st").Result()
		_ = replica.Close()
		if err != nil || st != "c" {
			t.Errorf("%s: replica of %s has state %q (%v), want the completed record", k, m.Addr(), st, err)
		}
	}
	after, afterNS := waits(), noscript()
	for addr, want := range perMaster {
		// A script's first run on a node answers NOSCRIPT; the fallback
		// pipeline (EVAL + WAIT) sends one more WAIT.
		want += afterNS[addr] - beforeNS[addr]
		if got := after[addr] - before[addr]; got != want {
			t.Errorf("master %s ran WAIT %d times, want %d (2 per key it owns, plus one per NOSCRIPT fallback)", addr, got, want)
		}
	}
	for k, a := range p.sendAll(keys, 4) {
		if !a.replayed || up.count(k) != 1 {
			t.Errorf("%s: replayed=%v executed %d times; want a replay", k, a.replayed, up.count(k))
		}
	}
}

// scaleNoScriptErrors reads how many NOSCRIPT errors s has answered.
func scaleNoScriptErrors(t *testing.T, s *redistest.Server) int64 {
	info, err := scaleNodeClient(t, s).Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO errorstats on %s: %v", s.Addr(), err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "errorstat_NOSCRIPT:count="); ok {
			var n int64
			_, _ = fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// scaleLoad sends keyed requests from a few goroutines until stopped (or a
// per-goroutine cap is reached): repeats of keys that are already recorded,
// and fresh keys, each fresh key sent once. It counts what came back.
type scaleLoad struct {
	p       *scaleProxy
	repeats []string // recorded keys: must only ever replay
	bodies  map[string]string
	prefix  string

	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	fresh   map[string]scaleAnswer
	freshAt map[string]time.Time // when the fresh key was sent
	doneAt  map[string]time.Time // when its answer came back
	status  map[string]int       // "201", "201 replayed", "409", "503", "error", ...
	bad     []string
}

func startScaleLoad(p *scaleProxy, repeats []string, bodies map[string]string, prefix string, workers int) *scaleLoad {
	l := &scaleLoad{p: p, repeats: repeats, bodies: bodies, prefix: prefix + "-" + scaleNonce()[:6],
		stop: make(chan struct{}), fresh: map[string]scaleAnswer{}, freshAt: map[string]time.Time{}, doneAt: map[string]time.Time{},
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

func (l *scaleLoad) note(a scaleAnswer) {
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

func (l *scaleLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// settle resends every fresh key of the load until it is no longer in flight
// (a claim whose recording failed holds its key until LOCK_TTL) and returns
// the final answers.
func (l *scaleLoad) settle(timeout time.Duration) map[string]scaleAnswer {
	keys := make([]string, 0, len(l.fresh))
	for k := range l.fresh {
		keys = append(keys, k)
	}
	var mu sync.Mutex
	out := map[string]scaleAnswer{}
	ch := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range ch {
				a, _ := l.p.sendUntil(k, timeout, func(a scaleAnswer) bool { return a.err == nil && a.status == http.StatusCreated })
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

// TestClusterFailover kills one master of a 3-master cluster (SIGKILL) and
// checks that the proxy, without a restart, serves that shard again once a
// replica is promoted, and that no recorded key executes twice.
//
// What is guaranteed, and asserted: a key whose record was written AND
// replicated before the kill (the test waits until the replica's offset
// reaches the master's) survives the failover; its retries replay it and the
// upstream never runs it again. Keys on the other two shards are never at
// risk. What is not guaranteed: replication is asynchronous, so a record the
// killed master acknowledged in its last moments may be missing on the
// promoted replica, and that key may execute once more. Keys of the killed
// shard sent during the failover are therefore counted, not asserted.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t)
	up := newScaleUpstream(t)
	up.delay.Store(int64(5 * time.Millisecond))
	p := startScaleProxy(t, up.srv.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"LOCK_TTL=3s", "UPSTREAM_TIMEOUT=2s")
	ctx := context.Background()

	// Phase A: record keys on all shards.
	recorded := scaleKeys("before", 150)
	bodies := map[string]string{}
	for k, a := range p.sendAll(recorded, 8) {
		if !scaleExecuted(a) {
			t.Fatalf("%s before the kill: status %d err %v, want 201 executed", k, a.status, a.err)
		}
		bodies[k] = a.body
	}
	owner := map[string]*redistest.Server{}
	for _, k := range recorded {
		owner[k] = c.NodeForKey(scaleRedisKey(k))
	}
	victim := owner[recorded[0]]
	replica := c.ReplicaOf(victim)
	if replica == nil {
		t.Fatalf("master %s has no replica", victim.Addr())
	}
	var onVictim []string
	for _, k := range recorded {
		if owner[k] == victim {
			onVictim = append(onVictim, k)
		}
	}
	// The replica must hold every record before the kill, or the assertion
	// below would be about luck, not about the proxy.
	redistest.WaitReplicated(t, victim, replica, 10*time.Second)
	cached, err := scaleNodeClient(t, replica).ScriptExists(ctx, scaleScriptHashes()[0]).Result()
	if err != nil {
		t.Fatalf("SCRIPT EXISTS on replica: %v", err)
	}
	t.Logf("killing master %s (%d of %d recorded keys on its shard); replica %s has the claim script cached: %v",
		victim.Addr(), len(onVictim), len(recorded), replica.Addr(), cached[0])

	// Probe keys whose records hash to the victim's shard.
	var probes []string
	for _, k := range scaleKeys("probe", 200) {
		if c.NodeForKey(scaleRedisKey(k)) == victim {
			probes = append(probes, k)
		}
		if len(probes) == 10 {
			break
		}
	}

	load := startScaleLoad(p, recorded, bodies, "during", 4)
	time.Sleep(200 * time.Millisecond) // some load before the kill
	// Everything the victim acknowledged before this instant is on its
	// replica once WaitReplicated returns (it reads the master's offset first).
	replicatedAt := time.Now()
	redistest.WaitReplicated(t, victim, replica, 10*time.Second)
	killedAt := time.Now()
	c.KillMaster(victim)
	// /readyz checks every master: it must report the dead one (bounded
	// poll, since go-redis notices the failure on its next use).
	readyz := func() int {
		resp, err := http.Get("http://" + p.app.adminAddr.String() + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	sawNotReady := false
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !sawNotReady; time.Sleep(20 * time.Millisecond) {
		sawNotReady = readyz() == http.StatusServiceUnavailable
	}
	if !sawNotReady {
		t.Errorf("/readyz never reported the killed master within 2s")
	}
	c.WaitHealthy(30 * time.Second)
	clusterBack := time.Since(killedAt)
	readyBy := time.Now().Add(10 * time.Second)
	for readyz() != http.StatusOK {
		if time.Now().After(readyBy) {
			t.Errorf("/readyz not 200 within 10s of the cluster's recovery")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if role, _, err := redistest.Role(replica); err != nil || role != "master" {
		t.Fatalf("replica %s not promoted: ROLE %q %v", replica.Addr(), role, err)
	}
	// The proxy must serve the shard again without a restart, soon after the
	// cluster itself is healthy: 10 s is generous (the cluster client only
	// has to reload its slot map). Past the bound the test fails but keeps
	// waiting, up to 70 s, so that the invariants below are still checked.
	var recoveredAt time.Duration
	probe := probes[0]
	const recoveryBound = 10 * time.Second
	a, tries := p.sendUntil(probe, recoveryBound, scaleExecuted)
	if !scaleExecuted(a) {
		t.Errorf("the proxy still answers %d (%q) for keys of the failed-over shard %s after the cluster was healthy "+
			"(%s after the kill, %d tries): it keeps sending them to the dead master", a.status, a.body, recoveryBound,
			time.Since(killedAt).Round(time.Millisecond), tries)
		a, _ = p.sendUntil(probe, 70*time.Second-time.Since(killedAt), scaleExecuted)
		if !scaleExecuted(a) {
			load.finish()
			t.Fatalf("the proxy never served the failed-over shard again: last status %d err %v body %q", a.status, a.err, a.body)
		}
	}
	recoveredAt = time.Since(killedAt)
	time.Sleep(300 * time.Millisecond) // some load after recovery
	load.finish()

	// Phase C: after recovery every shard works and records.
	after := scaleKeys("after", 60)
	for k, a := range p.sendAll(append(after, probes[1:]...), 8) {
		if !scaleExecuted(a) {
			t.Errorf("%s after recovery: status %d err %v, want 201 executed", k, a.status, a.err)
		}
	}
	nowCached, _ := scaleNodeClient(t, replica).ScriptExists(ctx, scaleScriptHashes()[0]).Result()

	// Recorded-before keys: all replay, none executed again.
	for k, a := range p.sendAll(recorded, 8) {
		if a.err != nil || !a.replayed || a.body != bodies[k] {
			t.Errorf("recorded %s after failover: status %d replayed=%v err=%v body %q, want replay of %q",
				k, a.status, a.replayed, a.err, a.body, bodies[k])
		}
		if n := up.count(k); n != 1 {
			t.Errorf("recorded %s executed %d times, want 1", k, n)
		}
	}
	for _, b := range load.bad {
		t.Error(b)
	}
	// Fresh keys of the load. Safe, and asserted: keys of the two surviving
	// shards, keys answered before the replication checkpoint, keys sent
	// after the kill (nothing can reach the dead master any more). In the
	// window (victim's shard, answered after the checkpoint, sent before the
	// kill) a record acknowledged by the victim may be lost: counted. A
	// recording that failed (the proxy logs "not recorded") leaves the key in
	// flight until LOCK_TTL, after which it may execute again, as the
	// contract allows.
	final := load.settle(10 * time.Second)
	notRecorded := p.log.keyHashes("not recorded")
	var strict, window, lost int
	for k, first := range load.fresh {
		if f := final[k]; f.err != nil || f.status != http.StatusCreated {
			t.Errorf("fresh key %s: final status %d err %v", k, f.status, f.err)
			continue
		}
		n := up.count(k)
		onVictim := c.NodeForKey(scaleRedisKey(k)) == replica
		inWindow := onVictim && load.freshAt[k].Before(killedAt) && !(scaleExecuted(first) && load.doneAt[k].Before(replicatedAt))
		switch {
		case inWindow || notRecorded[scaleKeyHash(k)]:
			window++
			if n > 1 {
				lost++
			}
			if n > 2 {
				t.Errorf("window key %s executed %d times", k, n)
			}
		default:
			strict++
			if n != 1 {
				t.Errorf("fresh key %s (shard of the killed master: %v, sent %s after the kill, first answer %d replayed=%v) executed %d times, want 1",
					k, onVictim, load.freshAt[k].Sub(killedAt), first.status, first.replayed, n)
			}
		}
	}
	t.Logf("cluster healthy %s after the kill, proxy served the shard again after %s (no restart); promoted replica has the claim script cached now: %v",
		clusterBack.Round(time.Millisecond), recoveredAt.Round(time.Millisecond), nowCached)
	t.Logf("load: %v; %d fresh keys outside the loss window all executed once; %d in the window, %d of them executed again",
		load.status, strict, window, lost)
	if load.status["503"] == 0 {
		t.Logf("note: no request got 503 during the failover")
	}
}

// TestSentinelFailover runs the proxy with REDIS_MODE=sentinel against three
// sentinels, promotes the replica with SENTINEL FAILOVER while keyed requests
// flow, and checks that the proxy follows the new master without a restart
// and that keys recorded before the failover replay after it.
//
// Guaranteed, and asserted: a key whose answer was recorded before a moment
// at which the replica had caught up with the master (the test waits for the
// replica's offset to reach the master's, mid-load, just before the
// failover) is on the new master: it replays and never executes again. So
// is every key first sent after the proxy dropped its last connection to the
// old master.
//
// Not guaranteed, and counted: Sentinel promotes the replica first and
// tells clients afterwards (+switch-master), and demotes the old master only
// seconds later. Until then the old master still acknowledges the writes of
// clients that have not switched; they are discarded when it becomes a
// replica. A key recorded there in that window executes again on a retry.
// Only a WAIT for a replica after each write (the coming REDIS_WAIT_REPLICAS)
// or min-replicas-to-write on the data nodes can close that window.
func TestSentinelFailover(t *testing.T) {
	t0 := time.Now()
	s := redistest.StartSentinel(t)
	t.Logf("master, replica and 3 sentinels ready in %s", time.Since(t0).Round(time.Millisecond))
	oldMaster, replica := s.Master(), s.Replica()
	up := newScaleUpstream(t)
	up.delay.Store(int64(5 * time.Millisecond))
	p := startScaleProxy(t, up.srv.URL, "REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(s.Addrs(), ","),
		"REDIS_MASTER_NAME="+s.MasterName(), "LOCK_TTL=3s", "UPSTREAM_TIMEOUT=2s")
	ctx := context.Background()

	recorded := scaleKeys("before", 100)
	bodies := map[string]string{}
	for k, a := range p.sendAll(recorded, 8) {
		if !scaleExecuted(a) {
			t.Fatalf("%s before the failover: status %d err %v, want 201 executed", k, a.status, a.err)
		}
		bodies[k] = a.body
		if st, err := scaleNodeClient(t, oldMaster).HGet(ctx, scaleRedisKey(k), "st").Result(); err != nil || st != "c" {
			t.Fatalf("record of %s on master %s: st=%q err=%v", k, oldMaster.Addr(), st, err)
		}
	}

	load := startScaleLoad(p, recorded, bodies, "during", 4)
	time.Sleep(300 * time.Millisecond) // some load before the failover
	// Everything acknowledged before this instant is on the replica once
	// WaitReplicated returns (it reads the master's offset first).
	replicatedAt := time.Now()
	redistest.WaitReplicated(t, oldMaster, replica, 10*time.Second)
	failoverAt := time.Now()
	newMaster := s.Failover(20 * time.Second)
	promoted := time.Since(failoverAt)
	if newMaster != replica {
		t.Fatalf("new master %s, want the replica %s", newMaster.Addr(), replica.Addr())
	}
	// The proxy follows the new master: a fresh key executes and its record
	// is on the new master. Bound: 10 s after the sentinels agree.
	probe := scaleKeys("probe", 1)[0]
	a, tries := p.sendUntil(probe, 10*time.Second, func(a scaleAnswer) bool {
		if !scaleExecuted(a) {
			return false
		}
		st, _ := scaleNodeClient(t, newMaster).HGet(ctx, scaleRedisKey(probe), "st").Result()
		return st == "c"
	})
	if !scaleExecuted(a) {
		load.finish()
		t.Fatalf("the proxy does not write to the new master %s %s after the failover (%d tries): status %d err %v body %q",
			newMaster.Addr(), time.Since(failoverAt), tries, a.status, a.err, a.body)
	}
	followed := time.Since(failoverAt)
	// The proxy has switched once it holds no connection to the old master:
	// go-redis closes them on +switch-master, and every new connection asks
	// the sentinels, which all name the new master by now. From then on no
	// write can reach the old master (Sentinel demotes it only ~15 s later).
	var switchedAt time.Time
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Twice in a row, 20 ms apart, so that a connection being dialled at
		// the first look has shown up by the second.
		n := scaleForeignConns(t, oldMaster)
		if n == 0 && switchedAt.IsZero() {
			switchedAt = time.Now()
		} else if n == 0 {
			break
		} else {
			switchedAt = time.Time{}
		}
		if time.Now().After(deadline) {
			load.finish()
			t.Fatalf("the proxy still holds %d connections to the old master %s %s after the failover", n, oldMaster.Addr(), time.Since(failoverAt))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // some load after
	load.finish()

	// After the failover: new keys execute once, are recorded on the new
	// master, and replay.
	after := scaleKeys("after", 50)
	afterAnswers := p.sendAll(after, 8)
	for k, a := range afterAnswers {
		st, err := scaleNodeClient(t, newMaster).HGet(ctx, scaleRedisKey(k), "st").Result()
		if !scaleExecuted(a) || err != nil || st != "c" {
			t.Errorf("%s after the failover: status %d err %v; record on new master st=%q err=%v", k, a.status, a.err, st, err)
		}
	}
	for k, a := range p.sendAll(after, 8) {
		if !a.replayed || a.body != afterAnswers[k].body || up.count(k) != 1 {
			t.Errorf("%s resent after the failover: status %d replayed=%v executed %d times, want a replay", k, a.status, a.replayed, up.count(k))
		}
	}
	// Recorded and replicated before the failover: replay, never re-execute.
	for k, a := range p.sendAll(recorded, 8) {
		if a.err != nil || !a.replayed || a.body != bodies[k] {
			t.Errorf("recorded %s after failover: status %d replayed=%v err=%v body %q, want replay of %q",
				k, a.status, a.replayed, a.err, a.body, bodies[k])
		}
		if n := up.count(k); n != 1 {
			t.Errorf("recorded %s executed %d times, want 1", k, n)
		}
	}
	for _, b := range load.bad {
		t.Error(b)
	}
	final := load.settle(10 * time.Second)
	var strict, window int
	var again []string
	for k, first := range load.fresh {
		if f := final[k]; f.err != nil || f.status != http.StatusCreated {
			t.Errorf("fresh key %s: final status %d err %v", k, f.status, f.err)
		}
		n := up.count(k)
		safe := (scaleExecuted(first) && load.doneAt[k].Before(replicatedAt)) || load.freshAt[k].After(switchedAt)
		switch {
		case safe:
			strict++
			if n != 1 {
				t.Errorf("fresh key %s (sent %s after the failover began, answered %d) executed %d times, want 1",
					k, load.freshAt[k].Sub(failoverAt), first.status, n)
			}
		default:
			window++
			if n > 1 {
				again = append(again, k)
			}
			if n > 2 {
				t.Errorf("window key %s executed %d times", k, n)
			}
		}
	}
	// The cause of each re-execution: the first record went to the old
	// master, which has not been demoted yet, so it still holds it.
	onOld := 0
	if role, _, err := redistest.Role(oldMaster); err == nil && role == "master" {
		for _, k := range again {
			// "c": completed there; "i": claimed there, and the completion
			// reached the new master, which had no claim (the proxy logs it).
			st, _ := scaleNodeClient(t, oldMaster).HGet(ctx, scaleRedisKey(k), "st").Result()
			switch {
			case st == "c":
				onOld++
			case st == "i" && p.log.keyHashes("answer not recorded: the claim was no longer in Redis")[scaleKeyHash(k)]:
				onOld++
			default:
				t.Logf("%s executed again; on the old master st=%q", k, st)
			}
		}
		if role, _, err := redistest.Role(oldMaster); err == nil && role == "master" && onOld != len(again) {
			t.Errorf("%d keys executed again, but only %d have a record on the old master", len(again), onOld)
		}
	}
	t.Logf("replica promoted %s after SENTINEL FAILOVER; proxy wrote to the new master %s after it and dropped its last connection to the old one after %s (no restart)",
		promoted.Round(time.Millisecond), followed.Round(time.Millisecond), switchedAt.Sub(failoverAt).Round(time.Millisecond))
	t.Logf("load: %v; %d fresh keys outside the loss window all executed once; %d keys sent in the window, %d of them executed again "+
		"(%d of those have their first record on the old master, which the failover discards)",
		load.status, strict, window, len(again), onOld)
}

// scaleClientName names the test's own connections to Redis nodes.
const scaleClientName = "idemproxy-test"

// scaleForeignConns counts the client connections of s that are neither the
// test's (named), a sentinel's (named sentinel-...), a replication link, nor
// the one asking: in these tests, the proxy's.
func scaleForeignConns(t *testing.T, s *redistest.Server) int {
	list, err := scaleNodeClient(t, s).ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST on %s: %v", s.Addr(), err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		f := map[string]string{}
		for kv := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		if f["name"] != "" || strings.ContainsAny(f["flags"], "SM") || f["cmd"] == "client|list" {
			continue
		}
		n++
	}
	return n
}
