package claim_test

// WatchPurges's own subscription loop (follow) and the replay cache it turns
// on and off (review17e): idleness (its probes) on miniredis and real Redis
// in RESP2 and RESP3, a Redis restart, a Sentinel failover and a switch that
// could not demote the old master, Cluster failovers.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
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
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	w := watchFor(t, rdb, "rs:")
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	k := claim.NewKey(nil, "restart")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit before the restart")
	}
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
	deadline := time.Now().Add(time.Second)
	for {
		hit, rec, _ := w.fromCache(ctx, k)
		if !hit && rec == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("1 s after the purge the replay still comes back (hit %v)", hit)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	w := watchFor(t, rdb, "sn:")
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	k := claim.NewKey(nil, "failover")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit before the failover")
	}
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
	deadline := time.Now().Add(time.Second)
	for {
		hit, rec, _ := w.fromCache(ctx, k2)
		if !hit && rec == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("1 s after the purge on the new master the replay still comes back (hit %v); reports %v", hit, w.reported())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchClusterNodeKilled: the node the subscription is on is killed;
// the cache goes off at once, comes back on after the cluster failed over,
// and a purge is then heard.
func TestWatchClusterNodeKilled(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: 1, DialerRetries: 1, ClusterStateReloadInterval: time.Second})
	defer rdb.Close()
	ctx := context.Background()
	w := watchFor(t, rdb, "cl:")
	if err := w.next(15*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	var on *redistest.Server
	for _, n := range cl.Nodes() {
		m, err := n.Client().PubSubNumSub(ctx, claim.PurgeChannel("cl:")).Result()
		if err == nil && m[claim.PurgeChannel("cl:")] == 1 {
			on = n
		}
	}
	if on == nil {
		t.Fatal("no node has the subscription")
	}
	k := claim.NewKey(nil, "cluster")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit")
	}
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
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	w := watchFor(t, rdb, "off:")
	if err := w.next(10*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	k := claim.NewKey(nil, "off")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit")
	}
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
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: 1, DialerRetries: 1, ClusterStateReloadInterval: time.Second})
	defer rdb.Close()
	ctx := context.Background()
	w := watchFor(t, rdb, "mf:")
	if err := w.next(15*time.Second, "the first confirmation"); err != nil {
		t.Fatalf("first report %v", err)
	}
	var on *redistest.Server
	for _, n := range cl.Nodes() {
		m, err := n.Client().PubSubNumSub(ctx, claim.PurgeChannel("mf:")).Result()
		if err == nil && m[claim.PurgeChannel("mf:")] == 1 {
			on = n
		}
	}
	if on == nil {
		t.Fatal("no node has the subscription")
	}
	k := claim.NewKey(nil, "manual")
	w.complete(ctx, k)
	if hit, _, _ := w.fromCache(ctx, k); !hit {
		t.Fatal("no cache hit")
	}
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
	if ok, err := claim.NewInspector(rdb, "mf:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge %v %v", ok, err)
	}
	purged := time.Now()
	for {
		hit, rec, _ := w.fromCache(ctx, k)
		if !hit && rec == nil {
			break
		}
		if time.Since(purged) > time.Second {
			t.Fatalf("1 s after the purge, replayed (hit %v); reports %v", hit, w.reported())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("reports %v", w.reported())
}
