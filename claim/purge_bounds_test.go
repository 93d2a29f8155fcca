package claim_test

// The purge watch keeps its own deadlines while go-redis blocks (review17g).

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

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
	w := partCachedAndConfirmed(t, rdb, "boundp:", k)

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
	w := partCachedAndConfirmed(t, rdb, "boundc:", k)

	relay.cut() // the subscription's connection is closed, and this replica's path to Redis goes dark
	if ok, err := claim.NewInspector(srv.Client(), "boundc:").Purge(context.Background(), k); !ok || err != nil {
		t.Fatalf("purge from the operator's host: %v %v", ok, err)
	}
	if d, still := partStillReplayed(w, k, 5*time.Second); still {
		t.Errorf("the subscription's connection was closed, and %v later the purged record is still replayed from the cache "+
			"(go-redis redials inside ReceiveTimeout before reporting the close); reports: %v", d.Round(time.Millisecond), w.reported())
	}
}
