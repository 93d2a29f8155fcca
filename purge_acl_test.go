package main

// `idemproxy keys purge` must reach every replay cache, or the cache must
// not serve (review17b).

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestPurgeUnheardWithoutChannelACL guards against what review17b found: the proxies' Redis user is
// restricted the usual way, to the proxy's keys (ACL SETUSER ... ~idem:*
// +@all; Redis 7's default acl-pubsub-default is resetchannels, so such a
// user has no Pub/Sub channel). Everything works -- claims, replays,
// /readyz "ready" with no warning -- except the purge subscription, which
// Redis refuses (NOPERM) and which the proxy retries in silence while its
// replay cache goes on serving. `idemproxy keys purge`, run by an operator
// whose user may publish, says purged:true, exit 0; the replica keeps
// replaying the purged answer from memory for up to a minute, not "within
// 1 s" (contract, keys purge). Nothing tells anyone: no log line at info,
// no /readyz warning, and the README names no ACL requirement.
func TestPurgeUnheardWithoutChannelACL(t *testing.T) {
	srv, admin, up, a, _ := channelRefusedProxy(t)
	ctx := context.Background()
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"

	first := mustPost(t, c, url, "acl", `{}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %q", first.status, first.body)
	}
	for range 2 { // a replay from Redis (cached), then one from the cache
		if r := mustPost(t, c, url, "acl", `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want a replay of %q", r.status, r.body, first.body)
		}
	}
	status, ready, err := get(c, "http://"+a.adminAddr.String()+"/readyz")
	t.Logf("/readyz: %d %q %v", status, ready, err)

	operator := []string{"REDIS_URL=" + srv.URL()} // the default user: may publish
	out, errOut, code := keysRun(t, operator, "purge", strings.TrimSpace(keysOK(t, operator, "hash", "acl")))
	if code != 0 || !strings.Contains(out, `"purged":true`) {
		t.Fatalf("keys purge: exit %d %q %q", code, out, errOut)
	}
	purged := time.Now()
	for {
		r := mustPost(t, c, url, "acl", `{}`)
		if r.body != first.body {
			break
		}
		if time.Since(purged) > time.Second {
			refused := "none"
			if entries, err := admin.Do(ctx, "ACL", "LOG", "1").Slice(); err == nil && len(entries) == 1 {
				if m, ok := entries[0].(map[any]any); ok {
					refused = fmt.Sprintf("%v %v refused (reason %v, object %v)", m["username"], "SUBSCRIBE", m["reason"], m["object"])
				}
			}
			t.Errorf("1 s after keys purge (exit 0, purged:true) the replica still replays the purged answer %q (Idempotent-Replayed: %s); /readyz said %q; upstream executed the key %d time(s); Redis's ACL LOG: %s",
				r.body, r.header.Get("Idempotent-Replayed"), strings.TrimSpace(ready), up.KeyCalls("acl"), refused)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplayCacheOffWhileThePurgeSubscriptionIsRefused: with the channel
// refused the replica says so and replays from Redis (the cache is off, so
// a purge is never missed); once the channel is granted, the cache is on
// again and answers replays without a round trip.
func TestReplayCacheOffWhileThePurgeSubscriptionIsRefused(t *testing.T) {
	_, admin, _, a, logs := channelRefusedProxy(t)
	ctx := context.Background()
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	testutil.Eventually(t, 10*time.Second, "the refused subscription is logged", func() bool {
		return strings.Contains(logs.String(), "purge subscription failed") && strings.Contains(logs.String(), "NOPERM")
	})
	if v := metric(t, c, a, "idemproxy_replay_cache_on"); v != 0 {
		t.Errorf("idemproxy_replay_cache_on with the channel refused: %v, want 0", v)
	}
	if r := mustPost(t, c, url, "acl-on", `{}`); r.status != http.StatusCreated {
		t.Fatalf("first POST: %d", r.status)
	}
	scripts := func() int64 { // claim scripts Redis ran: a replay from the cache runs none
		n, err := admin.Do(ctx, "INFO", "commandstats").Text()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(n, "\n") {
			if v, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				v, _, _ = strings.Cut(v, ",")
				x, _ := strconv.ParseInt(v, 10, 64)
				return x
			}
		}
		return 0
	}
	before := scripts()
	for range 3 {
		if r := mustPost(t, c, url, "acl-on", `{}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d, want a replay", r.status)
		}
	}
	if n := scripts() - before; n != 3 {
		t.Errorf("with the purge channel refused, 3 replays ran %d scripts in Redis; want 3 (the cache is off)", n)
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "idemproxy", "&idem:purge").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the replica logs that its cache is on again", func() bool {
		return strings.Contains(logs.String(), "purge subscription confirmed")
	})
	if v := metric(t, c, a, "idemproxy_replay_cache_on"); v != 1 {
		t.Errorf("idemproxy_replay_cache_on once the subscription is confirmed: %v, want 1", v)
	}
	before = scripts()
	for range 3 {
		if r := mustPost(t, c, url, "acl-on", `{}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d, want a replay", r.status)
		}
	}
	if n := scripts() - before; n != 1 {
		t.Errorf("with the purge channel granted, 3 replays ran %d scripts in Redis; want 1 (the first fills the cache)", n)
	}
}

// channelRefusedProxy starts a real Redis with a user restricted to the
// proxy's keys the usual way (Redis 7 gives it no Pub/Sub channel), and a
// proxy that connects as that user. admin is the default user.
func channelRefusedProxy(t *testing.T) (srv *redistest.Server, admin *redis.Client, up *testutil.Upstream, a *app, logs *testutil.SyncBuffer) {
	t.Helper()
	srv = redistest.Start(t)
	admin = srv.Client()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "idemproxy", "on", ">proxy-secret", "~idem:*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	up = newUpstream(t)
	a, logs = startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL=redis://idemproxy:proxy-secret@"+srv.Addr()+"/0", "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	return srv, admin, up, a, logs
}
