package main

// Tests of `idemproxy keys` through run(), as the binary runs it, against
// real redis-server processes (standalone, Sentinel, Cluster) and proxies
// started in-process through start().

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestKeysUsageAndFailures(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	hash := claim.NewKey([]string{""}, "k").String()
	for _, tc := range []struct {
		name   string
		env    []string
		args   []string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"keys help", nil, []string{"--help"}, 0, "Usage: idemproxy keys COMMAND", ""},
		{"get help", nil, []string{"get", "--help"}, 0, "Usage: idemproxy keys get KEY_HASH [--body]", ""},
		{"list help", nil, []string{"list", "-h"}, 0, "-limit int", ""},
		{"no command", nil, nil, 2, "", "keys: a command is needed"},
		{"unknown command", nil, []string{"show"}, 2, "", "unknown command (an argument of 4 characters, not shown"},
		{"short hash", env, []string{"get", hash[:16]}, 2, "", "want the 64 hex digits of key_hash"},
		{"not hex", env, []string{"purge", "z" + hash[1:]}, 2, "", "not hexadecimal"},
		{"two hashes", env, []string{"get", hash, hash}, 2, "", "want one KEY_HASH, got 2"},
		{"unknown flag", env, []string{"get", hash, "--json"}, 2, "", "an argument of 6 characters (not shown: it may be a key) starts with -"},
		{"limit 0", env, []string{"list", "--limit", "0"}, 2, "", "--limit=0: want 1 to 100000"},
		{"limit too high", env, []string{"list", "--limit=100001"}, 2, "", "want 1 to 100000"},
		{"bad state", env, []string{"list", "--state", "done"}, 2, "", `--state="done": want in_flight, completed or unknown`},
		{"scope not configured", env, []string{"hash", "--scope", "X-Tenant=a", "k"}, 2, "", `--scope X-Tenant: not a scope header (SCOPE_HEADERS="Authorization")`},
		{"two parts without source", env, []string{"hash", "a", "b"}, 2, "", "want one PART"},
		{"key the proxy refuses", env, []string{"hash", "a,b"}, 2, "", "the proxy refuses this Idempotency-Key"},
		{"wrong part count", env, []string{"hash", "--source", "cloudevents", "only-id"}, 2, "", "takes 2"},
		{"bad source", env, []string{"hash", "--source", "header:", "x"}, 2, "", "--source=header:"},
		{"embedded Redis", nil, []string{"list"}, 1, "", "REDIS_URL is empty: keys needs the Redis the proxies use"},
		{"bad config", []string{"REDIS_URL=" + srv.URL(), "KEY_PREFIX=a{b}"}, []string{"list"}, 1, "", "KEY_PREFIX="},
		{"unreachable Redis", []string{"REDIS_URL=redis://127.0.0.1:1/0"}, []string{"get", hash}, 1, "", `Redis (REDIS_URL="redis://127.0.0.1:1/0")`},
		{"unreachable Redis list", []string{"REDIS_URL=redis://127.0.0.1:1/0"}, []string{"list"}, 1, "", "connection refused"},
		{"no record", env, []string{"get", hash}, 1, "", "no record for key_hash " + hash},
		{"no record body", env, []string{"get", "--body", hash}, 1, "", "no record for key_hash " + hash},
		{"hash needs no UPSTREAM_URL nor Redis", nil, []string{"hash", "k"}, 0, hash + "\n", ""},
		{"upper-case hash", env, []string{"purge", strings.ToUpper(hash)}, 0, `{"key_hash":"` + hash + `","purged":false}`, "nothing was there for key_hash " + hash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := keysRun(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errOut, tc.stderr) {
				t.Errorf("keys %q: exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout with %q, stderr with %q", tc.args, code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
			if code == 2 && !strings.Contains(errOut, "Usage: idemproxy keys") {
				t.Errorf("keys %q: usage error without the usage on stderr: %q", tc.args, errOut)
			}
			if code != 0 && out != "" {
				t.Errorf("keys %q: failed with output on stdout: %q", tc.args, out)
			}
		})
	}
}

// TestKeysHashIsTheLoggedKeyHash: `keys hash` prints the key_hash the
// proxy's access log shows, for a header key with two scope headers and for
// keys derived from the message (cloudevents in binary and structured
// mode, github with a route's scope=).
func TestKeysHashIsTheLoggedKeyHash(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL(), "SCOPE_HEADERS=Authorization,X-Tenant"}
	a, logs := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=",
		"ROUTES=POST /hooks/ce key=cloudevents; POST /hooks/gh key=github scope=X-Tenant")...)
	base := "http://" + a.proxyAddr.String()
	c := newClient(t)
	send := func(path string, header map[string]string, body string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: status %d", path, res.StatusCode)
		}
	}
	for _, tc := range []struct {
		name   string
		path   string
		header map[string]string
		body   string
		args   []string
	}{
		{"header key, two scope headers", "/v1/orders",
			map[string]string{"Idempotency-Key": `"ord-1"`, "Authorization": "Bearer t", "X-Tenant": "acme"}, `{}`,
			[]string{"--scope", "Authorization=Bearer t", "--scope", "x-tenant=acme", `"ord-1"`}},
		{"header key, one scope header absent", "/v1/orders",
			map[string]string{"Idempotency-Key": "ord-2", "X-Tenant": "acme"}, `{}`,
			[]string{"ord-2", "--scope", "X-Tenant=acme"}},
		{"cloudevents binary", "/hooks/ce",
			map[string]string{"Ce-Source": "%2Forders", "Ce-Id": "A-1", "Authorization": "Bearer t"}, `{}`,
			[]string{"--source", "cloudevents", "--scope", "Authorization=Bearer t", "/orders", "A-1"}},
		{"cloudevents structured", "/hooks/ce",
			map[string]string{"Content-Type": "application/cloudevents+json", "Authorization": "Bearer t"}, `{"source":"/orders","id":"A-2"}`,
			[]string{"--source", "cloudevents", "--scope", "Authorization=Bearer t", "/orders", "A-2"}},
		{"github, route scope", "/hooks/gh",
			map[string]string{"X-GitHub-Delivery": "d-1", "X-Tenant": "acme", "Authorization": "ignored here"}, `{}`,
			[]string{"--source", "github", "--route-scope", "X-Tenant", "--scope", "X-Tenant=acme", "d-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			send(tc.path, tc.header, tc.body)
			logged := lastKeyHash(t, logs.String())
			if got := strings.TrimSpace(keysOK(t, env, append([]string{"hash"}, tc.args...)...)); got != logged {
				t.Errorf("keys hash %q = %s, the access log says %s", tc.args, got, logged)
			}
			if len(logged) != 64 {
				t.Errorf("key_hash %q: want 64 hex digits", logged)
			}
		})
	}
}

// TestKeysGetListPurge: golden outputs of get, list and purge for each
// kind of record: completed through the proxy, completed too large to
// store, in flight, unknown (ON_UNKNOWN=hold, written as its format says),
// and one that does not decode.
func TestKeysGetListPurge(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	a, _ := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")...)
	c := newClient(t)
	if r := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/orders", "done", `{"amount":1}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d", r.status)
	}
	done := claim.NewKey([]string{""}, "done")

	s := claim.NewStore(rdb, "idem:", nil)
	big := claim.NewKey([]string{""}, "big")
	lease, _, err := s.Acquire(ctx, big, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}, BodyNotStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	binary := claim.NewKey([]string{""}, "binary")
	lease, _, err = s.Acquire(ctx, binary, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rawBody := []byte{0, 1, 2, 0xff, '\n', '<'}
	if err := lease.Complete(ctx, &claim.Record{Status: 202, Body: rawBody, Trailer: map[string][]string{"X-Checksum": {"abc"}}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	inflight := claim.NewKey([]string{""}, "inflight")
	if _, _, err := s.Acquire(ctx, inflight, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	rk := func(k claim.Key) string { return "idem:{" + k.String() + "}" }
	locked := claim.NewKey([]string{""}, "locked")
	rdb.HSet(ctx, rk(locked), "st", "i", "tok", "0123456789abcdef", "fp", string(make([]byte, 32)),
		"at", strconv.FormatInt(now, 10), "ld", strconv.FormatInt(now+60000, 10), "up", "")
	rdb.PExpire(ctx, rk(locked), time.Minute)
	unknown := claim.NewKey([]string{""}, "unknown")
	rdb.HSet(ctx, rk(unknown), "st", "u", "tok", "0123456789abcdef", "fp", string(make([]byte, 32)),
		"at", strconv.FormatInt(now-30000, 10), "ct", strconv.FormatInt(now, 10), "up", "0123abcd", "rec", "504")
	rdb.PExpire(ctx, rk(unknown), time.Hour)
	bad := claim.NewKey([]string{""}, "bad")
	rdb.HSet(ctx, rk(bad), "st", "c", "fp", "x", "rec", "not a record")
	rdb.Set(ctx, rk(claim.NewKey(nil, "a string")), "not a hash", 0)

	const zeroFP = "FP" // a zero fingerprint, normalised like the others
	golden := map[claim.Key]string{
		done:     `{"key_hash":"` + done.String() + `","state":"completed","status":201,"fingerprint":"FP","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"upstream":"UP","body_bytes":8,"body_stored":true,"headers":{"Content-Length":["8"],"Content-Type":["application/json"],"Date":["DATE"],"Location":["/v1/orders/1"]}}`,
		big:      `{"key_hash":"` + big.String() + `","state":"completed","status":200,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"body_bytes":0,"body_stored":false,"headers":{"Content-Type":["text/event-stream"]}}`,
		binary:   `{"key_hash":"` + binary.String() + `","state":"completed","status":202,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"body_bytes":6,"body_stored":true,"headers":{},"trailers":{"X-Checksum":["abc"]}}`,
		inflight: `{"key_hash":"` + inflight.String() + `","state":"in_flight","fingerprint":"` + zeroFP + `","claimed_at":"TIME","lock_expires_at":"TIME","ttl_ms":TTL}`,
		locked:   `{"key_hash":"` + locked.String() + `","state":"in_flight","fingerprint":"` + zeroFP + `","claimed_at":"TIME","lock_expires_at":"TIME","ttl_ms":TTL}`,
		unknown:  `{"key_hash":"` + unknown.String() + `","state":"unknown","status":504,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"upstream":"0123abcd"}`,
	}
	upHash := regexp.MustCompile(`"upstream":"[0-9a-f]{16}"`)
	for k, want := range golden {
		out := keysOK(t, env, "get", k.String())
		if got := upHash.ReplaceAllString(normalise(out), `"upstream":"UP"`); got != want+"\n" {
			t.Errorf("keys get %s:\n got %s\nwant %s", k, got, want)
		}
		if strings.Contains(out, "0123456789abcdef") || strings.Contains(out, "tok") {
			t.Errorf("keys get %s prints the claim token: %s", k, out)
		}
	}
	if out := keysOK(t, env, "get", binary.String(), "--body"); out != string(rawBody) {
		t.Errorf("keys get --body: got %q, want %q", out, rawBody)
	}
	if out := keysOK(t, env, "get", "--body", done.String()); out != `{"id":1}` {
		t.Errorf("keys get --body: got %q, want the upstream's body", out)
	}
	for _, tc := range []struct {
		k    claim.Key
		want string
	}{
		{big, "too large to store"},
		{inflight, "is in_flight: it has no recorded body"},
		{unknown, "is unknown: it has no recorded body"},
	} {
		if out, errOut, code := keysRun(t, env, "get", tc.k.String(), "--body"); code != 1 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("keys get --body %s: exit %d stdout %q stderr %q; want 1 and %q", tc.k, code, out, errOut, tc.want)
		}
	}
	if out, errOut, code := keysRun(t, env, "get", bad.String()); code != 1 || out != "" || !strings.Contains(errOut, "cannot be decoded") {
		t.Errorf("keys get (bad record): exit %d stdout %q stderr %q; want 1, cannot be decoded", code, out, errOut)
	}

	// list: every record once, without body, headers or sizes; the bad one
	// with its error; the string key and the claim marks skipped. Sorted
	// for comparison.
	got := strings.Split(strings.TrimSpace(upHash.ReplaceAllString(normalise(keysOK(t, env, "list")), `"upstream":"UP"`)), "\n")
	want := []string{
		`{"key_hash":"` + done.String() + `","state":"completed","status":201,"fingerprint":"FP","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"upstream":"UP"}`,
		`{"key_hash":"` + big.String() + `","state":"completed","status":200,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL}`,
		`{"key_hash":"` + binary.String() + `","state":"completed","status":202,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL}`,
		`{"key_hash":"` + inflight.String() + `","state":"in_flight","fingerprint":"` + zeroFP + `","claimed_at":"TIME","lock_expires_at":"TIME","ttl_ms":TTL}`,
		`{"key_hash":"` + locked.String() + `","state":"in_flight","fingerprint":"` + zeroFP + `","claimed_at":"TIME","lock_expires_at":"TIME","ttl_ms":TTL}`,
		`{"key_hash":"` + unknown.String() + `","state":"unknown","status":504,"fingerprint":"` + zeroFP + `","claimed_at":"TIME","completed_at":"TIME","ttl_ms":TTL,"upstream":"0123abcd"}`,
		`{"key_hash":"` + bad.String() + `","state":"completed","fingerprint":"78","ttl_ms":-1,"error":"claim: malformed record: bad header"}`,
	}
	slices.Sort(got)
	slices.Sort(want)
	if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
		t.Errorf("keys list:\n got %s\nwant %s", g, w)
	}
	out := keysOK(t, env, "list", "--state", "in_flight")
	if n := strings.Count(out, "\n"); n != 2 || strings.Count(out, `"state":"in_flight"`) != 2 {
		t.Errorf("keys list --state in_flight: %d lines, want the 2 in flight:\n%s", n, out)
	}
	out = keysOK(t, env, "list", "--state=unknown")
	if !strings.Contains(out, unknown.String()) || strings.Count(out, "\n") != 1 {
		t.Errorf("keys list --state=unknown: %q, want the unknown key only", out)
	}
	out, errOut, code := keysRun(t, env, "list", "--limit", "3")
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(errOut, "stopped at --limit=3") {
		t.Errorf("keys list --limit 3: exit %d, %d lines, stderr %q", code, strings.Count(out, "\n"), errOut)
	}

	// purge: the record goes (one key, one DEL); a claim mark an older
	// version left is read by nothing and stays, to expire; again: nothing
	// there.
	rdb.Set(ctx, rk(inflight)+":m", strconv.FormatInt(now, 10), time.Hour)
	if n, _ := rdb.Exists(ctx, rk(inflight), rk(inflight)+":m").Result(); n != 2 {
		t.Fatalf("in-flight key before purge: %d of record and mark, want 2", n)
	}
	out, errOut, code = keysRun(t, env, "purge", inflight.String())
	if code != 0 || out != `{"key_hash":"`+inflight.String()+`","purged":true}`+"\n" || errOut != "" {
		t.Errorf("keys purge: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if n, _ := rdb.Exists(ctx, rk(inflight)).Result(); n != 0 {
		t.Errorf("after purge: the record is left")
	}
	if n, _ := rdb.Exists(ctx, rk(inflight)+":m").Result(); n != 1 {
		t.Errorf("after purge: the old mark is gone; want it left alone (purge names one key)")
	}
	out, errOut, code = keysRun(t, env, "purge", inflight.String())
	if code != 0 || out != `{"key_hash":"`+inflight.String()+`","purged":false}`+"\n" || !strings.Contains(errOut, "nothing was there") {
		t.Errorf("keys purge again: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if _, errOut, code := keysRun(t, env, "get", inflight.String()); code != 1 || !strings.Contains(errOut, "no record for key_hash") {
		t.Errorf("keys get after purge: exit %d stderr %q", code, errOut)
	}
}

// TestKeysGetMasksSetCookie: a recorded Set-Cookie is the caller's session,
// and keys get goes to an operator's terminal, a ticket or a CI log: its
// values are shown by size only, unless --show-secrets asks for them.
func TestKeysGetMasksSetCookie(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	env := []string{"REDIS_URL=" + srv.URL()}
	s := claim.NewStore(srv.Client(), "idem:", nil)
	k := claim.NewKey([]string{""}, "cookie")
	lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const session = "session=Zq7xCookieS3cret; HttpOnly"
	rec := &claim.Record{Status: 200, Body: []byte("ok"),
		Header:  map[string][]string{"Set-Cookie": {session, "theme=dark"}, "Content-Type": {"text/plain"}},
		Trailer: map[string][]string{"Set-Cookie": {session}}}
	if err := lease.Complete(ctx, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	out := keysOK(t, env, "get", k.String())
	if strings.Contains(out, "Zq7xCookieS3cret") || strings.Contains(out, "theme=dark") {
		t.Errorf("keys get prints recorded Set-Cookie values:\n%s", out)
	}
	if !strings.Contains(out, `"Set-Cookie":["(34 bytes, not shown; --show-secrets shows it)","(10 bytes, not shown; --show-secrets shows it)"]`) ||
		!strings.Contains(out, `"Content-Type":["text/plain"]`) {
		t.Errorf("keys get: want Set-Cookie masked by size and other headers as recorded:\n%s", out)
	}
	out = keysOK(t, env, "get", k.String(), "--show-secrets")
	if strings.Count(out, "Zq7xCookieS3cret") != 2 || !strings.Contains(out, "theme=dark") {
		t.Errorf("keys get --show-secrets: want the recorded values, headers and trailers:\n%s", out)
	}
}

// TestKeysPurgeThenRetry: a purged key executes again, once, and then
// replays that new answer.
func TestKeysPurgeThenRetry(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	a, _ := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")...)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	c := newClient(t)
	waitReplayCacheOn(t, c, a) // else the replay is not cached, and the purge's announcement is not tested
	first := mustPost(t, c, url, "retry-me", `{"a":1}`)
	replay := mustPost(t, c, url, "retry-me", `{"a":1}`)
	if first.status != http.StatusCreated || replay.header.Get("Idempotent-Replayed") != "true" || replay.body != first.body {
		t.Fatalf("before purge: first %d %q, retry %d replayed=%q %q", first.status, first.body, replay.status, replay.header.Get("Idempotent-Replayed"), replay.body)
	}
	hash := strings.TrimSpace(keysOK(t, env, "hash", "retry-me"))
	keysOK(t, env, "purge", hash)
	// The purge reaches this replica's replay cache through Pub/Sub: within
	// a second (the contract's bound), not necessarily before the next request.
	var again response
	deadline := time.Now().Add(time.Second)
	for {
		again = mustPost(t, c, url, "retry-me", `{"a":1}`)
		if again.header.Get("Idempotent-Replayed") == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "" || again.body == first.body {
		t.Errorf("after purge: status %d replayed=%q body %q; want a new execution", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	last := mustPost(t, c, url, "retry-me", `{"a":1}`)
	if last.header.Get("Idempotent-Replayed") != "true" || last.body != again.body {
		t.Errorf("retry after the new execution: replayed=%q body %q, want a replay of %q", last.header.Get("Idempotent-Replayed"), last.body, again.body)
	}
	if n := up.KeyCalls("retry-me"); n != 2 {
		t.Errorf("upstream executed the key %d times, want 2 (once, and once after the purge)", n)
	}
}

// TestKeysPurgeReachesEveryReplica: two proxies on one Redis, each with its
// replay cache (REPLAY_CACHE_BYTES, on by default) holding the record;
// after keys purge, within 1 s neither replays the old answer from memory:
// the first to be asked executes again, the other replays that new answer
// from Redis. (Without the Pub/Sub watch, the caches would replay the
// purged answer for a minute.)
func TestKeysPurgeReachesEveryReplica(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	var urls []string
	c := newClient(t)
	var first response
	for i := range 2 {
		a, _ := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")...)
		urls = append(urls, "http://"+a.proxyAddr.String()+"/v1/orders")
		if r := cachedAnswer(t, c, a, "cached"); i == 0 {
			first = r
		} else if r.body != first.body {
			t.Fatalf("the second replica's answer %q, want a replay of %q", r.body, first.body)
		}
	}
	keysOK(t, env, "purge", strings.TrimSpace(keysOK(t, env, "hash", "cached")))
	purged := time.Now()
	for _, u := range urls {
		for {
			r := mustPost(t, c, u, "cached", `{}`)
			if r.body != first.body {
				break
			}
			if time.Since(purged) > time.Second {
				t.Fatalf("%s still replays the purged answer %q 1s after keys purge", u, r.body)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := up.KeyCalls("cached"); n != 2 {
		t.Errorf("upstream executed the key %d times, want 2", n)
	}
}

// TestKeysNeverPrintAKeyArgument: an argument of keys hash that starts
// with "-" (a base64url key does, one time in 64) is no flag, and the error
// says so without quoting it; so does an unknown command. The flag
// package's own message ("flag provided but not defined: -<key>") used to
// write the key in clear to the operator's terminal, scroll-back or CI log.
func TestKeysNeverPrintAKeyArgument(t *testing.T) {
	for _, args := range [][]string{
		{"hash", "-Zq7xS3cr3tIdempotencyKey"},
		{"hash", "--source", "header:X-Event-Id", "-Zq7xS3cr3tIdempotencyKey"},
		{"hash", "--scope", "Authorization=Bearer t", "-Zq7xS3cr3tIdempotencyKey"},
	} {
		var stdout, stderr bytes.Buffer
		err := runKeys(context.Background(), args, []string{"KEY_PREFIX=idem:"}, &stdout, &stderr)
		if out := stdout.String() + stderr.String(); strings.Contains(out, "Zq7xS3cr3tIdempotencyKey") {
			t.Errorf("keys %s: the key is printed in clear (err %v):\n%s", strings.Join(args, " "), err, firstLine(out))
		}
	}
	var stdout, stderr bytes.Buffer
	_ = runKeys(context.Background(), []string{"-Zq7xS3cr3tIdempotencyKey"}, nil, &stdout, &stderr)
	if strings.Contains(stdout.String()+stderr.String(), "Zq7xS3cr3t") {
		t.Errorf("keys <key>: the argument is printed in clear: %s", firstLine(stderr.String()))
	}
}
