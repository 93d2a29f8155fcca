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

// TestPurgeStateReannounces: a purge whose announcement failed (here the
// operator's Redis user may not publish) deleted the record, but a replica
// goes on replaying it from its cache. Running the purge again, with
// --state as the runbooks say, finds no record; it must still tell the
// replicas to forget the key, as a plain purge of nothing does, or the
// operator has no way left to reach the caches short of a restart.
func TestPurgeStateReannounces(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nopub", "on", ">op-secret", "~idem:*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"

	first := mustPost(t, c, url, "reannounce", `{}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %q", first.status, first.body)
	}
	for range 2 { // a replay from Redis (cached), then one from the cache
		if r := mustPost(t, c, url, "reannounce", `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want a replay of %q", r.status, r.body, first.body)
		}
	}
	operator := []string{"REDIS_URL=" + srv.URL()}
	hash := strings.TrimSpace(keysOK(t, operator, "hash", "reannounce"))

	// The first purge deletes, but its PUBLISH is refused.
	nopub := []string{"REDIS_URL=redis://nopub:op-secret@" + srv.Addr() + "/0"}
	out, errOut, code := keysRun(t, nopub, "purge", hash, "--state", "completed")
	if code == 0 || !strings.Contains(errOut, "could not announce") {
		t.Fatalf("purge as a user who may not publish: exit %d\nstdout %s\nstderr %s\nwant a failure naming the announcement", code, out, errOut)
	}
	k, err := claim.ParseKeyHash(hash)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := admin.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 0 {
		t.Fatalf("the first purge did not delete the record")
	}
	if r := mustPost(t, c, url, "reannounce", `{}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("before the re-run the replica's cache should still replay (else this test shows nothing): %d %q", r.status, r.body)
	}

	// Re-run as a user who may publish: no record, exit 1, but announced.
	out, errOut, code = keysRun(t, operator, "purge", hash, "--state", "completed")
	if code != 1 || !strings.Contains(out, `"state":""`) || !strings.Contains(errOut, "the replicas were told to forget it all the same") {
		t.Fatalf("re-run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	testutil.Eventually(t, 5*time.Second, "the replica's cache drops the purged answer", func() bool {
		r := mustPost(t, c, url, "reannounce", `{}`)
		return r.header.Get("Idempotent-Replayed") != "true"
	})
	if n := up.KeyCalls("reannounce"); n != 2 {
		t.Errorf("upstream calls for the key: %d, want 2 (the first, then once anew after the purge reached the cache)", n)
	}
}
