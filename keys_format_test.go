package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysStringRecords: idemproxy keys reads records kept as strings
// (RECORD_FORMAT=string) as it reads hashes, and marks them "format":"string",
// so that an operator can find them before rolling back past this version.
func TestKeysStringRecords(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	strProxy, strLog := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=", "RECORD_FORMAT=string")...)
	hashProxy, hashLog := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")...)
	for want, log := range map[string]string{"string": strLog.String(), "hash": hashLog.String()} {
		if !strings.Contains(log, `"record_format":"`+want+`"`) || !strings.Contains(log, "idemproxy started") {
			t.Errorf("start log of the RECORD_FORMAT=%s proxy does not name it:\n%s", want, log)
		}
	}
	c := newClient(t)
	for _, p := range []struct {
		key string
		a   *app
	}{{"as-string", strProxy}, {"as-hash", hashProxy}} {
		if r := mustPost(t, c, "http://"+p.a.proxyAddr.String()+"/v1/orders", p.key, `{"amount":1}`); r.status != http.StatusCreated {
			t.Fatalf("POST %s: %d", p.key, r.status)
		}
	}
	str, hash := claim.NewKey([]string{""}, "as-string"), claim.NewKey([]string{""}, "as-hash")
	if typ := srv.Client().Type(context.Background(), "idem:{"+str.String()+"}").Val(); typ != "string" {
		t.Fatalf("the RECORD_FORMAT=string proxy's record is a Redis %s", typ)
	}
	s := claim.NewStore(srv.Client(), "idem:", nil, claim.StringRecords(true))
	inflight := claim.NewKey([]string{""}, "in flight as string")
	if _, _, err := s.Acquire(context.Background(), inflight, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// get: the same members as the hash record of the same request, plus
	// format (the upstream numbers its orders: the numbers are left out).
	order := regexp.MustCompile(`/v1/orders/[0-9]+`)
	gotStr := order.ReplaceAllString(normalise(keysOK(t, env, "get", str.String())), "/v1/orders/N")
	gotHash := order.ReplaceAllString(normalise(keysOK(t, env, "get", hash.String())), "/v1/orders/N")
	if want := strings.Replace(gotHash, `}`+"\n", `,"format":"string"}`+"\n", 1); strings.Replace(gotStr, str.String(), "K", 1) != strings.Replace(want, hash.String(), "K", 1) {
		t.Errorf("keys get of the string record:\n got %s\nwant (the hash record's, with format) %s", gotStr, want)
	}
	if strings.Contains(gotHash, "format") {
		t.Errorf("keys get of a hash record names a format: %s", gotHash)
	}
	if out := keysOK(t, env, "get", inflight.String()); !strings.Contains(out, `"state":"in_flight"`) ||
		!strings.Contains(out, `"lock_expires_at"`) || !strings.Contains(out, `"format":"string"`) {
		t.Errorf("keys get of an in-flight string record: %s", out)
	}
	if body := keysOK(t, env, "get", "--body", str.String()); !strings.HasPrefix(body, `{"id":`) {
		t.Errorf("keys get --body of the string record: %q", body)
	}

	// list: all three, the two strings marked.
	out := keysOK(t, env, "list")
	if strings.Count(out, "\n") != 3 || strings.Count(out, `"format":"string"`) != 2 {
		t.Errorf("keys list: want 3 records, 2 of them strings:\n%s", out)
	}

	// purge, then the key executes again once, and is a string again.
	if out := keysOK(t, env, "purge", str.String()); !strings.Contains(out, `"purged":true`) {
		t.Fatalf("keys purge: %s", out)
	}
	r := mustPost(t, c, "http://"+strProxy.proxyAddr.String()+"/v1/orders", "as-string", `{"amount":1}`)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || up.KeyCalls("as-string") != 2 {
		t.Errorf("POST after purge: %d, Idempotent-Replayed %q, the key ran %d times in all; want executed, twice in all",
			r.status, r.header.Get("Idempotent-Replayed"), up.KeyCalls("as-string"))
	}
	if typ := srv.Client().Type(context.Background(), "idem:{"+str.String()+"}").Val(); typ != "string" {
		t.Errorf("after purge and a new execution: a Redis %s, want string", typ)
	}
}
