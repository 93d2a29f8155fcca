package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestKeysForgetAfterUnannouncedPurge: a purge deletes the record but its
// announcement fails (here the operator's Redis user may not publish), so a
// replica that cached the answer goes on replaying it. Meanwhile the key is
// free: a retry on another replica executes again and is recorded. Running
// the purge again would delete that second answer too (the next retry would
// execute a third time); keys forget tells the replicas and deletes nothing.
func TestKeysForgetAfterUnannouncedPurge(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	nopub := noPublishUser(t, srv)
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	b, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	c := newClient(t)
	urlA := "http://" + a.proxyAddr.String() + "/v1/orders"
	urlB := "http://" + b.proxyAddr.String() + "/v1/orders"
	const key = "forget"
	first := cachedAnswer(t, c, a, key)
	operator := []string{"REDIS_URL=" + srv.URL()}
	hash := strings.TrimSpace(keysOK(t, operator, "hash", key))
	k, err := claim.ParseKeyHash(hash)
	if err != nil {
		t.Fatal(err)
	}

	out, errOut, code := keysRun(t, nopub, "purge", hash, "--state", "completed")
	if code != 1 || !strings.Contains(out, `"purged":true`) || !strings.Contains(errOut, "could not announce the purge") ||
		!strings.Contains(errOut, "REDIS_URL=") || !strings.Contains(errOut, "keys forget "+hash) {
		t.Fatalf("purge as a user who may not publish: exit %d\nstdout %s\nstderr %s\nwant exit 1, purged:true, the failure naming REDIS_URL and keys forget", code, out, errOut)
	}
	if r := mustPost(t, c, urlA, key, `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("A before forget: %d %q; its cache should still replay the first answer (else this test shows nothing)", r.status, r.body)
	}
	second := mustPost(t, c, urlB, key, `{}`)
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") == "true" || second.body == first.body {
		t.Fatalf("retry on B: %d %q; want a new execution, as the purge intends", second.status, second.body)
	}

	if out, errOut, code := keysRun(t, nopub, "forget", hash); code != 1 || out != "" || !strings.Contains(errOut, "REDIS_URL=") {
		t.Errorf("forget as a user who may not publish: exit %d\nstdout %s\nstderr %s\nwant exit 1 naming REDIS_URL, nothing on stdout", code, out, errOut)
	}
	if out := keysOK(t, operator, "forget", hash); strings.TrimSpace(out) != `{"key_hash":"`+hash+`","announced":true}` {
		t.Errorf("forget: %s", out)
	}
	if n, _ := admin.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 1 {
		t.Fatal("keys forget deleted the record of the second execution")
	}
	// A's cache dropped the first answer: A now replays the second, from
	// Redis, and nothing executes a third time.
	testutil.Eventually(t, 5*time.Second, "A replays the second answer", func() bool {
		return mustPost(t, c, urlA, key, `{}`).body == second.body
	})
	if n := up.KeyCalls(key); n != 2 {
		t.Errorf("upstream calls for the key: %d, want 2", n)
	}
}

// TestKeysPurgeStateOfNothingPointsToForget: a --state purge that finds no
// record announces nothing (it refused), and says where to turn if an
// earlier purge of the key could not announce itself.
func TestKeysPurgeStateOfNothingPointsToForget(t *testing.T) {
	srv := redistest.Start(t)
	operator := []string{"REDIS_URL=" + srv.URL()}
	hash := strings.TrimSpace(keysOK(t, operator, "hash", "never-claimed"))
	out, errOut, code := keysRun(t, operator, "purge", hash, "--state", "completed")
	if code != 1 || strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":false,"state":""}` ||
		!strings.Contains(errOut, "no record") || !strings.Contains(errOut, "keys forget "+hash+" tells the replicas") {
		t.Errorf("purge --state of no record: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if _, errOut, code := keysRun(t, operator, "forget"); code != 2 || !strings.Contains(errOut, "Usage: idemproxy keys forget KEY_HASH") {
		t.Errorf("forget without KEY_HASH: exit %d, stderr %s; want a usage error", code, errOut)
	}
	if _, errOut, code := keysRun(t, operator, "forget", "abc"); code != 2 {
		t.Errorf("forget abc: exit %d, stderr %s; want a usage error", code, errOut)
	}
}
