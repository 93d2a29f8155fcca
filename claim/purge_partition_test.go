package claim_test

// The purge watch under a partition (review17f): a TCP relay between the
// replica and a real redis-server that can stop carrying bytes (nothing is
// closed, packets just stop) for every connection, or only for the Pub/Sub
// one. Before 5648367's follow-up a replica cut off from Redis kept its
// cache on ("no purge can be made meanwhile" did not hold: an operator
// elsewhere could), and a refused probe PUBLISH switched hang detection off.

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

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

// partCachedAndConfirmed: a watched Store on rdb, confirmed, with k completed
// and answered from the cache.
func partCachedAndConfirmed(t *testing.T, rdb redis.UniversalClient, prefix string, k claim.Key) *watched {
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
func partStillReplayed(w *watched, k claim.Key, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < within {
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
	w := partCachedAndConfirmed(t, rdb, "partp:", k)

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
	w := partCachedAndConfirmed(t, rdb, prefix, k)

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
