package claim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// watched is a gated Store whose WatchPurges runs until the test ends.
type watched struct {
	t       *testing.T
	s       *claim.Store
	rdb     redis.UniversalClient
	hits    atomic.Int64
	reports chan error

	mu  sync.Mutex
	all []error // every report, in order
}

func watchFor(t *testing.T, rdb redis.UniversalClient, prefix string) *watched {
	t.Helper()
	w := &watched{t: t, rdb: rdb, reports: make(chan error, 256)}
	w.s = claim.NewStore(rdb, prefix, func(e claim.Event) {
		if e.Op == claim.OpCacheHit {
			w.hits.Add(1)
		}
	}, claim.ReplayCache(1<<20, time.Hour), claim.CacheAfterSubscribed())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.s.WatchPurges(ctx, rdb, func(err error) {
			w.mu.Lock()
			w.all = append(w.all, err)
			w.mu.Unlock()
			select {
			case w.reports <- err:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("WatchPurges did not return within 5 s of its context's end")
		}
	})
	return w
}

// next waits for the next report.
func (w *watched) next(within time.Duration, what string) error {
	w.t.Helper()
	select {
	case err := <-w.reports:
		return err
	case <-time.After(within):
		w.t.Fatalf("no report within %v (%s); reports so far: %v", within, what, w.reported())
		return nil
	}
}

// until waits for a report matching want (nil: a confirmation).
func (w *watched) until(within time.Duration, confirmed bool, what string) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			w.t.Fatalf("%s: not reported within %v; reports: %v", what, within, w.reported())
		}
		err := w.next(left, what)
		if (err == nil) == confirmed {
			return
		}
	}
}

func (w *watched) reported() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.all...)
}

// complete records key k (fingerprint "f") and replays it twice: from Redis,
// then (the cache being on) from the cache.
func (w *watched) complete(ctx context.Context, k claim.Key) {
	w.t.Helper()
	completed(w.t, w.s, k)
	if _, rec, err := w.s.Acquire(ctx, k, fp("f"), watchTerms); rec == nil || err != nil {
		w.t.Fatalf("replay from Redis: %v %v", rec, err)
	}
}

// watchTerms are the terms every claim of these tests is made with.
var watchTerms = claim.Terms{LockTTL: time.Minute, TTL: time.Hour}

// completed claims k on s (fingerprint "f") and records a 201 for it.
func completed(t *testing.T, s *claim.Store, k claim.Key) {
	t.Helper()
	ctx := context.Background()
	lease, _, err := s.Acquire(ctx, k, fp("f"), watchTerms)
	if err != nil || lease == nil {
		t.Fatalf("Acquire %v: lease %v, err %v", k, lease, err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// fromCache reports whether a replay of k is answered from the cache.
func (w *watched) fromCache(ctx context.Context, k claim.Key) (bool, *claim.Record, error) {
	before := w.hits.Load()
	_, rec, err := w.s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	return w.hits.Load() > before, rec, err
}

// purgeHeard fails t unless k, just purged, stops being replayed within
// 1 s: the purge reached this Store's cache (where tells where it was
// published, for the message).
func (w *watched) purgeHeard(ctx context.Context, k claim.Key, where string) {
	w.t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		hit, rec, _ := w.fromCache(ctx, k)
		if !hit && rec == nil {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("1 s after the purge %sthe replay still comes back (hit %v); reports %v", where, hit, w.reported())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// idleWatch: once confirmed, an idle subscription (no purge for five probe
// periods) must neither be reported as failed nor turn the cache off.
func idleWatch(t *testing.T, rdb redis.UniversalClient, srv *redistest.Server) {
	ctx := context.Background()
	w := watchFor(t, rdb, "idle:")
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v, want the confirmation", err)
	}
	subscriber := func() string { // the subscribed connection's id: a silent re-subscription changes it
		if srv == nil {
			return ""
		}
		l, err := srv.Client().ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(l, "\n") {
			if strings.Contains(line, "sub=1") {
				id, _, _ := strings.Cut(line, " ")
				return id
			}
		}
		return "none"
	}
	before := subscriber()
	k := claim.NewKey(nil, "idle")
	w.complete(ctx, k)
	if hit, _, err := w.fromCache(ctx, k); !hit || err != nil {
		t.Fatalf("right after confirmation: cache hit %v, err %v", hit, err)
	}
	select {
	case err := <-w.reports:
		t.Fatalf("the idle subscription was reported %v (reports %v): the cache flapped off", err, w.reported())
	case <-time.After(5*claim.PurgeProbeEvery() + time.Second): // probes answered, none missed
	}
	if hit, _, err := w.fromCache(ctx, k); !hit || err != nil {
		t.Errorf("after five probe periods of idleness the cache no longer answers (hit %v, err %v); reports: %v", hit, err, w.reported())
	}
	if after := subscriber(); after != before {
		t.Errorf("the subscribed connection changed during idleness: %s -> %s (a silent re-subscription)", before, after)
	}
}

func TestWatchIdleMiniredis(t *testing.T) {
	t.Parallel()
	mr := miniredis.NewMiniRedis()
	mr.RequireAuth("pw") // as startEmbedded
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), Password: "pw"})
	defer rdb.Close()
	idleWatch(t, rdb, nil)
}

func TestWatchIdleRealRESP3(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	idleWatch(t, rdb, srv)
}

func TestWatchIdleRealRESP2(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	idleWatch(t, rdb, srv)
}

// TestWatchRestart: a Redis restart turns the cache off at once and back
// on (from empty) once Redis is back; the reports are few.
func TestWatchRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	k := claim.NewKey(nil, "restart")
	w := confirmedAndCached(t, rdb, "rs:", k)
	srv.Kill()
	w.until(5*time.Second, false, "the lost subscription")
	// Unreachable is unverified: a replica cut off from Redis could not
	// hear a purge made from elsewhere, so the cache is off.
	if hit, rec, err := w.fromCache(ctx, k); hit || rec != nil {
		t.Errorf("with Redis down the cache still answers: hit %v rec %v err %v", hit, rec, err)
	}
	time.Sleep(2 * time.Second) // a few attempts while it is down
	srv.Restart()
	w.until(20*time.Second, true, "the confirmation after the restart")
	// Confirmed again: the cache starts empty. Redis restarted empty, so
	// the key is claimed afresh.
	if hit, rec, err := w.fromCache(ctx, k); hit || rec != nil {
		t.Errorf("after the restart and the confirmation, the cache still answers: hit %v rec %v err %v", hit, rec, err)
	}
	// Another key: a purge of k now (its fresh claim) would be heard while
	// the replay below is read, and an eviction drops a put that races it.
	k = claim.NewKey(nil, "restart-2")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Errorf("after the restart and the confirmation, the cache does not answer; reports %v", w.reported())
	}
	// A purge now is heard.
	if ok, err := claim.NewInspector(rdb, "rs:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge %v %v", ok, err)
	}
	w.purgeHeard(ctx, k, "")
	t.Logf("reports: %v", w.reported())
	if n := len(w.reported()); n > 6 {
		t.Errorf("%d reports for one restart: %v", n, w.reported())
	}
}

// TestWatchSentinelFailover: after SENTINEL FAILOVER the subscription
// is on the new master, the cache comes back on, and a purge through the
// failover client reaches it.
func TestWatchSentinelFailover(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sn.MasterName(), SentinelAddrs: sn.Addrs(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	k := claim.NewKey(nil, "failover")
	w := confirmedAndCached(t, rdb, "sn:", k)
	old := sn.Master()
	nm := sn.Failover(20 * time.Second)
	t.Logf("failover %s -> %s", old.Addr(), nm.Addr())
	w.until(20*time.Second, false, "the subscription on the demoted master ends")
	w.until(20*time.Second, true, "a new subscription is confirmed")
	n, err := nm.Client().PubSubNumSub(ctx, claim.PurgeChannel("sn:")).Result()
	if err != nil || n[claim.PurgeChannel("sn:")] != 1 {
		t.Errorf("subscribers on the new master %s: %v (%v), want 1", nm.Addr(), n, err)
	}
	k2 := claim.NewKey(nil, "after")
	var lastErr error
	for range 50 { // the proxy's command client may take a moment to switch
		terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
		lease, _, err := w.s.Acquire(ctx, k2, fp("f"), terms)
		if err == nil {
			lastErr = lease.Complete(ctx, &claim.Record{Status: 201}, time.Hour)
			if lastErr == nil {
				break
			}
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	if _, rec, err := w.s.Acquire(ctx, k2, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); rec == nil {
		t.Fatalf("replay after failover: %v (%v)", err, lastErr)
	}
	if hit, _, _ := w.fromCache(ctx, k2); !hit {
		t.Fatalf("cache not on after the failover; reports %v", w.reported())
	}
	if ok, err := claim.NewInspector(rdb, "sn:").Purge(ctx, k2); !ok || err != nil {
		t.Fatalf("Purge %v %v", ok, err)
	}
	w.purgeHeard(ctx, k2, "on the new master ")
}

// clusterWatchCached starts a Redis Cluster and watches purges on it under
// prefix until the first confirmation; it then records the key named key
// and has it answered from the replay cache, and returns the node the
// subscription is on.
func clusterWatchCached(t *testing.T, prefix, key string) (*redistest.Cluster, *watched, claim.Key, *redistest.Server) {
	t.Helper()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: 1, DialerRetries: 1, ClusterStateReloadInterval: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	w := watchFor(t, rdb, prefix)
	if err := w.next(15*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	var on *redistest.Server
	for _, n := range cl.Nodes() {
		m, err := n.Client().PubSubNumSub(ctx, claim.PurgeChannel(prefix)).Result()
		if err == nil && m[claim.PurgeChannel(prefix)] == 1 {
			on = n
		}
	}
	if on == nil {
		t.Fatal("no node has the subscription")
	}
	k := claim.NewKey(nil, key)
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit")
	}
	return cl, w, k, on
}

// TestWatchClusterNodeKilled: the node the subscription is on is killed;
// the cache goes off at once, comes back on after the cluster failed over,
// and a purge is then heard.
func TestWatchClusterNodeKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, w, k, on := clusterWatchCached(t, "cl:", "cluster")
	if role, _, _ := redistest.Role(on); role != "master" {
		t.Skipf("the subscription is on a %s", role)
	}
	cl.KillMaster(on)
	w.until(5*time.Second, false, "the lost subscription")
	if hit, _, _ := w.fromCache(ctx, k); hit {
		t.Error("the cache answers with the subscription's node dead")
	}
	start := time.Now()
	w.until(40*time.Second, true, "a new subscription is confirmed")
	t.Logf("cache back on %v after the kill; reports %v", time.Since(start), w.reported())
}

// TestWatchSentinelSwitchLeavesSubscriptionOnOldMaster: Sentinel
// switches the master while it cannot reconfigure the old one (here its
// REPLICAOF is refused to the sentinels, as in a partition between the
// sentinels and the old master, which the proxy still reaches). go-redis
// moves the proxy's commands to the new master (it closes the pooled
// connections to the old address on +switch-master), but not the purge
// subscription: it stays on the old master, which still answers PING and
// never sees a PUBLISH made on the new one. The cache stays on, and a purge
// through the current master is never heard.
func TestWatchSentinelSwitchLeavesSubscriptionOnOldMaster(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t)
	ctx := context.Background()
	old, replica := sn.Master(), sn.Replica()
	for _, n := range []*redistest.Server{old, replica} {
		if err := n.Client().Do(ctx, "ACL", "SETUSER", "proxy", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sn.MasterName(), SentinelAddrs: sn.Addrs(),
		Username: "proxy", Password: "pw", MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	w := watchFor(t, rdb, "sw:")
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	k := claim.NewKey(nil, "switch")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit before the switch")
	}
	redistest.WaitReplicated(t, old, replica, 10*time.Second)
	// The sentinels can no longer turn the old master into a replica.
	if err := old.Client().Do(ctx, "ACL", "SETUSER", "default", "-slaveof", "-replicaof").Err(); err != nil {
		t.Fatal(err)
	}
	nm := sn.Failover(20 * time.Second)
	t.Logf("switch %s -> %s", old.Addr(), nm.Addr())
	// Wait for the proxy's client to follow the switch: its commands reach
	// the new master.
	deadline := time.Now().Add(15 * time.Second)
	for {
		id, err := rdb.ConfigGet(ctx, "port").Result()
		if err == nil && "127.0.0.1:"+id["port"] == nm.Addr() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the failover client still talks to %v (%v)", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, err := claim.NewInspector(rdb, "sw:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge on the new master: %v %v", ok, err)
	}
	purged := time.Now()
	for {
		hit, rec, _ := w.fromCache(ctx, k)
		if !hit && rec == nil {
			break
		}
		if time.Since(purged) > 2*claim.PurgeProbeEvery()+5*time.Second { // two probe periods, and a margin
			oldSubs, _ := old.Client().PubSubNumSub(ctx, claim.PurgeChannel("sw:")).Result()
			newSubs, _ := nm.Client().PubSubNumSub(ctx, claim.PurgeChannel("sw:")).Result()
			role, _, _ := redistest.Role(old)
			t.Fatalf("%v after the purge on the current master %s the purged record is still replayed from the cache (hit %v): "+
				"the purge subscription is still on the old master %s (ROLE %s, subscribers %v; new master's %v); reports %v",
				time.Since(purged).Round(time.Second), nm.Addr(), hit, old.Addr(), role, oldSubs, newSubs, w.reported())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchPurgeWhileOff: the subscription is dropped (CLIENT KILL TYPE
// pubsub), the key is purged while the cache is off, and Acquires race the
// cache's return: none of them may bring the purged record back.
func TestWatchPurgeWhileOff(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	k := claim.NewKey(nil, "off")
	w := confirmedAndCached(t, rdb, "off:", k)
	// Readers hammer k throughout.
	stop := make(chan struct{})
	var purgedAt atomic.Int64
	var bad atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 200000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, rec, err := w.s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if p := purgedAt.Load(); p != 0 && rec != nil && err == nil && time.Now().UnixNano() > p {
					bad.Store(rec)
				}
			}
		})
	}
	if err := srv.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	w.until(5*time.Second, false, "the killed subscription")
	// The purge, while the cache is off (the new subscription waits 1 s).
	if ok, err := claim.NewInspector(srv.Client(), "off:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge %v %v", ok, err)
	}
	purgedAt.Store(time.Now().Add(50 * time.Millisecond).UnixNano())
	w.until(10*time.Second, true, "the new confirmation")
	time.Sleep(200 * time.Millisecond) // readers run past the confirmation
	close(stop)
	wg.Wait()
	if rec := bad.Load(); rec != nil {
		t.Errorf("the record purged while the cache was off came back: %v", rec)
	}
	if hit, rec, _ := w.fromCache(ctx, k); hit || rec != nil {
		t.Errorf("after the cache is on again: hit %v rec %v, want a fresh claim", hit, rec)
	}
}

// TestWatchClusterManualFailover: CLUSTER FAILOVER demotes the master
// the subscription is on; it stays in the cluster, so a purge published
// anywhere still reaches the subscription (or the cache goes off).
func TestWatchClusterManualFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, w, k, on := clusterWatchCached(t, "mf:", "manual")
	rep := cl.ReplicaOf(on)
	// A manual failover is refused (silently, after a while) by a replica
	// that is not in sync: wait for it, and ask again if the first one
	// lapsed on a loaded machine.
	redistest.WaitReplicated(t, on, rep, 15*time.Second)
	demoted := false
	for attempt := 0; attempt < 3 && !demoted; attempt++ {
		if err := rep.Client().Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !demoted && time.Now().Before(deadline) {
			if role, _, _ := redistest.Role(on); role == "slave" {
				demoted = true
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !demoted {
		t.Fatal("not demoted after three CLUSTER FAILOVERs of 10 s each")
	}
	cl.WaitHealthy(15 * time.Second)
	if ok, err := claim.NewInspector(w.rdb, "mf:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge %v %v", ok, err)
	}
	w.purgeHeard(ctx, k, "")
	t.Logf("reports %v", w.reported())
}

// TestWatchOwnDeadlineWhilePublishBlocks: follow bounds the probe's PUBLISH
// with a 2 s context (probePublishWait), but the proxy's clients are built
// without ContextTimeoutEnabled (openRedis sets it only for `keys
// --timeout`), and go-redis then ignores a context's deadline on the
// socket: a PUBLISH into a partition waits for the client's ReadTimeout.
// That is REDIS_WAIT_TIMEOUT + 1 s with REDIS_WAIT_REPLICAS (15 s -> 16 s
// here, as waitReadTimeout computes), or REDIS_URL's read_timeout=. While
// follow waits, the cache goes on serving: a replica cut off from Redis
// replays a record an operator purged elsewhere for probe period +
// ReadTimeout (10 s + 16 s in production), not the README's "within 20 s".
func TestWatchOwnDeadlineWhilePublishBlocks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := partStartRelay(t, srv.Addr())
	// What openRedis builds for REDIS_URL with REDIS_WAIT_REPLICAS=1,
	// REDIS_WAIT_TIMEOUT=15s: MaxRetries 1, DialerRetries 1, ReadTimeout
	// max(5s, 15s+1s), no ContextTimeoutEnabled.
	rdb := redis.NewClient(&redis.Options{Addr: relay.Addr(), MaxRetries: 1, DialerRetries: 1, ReadTimeout: 16 * time.Second})
	defer rdb.Close()
	k := claim.NewKey(nil, "bound")
	w := confirmedAndCached(t, rdb, "boundp:", k)

	relay.freeze(true, true) // this replica is cut off; the operator is not
	if ok, err := claim.NewInspector(srv.Client(), "boundp:").Purge(context.Background(), k); !ok || err != nil {
		t.Fatalf("purge from the operator's host: %v %v", ok, err)
	}
	// One probe period until the probe is due, 2 s for its PUBLISH
	// (probePublishWait), and margin.
	window := 2*claim.PurgeProbeEvery() + 5*time.Second
	if d, still := partStillReplayed(w, k, window); still {
		t.Errorf("cut off from Redis, the replica still replays a record purged %v ago from its cache: the probe's PUBLISH, "+
			"meant to give up after 2 s, waits for the client's ReadTimeout (16 s) because go-redis ignores the context's deadline "+
			"without ContextTimeoutEnabled; reports: %v", d.Round(time.Millisecond), w.reported())
	}
}

// TestWatchNoLeakAcrossCycles: twelve subscriptions killed in turn
// (CLIENT KILL TYPE pubsub); each is followed by a new confirmation. Neither
// the process's goroutines nor Redis's client connections may grow with the
// number of cycles.
func TestWatchNoLeakAcrossCycles(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	defer admin.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	w := watchFor(t, rdb, "leak:")
	w.until(10*time.Second, true, "the first confirmation")
	clients := func() int {
		n, err := admin.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(n, "\r\n") {
			if v, ok := strings.CutPrefix(l, "connected_clients:"); ok {
				x, _ := strconv.Atoi(v)
				return x
			}
		}
		return -1
	}
	settle := func() (int, int) {
		var g, c int
		for range 20 { // the background Close of the last PubSub may still be running
			runtime.GC()
			g, c = runtime.NumGoroutine(), clients()
			time.Sleep(50 * time.Millisecond)
			if g2, c2 := runtime.NumGoroutine(), clients(); g2 == g && c2 == c {
				break
			}
		}
		return g, c
	}
	g0, c0 := settle()
	for i := range 12 {
		if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		w.until(10*time.Second, false, "the killed subscription")
		w.until(10*time.Second, true, "confirmation after kill "+strconv.Itoa(i))
	}
	g1, c1 := settle()
	t.Logf("goroutines %d -> %d, Redis clients %d -> %d", g0, g1, c0, c1)
	if g1 > g0+3 || c1 > c0+1 {
		t.Errorf("after 12 cycles: goroutines %d -> %d, Redis clients %d -> %d", g0, g1, c0, c1)
	}
}

// TestWatchOwnDeadlineWhileRedialing: README "turned off as soon as
// the subscription fails: ... its connection closes". When the Pub/Sub
// connection is closed, go-redis's PubSub redials and re-handshakes inside
// the same ReceiveTimeout call (releaseConn -> reconnect), synchronously,
// before it returns the EOF; follow sees the failure only then, and the
// cache answers meanwhile: for the dial or handshake timeout, i.e. the
// client's ReadTimeout (16 s with REDIS_WAIT_TIMEOUT=15s, or REDIS_URL's
// read_timeout=). A purge made meanwhile by an operator who can reach Redis
// is not heard, and the record is replayed.
func TestWatchOwnDeadlineWhileRedialing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := partStartRelay(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: relay.Addr(), MaxRetries: 1, DialerRetries: 1, ReadTimeout: 16 * time.Second})
	defer rdb.Close()
	defer relay.close() // before the watch is stopped: lets go-redis's hung redial end
	k := claim.NewKey(nil, "closed")
	w := confirmedAndCached(t, rdb, "boundc:", k)

	relay.cut() // the subscription's connection is closed, and this replica's path to Redis goes dark
	if ok, err := claim.NewInspector(srv.Client(), "boundc:").Purge(context.Background(), k); !ok || err != nil {
		t.Fatalf("purge from the operator's host: %v %v", ok, err)
	}
	if d, still := partStillReplayed(w, k, 5*time.Second); still {
		t.Errorf("the subscription's connection was closed, and %v later the purged record is still replayed from the cache "+
			"(go-redis redials inside ReceiveTimeout before reporting the close); reports: %v", d.Round(time.Millisecond), w.reported())
	}
}

// TestPurgeIfState: PurgeIf deletes a record only in the state asked for,
// and reports the state it found otherwise, deleting nothing.
func TestPurgeIfState(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")
	// What PurgeIf announces to the replicas' replay caches, in order.
	sub := rdb.Subscribe(ctx, claim.PurgeChannel("t:"))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}

	done := claim.NewKey(nil, "done")
	completed(t, s, done)
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateInFlight); !errors.Is(err, claim.ErrStateDiffers) || deleted || st != claim.StateCompleted {
		t.Errorf("completed, --state in_flight: %q %v %v; want completed, nothing deleted, ErrStateDiffers", st, deleted, err)
	}
	if _, rec, err := s.Acquire(ctx, done, fp("f"), watchTerms); rec == nil || err != nil {
		t.Fatalf("after the refused purge the record must still replay: %v %v", rec, err)
	}
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateCompleted); err != nil || !deleted || st != claim.StateCompleted {
		t.Errorf("completed, --state completed: %q %v %v; want it deleted", st, deleted, err)
	}
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateCompleted); !errors.Is(err, claim.ErrStateDiffers) || deleted || st != "" {
		t.Errorf("no record: %q %v %v; want \"\", nothing deleted, ErrStateDiffers", st, deleted, err)
	}

	flying := claim.NewKey(nil, "flying")
	// A lock long enough that a stalled test goroutine still finds it live.
	const flyingLock = time.Second
	if lease, _, err := s.Acquire(ctx, flying, fp("f"), claim.Terms{LockTTL: flyingLock, TTL: time.Hour}); lease == nil || err != nil {
		t.Fatalf("claim: %v %v", lease, err)
	}
	lockEnded := time.Now().Add(flyingLock + 100*time.Millisecond) // on any clock of this host
	// Live: its lock runs. Refused.
	if st, deleted, err := in.PurgeIf(ctx, flying, claim.StateInFlight); !errors.Is(err, claim.ErrClaimLive) || deleted || st != claim.StateInFlight {
		t.Errorf("in flight with its lock running, --state in_flight: %q %v %v; want ErrClaimLive, nothing deleted", st, deleted, err)
	}
	// Abandoned once the lock expired on Redis's clock (a refusal until
	// then deletes and announces nothing).
	var (
		st      claim.State
		deleted bool
		err     error
	)
	for {
		called := time.Now()
		st, deleted, err = in.PurgeIf(ctx, flying, claim.StateInFlight)
		if !errors.Is(err, claim.ErrClaimLive) {
			break
		}
		// Refused after the lock ended: no stall explains that.
		if called.After(lockEnded) {
			t.Fatalf("PurgeIf called %v after the claim's %v lock ended: %v; want the abandoned claim deleted", called.Sub(lockEnded), flyingLock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || !deleted || st != claim.StateInFlight {
		t.Errorf("abandoned, --state in_flight: %q %v %v; want it deleted", st, deleted, err)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("t:", flying)).Result(); n != 0 {
		t.Errorf("the purged in-flight record is still there")
	}
	// Announced: the two deletions; not the refusals, the one that found no
	// record included (keys forget announces again; Announce).
	want := []string{done.String(), flying.String()}
	var got []string
	for range want {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := sub.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			break
		}
		got = append(got, m.Payload)
	}
	if !slices.Equal(got, want) {
		t.Errorf("announced %q, want %q (done and flying deleted)", got, want)
	}
}

// TestPurgeIfRacesCompletion: an operator purges an abandoned key (its lock
// expired) with --state in_flight while its late request completes after
// all. Whatever the order, a completion that succeeded leaves a record:
// either the purge came first (the completion then records all the same,
// Recreated) or it found the key completed and deleted nothing. A purge
// that read "in flight" and then deleted the completed record would make
// the next retry execute again.
func TestPurgeIfRacesCompletion(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")
	deadline := time.Now().Add(20 * time.Second)
	outcomes := map[string]int{}
	for i := 0; i < 300 && time.Now().Before(deadline); i++ {
		k := claim.NewKey(nil, fmt.Sprintf("race-%d", i))
		lease, _, err := s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: 2 * time.Millisecond, TTL: time.Hour})
		if err != nil || lease == nil {
			t.Fatalf("claim %d: %v %v", i, lease, err)
		}
		time.Sleep(3 * time.Millisecond) // past the lock (Redis's clock; purges refused on a live one retry below)
		// Staggered by up to 1 ms either way, so that every interleaving
		// comes up: completion first, purge first, and the completion
		// landing between the purge's read and its delete.
		stagger := time.Duration(rand.IntN(1000)) * time.Microsecond
		completeErr := make(chan error, 1)
		go func() {
			if i%2 == 0 {
				time.Sleep(stagger)
			}
			completeErr <- lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour)
		}()
		if i%2 == 1 {
			time.Sleep(stagger)
		}
		_, deleted, perr := in.PurgeIf(ctx, k, claim.StateInFlight)
		if errors.Is(perr, claim.ErrClaimLive) {
			outcomes["lock not yet expired"]++
		} else if perr != nil && !errors.Is(perr, claim.ErrStateDiffers) {
			t.Fatalf("purge %d: %v", i, perr)
		}
		if err := <-completeErr; err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		switch {
		case deleted && lease.Recreated:
			outcomes["purge first"]++
		case deleted:
			outcomes["purged a completed record"]++
		default:
			outcomes["completion first"]++
		}
		if n, _ := rdb.Exists(ctx, claim.RecordKey("t:", k)).Result(); n != 1 {
			t.Fatalf("iteration %d: the completion succeeded (recreated %v) and the purge deleted %v, but no record is left: the next retry executes again (outcomes so far %v)",
				i, lease.Recreated, deleted, outcomes)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestPurgeIfInFlightSparesTakeover: `keys purge --state in_flight` deletes
// an abandoned claim only. An operator sees one (in flight, its lock
// expired); before the purge, a retry takes the key over: the record is a
// live claim, still in flight, whose request is executing. PurgeIf must not
// delete it, or the next retry executes beside the running one. (Before the fix:
// the state alone was compared.)
func TestPurgeIfInFlightSparesTakeover(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, str := range []bool{false, true} {
		s := claim.NewStore(rdb, "t:", nil, claim.StringRecords(str))
		in := claim.NewInspector(rdb, "t:")
		k := claim.NewKey(nil, "abandoned-"+map[bool]string{false: "hash", true: "string"}[str])
		short := claim.Terms{LockTTL: 50 * time.Millisecond, TTL: time.Hour}
		if l, _, err := s.Acquire(ctx, k, fp("f"), short); err != nil || l == nil {
			t.Fatalf("first claim: %v %v", l, err)
		}
		time.Sleep(120 * time.Millisecond) // its request died; the lock expired
		seen, err := in.Get(ctx, k)
		if err != nil || seen.State != claim.StateInFlight || !seen.LockExpiresAt.Before(time.Now()) {
			t.Fatalf("operator's look: %+v %v", seen, err)
		}
		// A retry takes the key over: a live claim, executing now.
		live, _, err := s.Acquire(ctx, k, fp("f"), watchTerms)
		if err != nil || live == nil {
			t.Fatalf("takeover: %v %v", live, err)
		}
		now, _ := in.Get(ctx, k)
		_, deleted, err := in.PurgeIf(ctx, k, claim.StateInFlight)
		if !deleted && !errors.Is(err, claim.ErrClaimLive) {
			t.Errorf("string=%v: PurgeIf(in_flight) of a live claim: %v, want ErrClaimLive", str, err)
		}
		if deleted {
			third, _, _ := s.Acquire(ctx, k, fp("f"), watchTerms)
			t.Errorf("string=%v: PurgeIf(in_flight) deleted a live claim taken over after the operator looked "+
				"(seen claimed_at %v lock_expires_at %v; deleted claimed_at %v lock_expires_at %v, err %v); "+
				"the next retry claims it again (lease %v) and executes beside the running request",
				str, seen.ClaimedAt, seen.LockExpiresAt, now.ClaimedAt, now.LockExpiresAt, err, third != nil)
		}
	}
}

// partRelay forwards TCP connections to target. freeze(all, sub): with all,
// no connection carries bytes any more; with sub, the connections that sent
// SUBSCRIBE do not. Nothing is closed (a partition, not a reset).
type partRelay struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	cond      *sync.Cond
	frozenAll bool
	frozenSub bool
	closed    bool
	conns     []net.Conn
	links     []*partLink
}

type partLink struct {
	client net.Conn
	mu     sync.Mutex
	sub    bool // sent SUBSCRIBE
}

func partStartRelay(t *testing.T, target string) *partRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &partRelay{ln: ln, target: target}
	r.cond = sync.NewCond(&r.mu)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *partRelay) Addr() string { return r.ln.Addr().String() }

func (r *partRelay) freeze(all, sub bool) {
	r.mu.Lock()
	r.frozenAll, r.frozenSub = all, sub
	r.cond.Broadcast()
	r.mu.Unlock()
}

// cut closes the client side of the connections that sent SUBSCRIBE and
// freezes every connection, old and new: a load balancer or pod network
// that reset the replica's subscription and then went dark.
func (r *partRelay) cut() {
	r.mu.Lock()
	r.frozenAll = true
	r.cond.Broadcast()
	links := append([]*partLink(nil), r.links...)
	r.mu.Unlock()
	for _, l := range links {
		l.mu.Lock()
		sub := l.sub
		l.mu.Unlock()
		if sub {
			_ = l.client.Close()
		}
	}
}

func (r *partRelay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.cond.Broadcast()
	r.mu.Unlock()
}

func (r *partRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		l := &partLink{client: c}
		r.conns = append(r.conns, c, u)
		r.links = append(r.links, l)
		r.mu.Unlock()
		go r.pipe(c, u, l, true)
		go r.pipe(u, c, l, false)
	}
}

// gate blocks while the link is frozen; false once the relay is closed.
func (r *partRelay) gate(l *partLink) bool {
	l.mu.Lock()
	sub := l.sub
	l.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.closed && (r.frozenAll || (sub && r.frozenSub)) {
		r.cond.Wait()
	}
	return !r.closed
}

func (r *partRelay) pipe(src, dst net.Conn, l *partLink, fromClient bool) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient && bytes.Contains(bytes.ToLower(buf[:n]), []byte("subscribe")) {
				l.mu.Lock()
				l.sub = true
				l.mu.Unlock()
			}
			if !r.gate(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF included
			return
		}
	}
}

// confirmedAndCached: a watched Store on rdb, confirmed, with k completed
// and answered from the cache.
func confirmedAndCached(t *testing.T, rdb redis.UniversalClient, prefix string, k claim.Key) *watched {
	t.Helper()
	w := watchFor(t, rdb, prefix)
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v, want the confirmation", err)
	}
	ctx := context.Background()
	w.complete(ctx, k)
	if hit, _, err := w.fromCache(ctx, k); !hit || err != nil {
		t.Fatalf("before the fault: cache hit %v, err %v", hit, err)
	}
	return w
}

// partStillReplayed polls, for up to within, whether the purged k is still
// answered from the cache; it returns how long it was (within if to the end).
// A cache turned off answers nothing: that is read from the Store, since
// a lookup that misses goes on to Redis, which on a cut-off replica blocks
// for the client's ReadTimeout (go-redis ignores the 200 ms context
// without ContextTimeoutEnabled).
func partStillReplayed(w *watched, k claim.Key, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < within {
		if !w.s.ReplayCacheOn() {
			return time.Since(start), false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		hit, rec, _ := w.fromCache(ctx, k)
		cancel()
		if !hit || rec == nil {
			return time.Since(start), false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return within, true
}

// TestWatchPartitionedReplicaStopsReplaying: the replica alone is
// cut off from Redis (every connection stops carrying bytes); an operator
// elsewhere runs `keys purge`, which succeeds. The replica must stop
// answering the purged record from memory within a few probe periods.
func TestWatchPartitionedReplicaStopsReplaying(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := partStartRelay(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: relay.Addr(), MaxRetries: 1, DialerRetries: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer rdb.Close()
	k := claim.NewKey(nil, "partition")
	w := confirmedAndCached(t, rdb, "partp:", k)

	relay.freeze(true, true) // this replica's network to Redis drops everything
	ctx := context.Background()
	if ok, err := claim.NewInspector(srv.Client(), "partp:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("purge from the operator's host: %v %v", ok, err)
	}
	window := 3*claim.PurgeProbeEvery() + 3*time.Second // three probe periods and the 2 s PING check
	if d, still := partStillReplayed(w, k, window); still {
		t.Errorf("purged by `keys purge` (which succeeded) %v ago, the record is still replayed from this replica's cache "+
			"(the replica cannot reach Redis, but the operator could: \"no purge can be made meanwhile\" does not hold); reports: %v",
			d.Round(time.Millisecond), w.reported())
	}
}

// partSubscriptionHangs: the Pub/Sub connection alone stops carrying bytes
// (commands still work); k is purged at once. It returns whether the cache
// still answered k for two probe periods plus margin (README: "one that
// hangs is noticed within 20 s", i.e. two periods).
func partSubscriptionHangs(t *testing.T, publishAllowed bool, prefix string) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	acl := []any{"ACL", "SETUSER", "proxy", "on", ">pw", "~*", "&*", "+@all"}
	if !publishAllowed {
		// The proxy's own user needs no PUBLISH for its requests or its
		// subscription; before 298526c it never sent one.
		acl = append(acl, "-publish")
	}
	if err := admin.Do(ctx, acl...).Err(); err != nil {
		t.Fatal(err)
	}
	relay := partStartRelay(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: relay.Addr(), Username: "proxy", Password: "pw", MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	k := claim.NewKey(nil, "hang")
	w := confirmedAndCached(t, rdb, prefix, k)

	relay.freeze(false, true)
	if ok, err := claim.NewInspector(admin, prefix).Purge(ctx, k); !ok || err != nil {
		t.Fatalf("purge by the operator: %v %v", ok, err)
	}
	window := 2*claim.PurgeProbeEvery() + 5*time.Second // two probe periods and a margin, as TestWatchSentinelSwitchLeavesSubscriptionOnOldMaster
	d, still := partStillReplayed(w, k, window)
	t.Logf("publish allowed %v: purged record answered from the cache for %v after the purge", publishAllowed, d.Round(time.Millisecond))
	if still {
		t.Errorf("the Pub/Sub connection hangs (commands work, PUBLISH %s by the proxy's user: allowed=%v); %v after the purge the "+
			"purged record is still replayed from the cache: the probe's PUBLISH is refused (NOPERM) and taken for \"Redis takes no command now\", "+
			"so the probe never runs and the hang is never noticed, silently; reports: %v",
			claim.PurgeChannel(prefix), publishAllowed, d.Round(time.Millisecond), w.reported())
	}
}

// Control: with PUBLISH allowed the probe notices the hang in time.
func TestWatchHungSubscriptionNoticed(t *testing.T) {
	t.Parallel()
	partSubscriptionHangs(t, true, "partc:")
}

// TestWatchProbeRefusedTurnsCacheOff: a proxy user without PUBLISH gets
// NOPERM for every probe. Unverified is untrusted: the cache never turns
// on (before, the refusal was taken for Redis being unreachable and the
// subscription never checked again; then the cache went on at each
// confirmation, for a probe period, unverified).
func TestWatchProbeRefusedTurnsCacheOff(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "proxy", "on", ">pw", "~*", "&*", "+@all", "-publish").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "proxy", Password: "pw", MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	w := watchFor(t, rdb, "partn:")
	if err := w.next(10*time.Second, "the first report"); err == nil || !strings.Contains(err.Error(), "publish its probe") || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("first report %v, want the refused probe", err)
	}
	k := claim.NewKey(nil, "refused")
	w.complete(ctx, k)
	for range 3 {
		if hit, rec, err := w.fromCache(ctx, k); hit || rec == nil || err != nil {
			t.Errorf("with the probe refused: cache hit %v (want none), replay %v, err %v", hit, rec, err)
		}
	}
	// Two more cycles: never confirmed, never on.
	for range 2 {
		if err := w.next(10*time.Second, "the next refusal"); err == nil {
			t.Fatalf("a cycle reported the cache on although its probe was refused; reports %v", w.reported())
		}
	}
}

// TestCacheOffWhenResubscribeIsRefused
//
// CacheAfterSubscribed promises the cache serves "not while Redis refuses
// [the subscription]". WatchPurges only checks the FIRST subscription; after
// that go-redis re-subscribes by itself, and a NOPERM on that re-subscription
// is swallowed by go-redis's channel goroutine (retried every 100 ms, never
// surfaced). Redis 7 disconnects a subscriber whose channel permission is
// revoked, and ACLs are per node (a failover to a replica whose ACL lacks
// &<prefix>purge gives the same refusal), so the cache stays on, unsubscribed,
// and a purge is never heard: the purged record is replayed from memory.
func TestCacheOffWhenResubscribeIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "idemproxy", "on", ">pw", "~t:*", "+@all", "resetchannels", "&t:purge").Err(); err != nil {
		t.Fatal(err)
	}
	proxyRdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "idemproxy", Password: "pw"})
	defer proxyRdb.Close()

	var hits atomic.Int64
	s := claim.NewStore(proxyRdb, "t:", func(e claim.Event) {
		if e.Op == claim.OpCacheHit {
			hits.Add(1)
		}
	}, claim.ReplayCache(1<<20, time.Hour), claim.CacheAfterSubscribed())
	reports := make(chan error, 64)
	done := make(chan error, 1)
	go func() {
		done <- s.WatchPurges(ctx, proxyRdb, func(err error) {
			select {
			case reports <- err:
			default:
			}
		})
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("WatchPurges did not return")
		}
	}()
	select {
	case err := <-reports:
		if err != nil {
			t.Fatalf("first report %v, want the confirmation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no confirmation")
	}

	k := claim.NewKey(nil, "revoked")
	terms := watchTerms
	completed(t, s, k)
	for range 2 { // fills the cache, then hits it
		if _, rec, err := s.Acquire(ctx, k, fp("f"), terms); rec == nil || err != nil {
			t.Fatalf("replay: %v %v", rec, err)
		}
	}
	if hits.Load() != 1 {
		t.Fatalf("%d cache hits, want 1", hits.Load())
	}

	// The channel is revoked (or: failover to a node whose ACL lacks it).
	// Redis 7 disconnects the subscriber; go-redis re-subscribes and is refused.
	if err := admin.Do(ctx, "ACL", "SETUSER", "idemproxy", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "Redis refuses the re-subscription (ACL LOG: channel)", func() bool {
		entries, err := admin.Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			return false
		}
		for _, e := range entries {
			if m, ok := e.(map[any]any); ok && m["reason"] == "channel" {
				return true
			}
			if l, ok := e.([]any); ok && strings.Contains(fmt.Sprint(l), "channel") {
				return true
			}
		}
		return false
	})
	n, _ := admin.PubSubNumSub(ctx, claim.PurgeChannel("t:")).Result()

	if ok, err := claim.NewInspector(admin, "t:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge: %v %v", ok, err)
	}
	var reported []string
	for len(reports) > 0 {
		reported = append(reported, fmt.Sprint(<-reports))
	}
	// Redis no longer has the record: any replay now comes from memory.
	before := hits.Load()
	if _, rec, err := s.Acquire(ctx, k, fp("f"), terms); err != nil || rec != nil {
		t.Errorf("after the re-subscription was refused (subscribers on %s: %d) and keys purge ran: Acquire replayed %v (cache hits %d -> %d), err %v; "+
			"want a fresh claim: the cache must be off while Redis refuses the subscription. WatchPurges reported since confirmation: %q",
			claim.PurgeChannel("t:"), n[claim.PurgeChannel("t:")], rec, before, hits.Load(), err, reported)
	}
}
