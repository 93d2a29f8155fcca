package main

// Tests of the purge watch (watchPurges in keys.go, claim's WatchPurges): a
// replica's replay cache answers only while its subscription to the purge
// channel is verified, so that `idemproxy keys purge` is never missed. With
// Redis killed and restarted: internal/e2e.

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

// TestReplayCacheOnMetric: idemproxy_replay_cache_on is 1 once the cache
// answers, and not exported with REPLAY_CACHE_BYTES=0, whose replays are
// all read from Redis.
func TestReplayCacheOnMetric(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	c := newClient(t)
	on, _ := startProxy(t, up.URL, "REDIS_URL="+srv.URL())
	cachedAnswer(t, c, on, "on") // waits for the metric at 1, and checks the cache answers

	off, _ := startProxy(t, up.URL, "REDIS_URL="+srv.URL(), "REPLAY_CACHE_BYTES=0")
	url := proxyURL(off, "/v1/orders")
	for range 3 {
		if r := mustPost(t, c, url, "off", `{}`); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %q", r.status, r.body)
		}
	}
	if m := getBody(t, c, adminURL(off, "/metrics")); strings.Contains(m, "idemproxy_replay_cache_on") {
		t.Errorf("idemproxy_replay_cache_on exported with REPLAY_CACHE_BYTES=0 (an alert on 0 would fire for a cache turned off on purpose)")
	}
	if v := metric(t, c, off, "idemproxy_replay_cache_hits_total"); v != 0 {
		t.Errorf("replay cache hits with REPLAY_CACHE_BYTES=0: %v, want 0", v)
	}
}

// TestPurgeUnheardWithoutChannelACL: the proxies' Redis user is restricted
// the usual way, to the proxy's keys (ACL SETUSER ... ~idem:* +@all; Redis
// 7's default acl-pubsub-default is resetchannels, so such a user has no
// Pub/Sub channel). Everything works -- claims, replays, /readyz "ready"
// with no warning -- except the purge subscription, which Redis refuses
// (NOPERM). The proxy used to retry it in silence while its replay cache
// went on serving: `idemproxy keys purge`, run by an operator whose user may
// publish, said purged:true, exit 0, and the replica kept replaying the
// purged answer from memory for up to a minute, not "within 1 s" (contract,
// keys purge), with nothing to tell anyone. Now the cache is off until the
// subscription is verified, and the purge is obeyed within 1 s.
func TestPurgeUnheardWithoutChannelACL(t *testing.T) {
	srv, admin, up, a, _ := channelRefusedProxy(t)
	ctx := context.Background()
	c := newClient(t)
	url := proxyURL(a, "/v1/orders")

	first := mustPost(t, c, url, "acl", `{}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %q", first.status, first.body)
	}
	for range 2 { // a replay from Redis (cached), then one from the cache
		if r := mustPost(t, c, url, "acl", `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want a replay of %q", r.status, r.body, first.body)
		}
	}
	status, ready, err := get(c, adminURL(a, "/readyz"))
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
	t.Parallel()
	_, admin, _, a, logs := channelRefusedProxy(t)
	ctx := context.Background()
	c := newClient(t)
	url := proxyURL(a, "/v1/orders")
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
	up = newUpstream(t)
	a, logs = startProxy(t, up.URL, proxyUser(t, srv, "resetchannels"))
	return srv, admin, up, a, logs
}

// TestProbeRefusedLoggedOnceWithItsHint: the proxy's Redis user has the
// channel but not PUBLISH (the README's second requirement, easy to miss).
// Each cycle's probe is refused. It was logged as a new failure every cycle
// (a confirmation ended the last one, with the cache on meanwhile,
// unverified), with a hint to grant the channel, which the user has. Now
// the cache turns on only when a probe comes back, so one unchanging cause
// is one line (then at most one a minute), with the PUBLISH hint.
func TestProbeRefusedLoggedOnceWithItsHint(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t)
	_, logs := startProxy(t, up.URL, proxyUser(t, srv, "-publish", "resetchannels", "&idem:purge"), "ADMIN_ADDR=")
	count := func(s string) int { return strings.Count(logs.String(), s) }
	testutil.Eventually(t, 15*time.Second, "the refused probe is logged", func() bool {
		return count("purge subscription failed") >= 1
	})
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "purge subscription failed") {
			line = l
			break
		}
	}
	if strings.Contains(line, "NOPERM") && !strings.Contains(strings.ToLower(line), "+publish") {
		t.Errorf("PUBLISH refused, but the hint names only the channel the user already has:\n%s", line)
	}
	// One more cycle: 1 s backoff, 10 s until the next probe, margin.
	deadline := time.Now().Add(13 * time.Second)
	for time.Now().Before(deadline) && count("purge subscription failed") < 2 {
		time.Sleep(200 * time.Millisecond)
	}
	if n, on := count("purge subscription failed"), count("purge subscription confirmed"); n >= 2 {
		t.Errorf("one unchanging cause (no PUBLISH) logged %d failure lines and %d \"cache on again\" lines within ~25 s "+
			"(want 1, then at most once a minute); the cache flaps on for 10 s of every 11, never verified", n, on)
	}
}

// TestPurgeNotMissedAfterResubscribeRefused: the proxy's Redis user has the
// purge channel when the replica starts, so the subscription is confirmed and
// the replay cache turned on. Later Redis refuses the channel to a
// re-subscription: here the grant is revoked (Redis 7 then disconnects the
// subscriber), as happens when the ACL was fixed with `ACL SETUSER <user>
// &idem:purge` (what the proxy's own log line says) and Redis restarts from
// its ACL file, or after a failover to a node whose ACL lacks it (ACLs are
// per node). go-redis re-subscribes by itself, gets NOPERM and swallows it;
// when WatchPurges never heard of it, the cache stayed on, nothing was
// logged, and `keys purge` (exit 0, purged:true) was not obeyed. README: "The
// cache serves and keeps nothing ... nor while Redis refuses it"; contract:
// every replica stops replaying it within 1 s.
func TestPurgeNotMissedAfterResubscribeRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	up := newUpstream(t)
	a, logs := startProxy(t, up.URL, proxyUser(t, srv, "resetchannels", "&idem:purge"))
	c := newClient(t)
	url := proxyURL(a, "/v1/orders")
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

// proxyUser makes the user "idemproxy" of srv, restricted to the proxy's
// keys (~idem:* +@all) and then by rules ("resetchannels", "-publish"...),
// and returns the REDIS_URL entry of a proxy that connects as that user.
func proxyUser(t *testing.T, srv *redistest.Server, rules ...string) string {
	t.Helper()
	args := []any{"ACL", "SETUSER", "idemproxy", "on", ">proxy-secret", "~idem:*", "+@all"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := srv.Client().Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	return "REDIS_URL=redis://idemproxy:proxy-secret@" + srv.Addr() + "/0"
}
