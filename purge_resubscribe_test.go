package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestPurgeNotMissedAfterResubscribeRefused (review17d)
//
// The proxy's Redis user has the purge channel when the replica starts, so
// the subscription is confirmed and the replay cache turned on. Later Redis
// refuses the channel to a re-subscription: here the grant is revoked (Redis 7
// then disconnects the subscriber), as happens when the ACL was fixed with
// `ACL SETUSER <user> &idem:purge` (what the proxy's own log line says) and
// Redis restarts from its ACL file, or after a failover to a node whose ACL
// lacks it (ACLs are per node). go-redis re-subscribes by itself, gets
// NOPERM and swallows it; WatchPurges never hears of it, the cache stays on,
// nothing is logged, and `keys purge` (exit 0, purged:true) is not obeyed.
// README: "The cache serves and keeps nothing ... nor while Redis refuses it";
// contract: every replica stops replaying it within 1 s.
func TestPurgeNotMissedAfterResubscribeRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "idemproxy", "on", ">proxy-secret", "~idem:*", "+@all", "resetchannels", "&idem:purge").Err(); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	a, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL=redis://idemproxy:proxy-secret@"+srv.Addr()+"/0", "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	first := cachedAnswer(t, c, a, "resub")

	if err := admin.Do(ctx, "ACL", "SETUSER", "idemproxy", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "Redis refuses the replica's re-subscription (ACL LOG reason channel)", func() bool {
		entries, err := admin.Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			return false
		}
		return strings.Contains(fmt.Sprint(entries), "channel")
	})

	operator := []string{"REDIS_URL=" + srv.URL()}
	out, errOut, code := keysRun(t, operator, "purge", strings.TrimSpace(keysOK(t, operator, "hash", "resub")))
	if code != 0 || !strings.Contains(out, `"purged":true`) {
		t.Fatalf("keys purge: exit %d %q %q", code, out, errOut)
	}
	purged := time.Now()
	for {
		r := mustPost(t, c, url, "resub", `{}`)
		if r.body != first.body {
			break
		}
		if time.Since(purged) > time.Second {
			n, _ := admin.PubSubNumSub(ctx, "idem:purge").Result()
			t.Errorf("1 s after keys purge (exit 0, purged:true) the replica still replays the purged answer %q from its cache (subscribers on idem:purge: %d; "+
				"\"purge subscription failed\" logged: %v): its re-subscription was refused (NOPERM) but the cache stayed on",
				r.body, n["idem:purge"], strings.Contains(logs.String(), "purge subscription failed"))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}
