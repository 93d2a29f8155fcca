package claim_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestCacheOffWhenResubscribeIsRefused (review17d)
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
