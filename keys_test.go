package main

// Tests of keys.go, the `idemproxy keys` operator command, through run as
// the binary runs it: its usage and failures, hash against the access log's
// key_hash, get, list, purge and forget against real redis-server processes,
// beside proxies started in-process. Against Cluster and Sentinel, and as a
// subprocess: internal/e2e.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
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

// TestKeysNeverEchoSecrets: "Nothing is printed in clear that the proxy
// hashes (keys, scope values)". The likeliest operator slips, passing the
// idempotency key itself instead of its key_hash to get or purge, and a
// --scope without NAME=, used to echo the key / the credential on stderr
// (which ends up in shell history captures, CI logs, kubectl exec
// transcripts).
func TestKeysNeverEchoSecrets(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	const secretKey = "pay_7f3a9c-customer-4711"
	const secretScope = "Bearer-sk_live_51HxYzSECRET"
	for _, args := range [][]string{
		{"get", secretKey},
		{"purge", secretKey},
		{"hash", "--scope", secretScope, "k"},
	} {
		out, errOut, code := keysRun(t, env, args...)
		if code != 2 {
			t.Errorf("keys %q: exit %d, want 2", args, code)
		}
		for _, s := range []string{secretKey, secretScope} {
			if strings.Contains(out+errOut, s) {
				t.Errorf("keys %q prints %q in clear:\n%s", args, s, errOut)
			}
		}
	}
}

// TestKeysEndWithinTimeout: against a Redis that accepts connections and
// never answers, every command must end (exit 1) within --timeout, in every
// REDIS_MODE. By default go-redis ignores the context's deadline on the
// socket (ContextTimeoutEnabled is false) and the HELLO handshake waits for
// its own 5 s timeout: --timeout=1s took 5 s.
func TestKeysEndWithinTimeout(t *testing.T) {
	addr := blackHole(t)
	const hash = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	standalone := []string{"REDIS_URL=redis://" + addr + "/0"}
	cluster := []string{"REDIS_MODE=cluster", "REDIS_ADDRS=" + addr}
	sentinel := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + addr, "REDIS_MASTER_NAME=mymaster"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"standalone get", standalone, []string{"get", hash, "--timeout=1s"}},
		{"standalone list", standalone, []string{"list", "--timeout=1s"}},
		{"standalone purge", standalone, []string{"purge", hash, "--timeout=1s"}},
		{"cluster list", cluster, []string{"list", "--timeout=1s"}},
		{"cluster purge", cluster, []string{"purge", hash, "--timeout=1s"}},
		{"sentinel get", sentinel, []string{"get", hash, "--timeout=1s"}},
		{"sentinel list", sentinel, []string{"list", "--timeout=1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			out, errOut, code := keysRun(t, tc.env, tc.args...)
			took := time.Since(start)
			if code != 1 || out != "" {
				t.Errorf("keys %q: exit %d stdout %q; want exit 1, nothing on stdout", tc.args, code, out)
			}
			if took > 1500*time.Millisecond {
				t.Errorf("keys %q against a Redis that never answers took %v with --timeout=1s (stderr %q)", tc.args, took.Round(time.Millisecond), errOut)
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
	a, logs := startProxy(t, up.URL, append(env, "ROUTES=POST /hooks/ce key=cloudevents; POST /hooks/gh key=github scope=X-Tenant; POST /hooks/signed key=github scope= verify=GH_SECRET",
		"GH_SECRET=It's a Secret to Everybody", "ADMIN_ADDR=")...)
	base := proxyURL(a, "")
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
		// GitHub's signature covers the body, not the delivery id: with
		// verify= the key holds the body's SHA-256 too.
		{"github, verified: bound to the body", "/hooks/signed",
			map[string]string{"X-GitHub-Delivery": "d-2", "X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}, "Hello, World!",
			[]string{"--source", "github", "--route-scope=", "--body-sha256", "dffd6021bb2bd5b0af676290809ec3a53191dd81c7f70a4b28688a362182986f", "d-2"}},
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

// TestKeysHashScopeEdges: keys hash must print the access log's
// key_hash for every request the proxy takes. Two scope cases differed:
//   - a scope header sent twice whose first value is empty: the proxy joins
//     ["", "acme"] into "\nacme"; keys hash --scope X-Tenant= --scope
//     X-Tenant=acme skips the separator for an empty first value ("acme");
//   - SCOPE_HEADERS naming one header twice (X-Tenant,x-tenant, accepted by
//     the config): the proxy fills both slots, keys hash only the first.
func TestKeysHashScopeEdges(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		scope  string
		header []string // X-Tenant values, in order
		args   []string
	}{
		{"repeated scope header, first value empty", "X-Tenant", []string{"", "acme"},
			[]string{"--scope", "X-Tenant=", "--scope", "X-Tenant=acme", "k-empty-first"}},
		{"SCOPE_HEADERS names a header twice", "X-Tenant,x-tenant", []string{"acme"},
			[]string{"--scope", "X-Tenant=acme", "k-dup-scope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			env := []string{"REDIS_URL=" + srv.URL(), "SCOPE_HEADERS=" + tc.scope}
			a, logs := startProxy(t, up.URL, append(env, "ADMIN_ADDR=")...)
			req, _ := http.NewRequest(http.MethodPost, proxyURL(a, "/v1/orders"), strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", tc.args[len(tc.args)-1])
			req.Header["X-Tenant"] = tc.header
			res, err := newClient(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusCreated {
				t.Fatalf("POST: status %d", res.StatusCode)
			}
			logged := lastKeyHash(t, logs.String())
			if got := strings.TrimSpace(keysOK(t, env, append([]string{"hash"}, tc.args...)...)); got != logged {
				t.Errorf("keys hash %q = %s, the access log says %s", tc.args, got, logged)
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
	a, _ := startProxy(t, up.URL, append(env, "ADMIN_ADDR=")...)
	c := newClient(t)
	if r := mustPost(t, c, proxyURL(a, "/v1/orders"), "done", `{"amount":1}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d", r.status)
	}
	done := claim.NewKey([]string{""}, "done")

	s := claim.NewStore(rdb, "idem:", nil)
	big := claim.NewKey([]string{""}, "big")
	storeRecord(t, s, big, &claim.Record{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}, BodyNotStored: true})
	binary := claim.NewKey([]string{""}, "binary")
	rawBody := []byte{0, 1, 2, 0xff, '\n', '<'}
	storeRecord(t, s, binary, &claim.Record{Status: 202, Body: rawBody, Trailer: map[string][]string{"X-Checksum": {"abc"}}})
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
	env := []string{"REDIS_URL=" + srv.URL()}
	s := claim.NewStore(srv.Client(), "idem:", nil)
	k := claim.NewKey([]string{""}, "cookie")
	const session = "session=Zq7xCookieS3cret; HttpOnly"
	storeRecord(t, s, k, &claim.Record{Status: 200, Body: []byte("ok"),
		Header:  map[string][]string{"Set-Cookie": {session, "theme=dark"}, "Content-Type": {"text/plain"}},
		Trailer: map[string][]string{"Set-Cookie": {session}}})
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

// TestKeysGetEscapesC1Controls: recorded header values come from
// the upstream (obs-text is legal in a field value) and keys get prints
// them to an operator's terminal. encoding/json escapes C0 controls
// (ESC becomes \u001b) but not DEL nor the C1 controls U+0080-U+009F:
// U+009B is CSI, U+009D OSC (terminal title, OSC 52 clipboard), which
// terminals that honour C1 controls execute. Output for a terminal and for
// jq must carry them escaped (\u009b), as it does ESC.
func TestKeysGetEscapesC1Controls(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	s := claim.NewStore(srv.Client(), "idem:", nil)
	k := claim.NewKey([]string{""}, "c1")
	hostile := "ok\u009b2J\u009d0;pwned\u009c\x7f\x1b[31m"
	storeRecord(t, s, k, &claim.Record{Status: 200, Header: map[string][]string{"X-Note": {hostile}}})
	out := keysOK(t, env, "get", k.String())
	var j struct {
		Headers map[string][]string `json:"headers"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.Headers["X-Note"][0] != hostile {
		t.Fatalf("keys get: not the recorded value through JSON: %v %q", err, out)
	}
	for _, r := range out {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) || r < 0x20 && r != '\n' {
			t.Errorf("keys get prints the control character %U raw: %q", r, out)
		}
	}
}

// TestKeysGetShowsExecutionTrace: the execution's trace id is kept with the
// record (field tr) so that an operator can go from a key to the
// execution's trace; `idemproxy keys get`, the tool the runbook sends them
// to, shows it.
func TestKeysGetShowsExecutionTrace(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "idem:", nil)
	k := claim.NewKey([]string{""}, "traced")
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	storeRecord(t, s, k, &claim.Record{Status: 201, Body: []byte(`{}`), Trace: tr})
	if got := rdb.HGet(ctx, "idem:{"+k.String()+"}", "tr").Val(); got != tr {
		t.Fatalf("field tr: got %q, want %q", got, tr)
	}
	out := keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "get", k.String())
	if !strings.Contains(out, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("keys get: the execution's trace id is not shown; got\n%s", out)
	}
}

// TestKeysStringRecords: idemproxy keys reads records kept as strings
// (RECORD_FORMAT=string) as it reads hashes, and marks them "format":"string",
// so that an operator can find them before rolling back past this version.
func TestKeysStringRecords(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	strProxy, strLog := startProxy(t, up.URL, append(env, "RECORD_FORMAT=string", "ADMIN_ADDR=")...)
	hashProxy, hashLog := startProxy(t, up.URL, append(env, "ADMIN_ADDR=")...)
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
		if r := mustPost(t, c, proxyURL(p.a, "/v1/orders"), p.key, `{"amount":1}`); r.status != http.StatusCreated {
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
	r := mustPost(t, c, proxyURL(strProxy, "/v1/orders"), "as-string", `{"amount":1}`)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || up.KeyCalls("as-string") != 2 {
		t.Errorf("POST after purge: %d, Idempotent-Replayed %q, the key ran %d times in all; want executed, twice in all",
			r.status, r.header.Get("Idempotent-Replayed"), up.KeyCalls("as-string"))
	}
	if typ := srv.Client().Type(context.Background(), "idem:{"+str.String()+"}").Val(); typ != "string" {
		t.Errorf("after purge and a new execution: a Redis %s, want string", typ)
	}
}

// TestKeysShowRecordFormat: the README's rollback past this version ("Record
// format"): "first set RECORD_FORMAT=hash everywhere and wait for the longest
// TTL, or purge the keys still held as strings". The operator's tool for
// finding keys is `idemproxy keys list` / `get`, so both must say which form
// a record is kept in: when a string record and a hash record printed the
// same line, the keys "still held as strings" could not be found (an older
// binary's `keys list` skips them silently: it takes any non-hash for "not a
// record").
func TestKeysShowRecordFormat(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	env := []string{"REDIS_URL=" + srv.URL()}
	keys := map[string]claim.Key{}
	for _, form := range []string{"hash", "string"} {
		s := claim.NewStore(rdb, "idem:", nil, claim.StringRecords(form == "string"))
		k := claim.NewKey([]string{""}, "form-"+form)
		keys[form] = k
		storeRecord(t, s, k, &claim.Record{Status: 201, Body: []byte("ok")})
		if typ := rdb.Type(ctx, claim.RecordKey("idem:", k)).Val(); typ != form {
			t.Fatalf("%s store wrote a Redis %s", form, typ)
		}
	}
	line := func(out string, k claim.Key) string {
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, k.String()) {
				return strings.ReplaceAll(normalise(l), k.String(), "KEY")
			}
		}
		t.Fatalf("no line for %s in %q", k, out)
		return ""
	}
	list := keysOK(t, env, "list")
	h, s := line(list, keys["hash"]), line(list, keys["string"])
	if h == s {
		t.Errorf("keys list prints a hash record and a string record alike:\n hash   %s\n string %s\nwant the form shown, so that the README's rollback step (purge the keys still held as strings) can be done", h, s)
	}
	hg, sg := line(keysOK(t, env, "get", keys["hash"].String()), keys["hash"]), line(keysOK(t, env, "get", keys["string"].String()), keys["string"])
	if hg == sg {
		t.Errorf("keys get prints a hash record and a string record alike:\n hash   %s\n string %s", hg, sg)
	}
}

// TestKeysPurgeState: `keys purge --state` deletes only a record in that
// state; otherwise it prints the state found, deletes nothing and exits 1.
// A bad --state is a usage error, and so is `--state ""` (a script's unset
// variable), never a purge without a check (it used to delete whatever
// was there).
func TestKeysPurgeState(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "idem:", nil)
	k := completedKey(t, s, "purge-state")
	hash := k.String()

	out, errOut, code := keysRun(t, env, "purge", hash, "--state", "in_flight")
	if code != 1 || strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":false,"state":"completed"}` ||
		!strings.Contains(errOut, "its record is completed, not --state=in_flight") {
		t.Errorf("purge --state in_flight of a completed record: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 1 {
		t.Fatal("the refused purge deleted the record")
	}
	out = keysOK(t, env, "purge", "--state", "completed", hash)
	if strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":true}` {
		t.Errorf("purge --state completed: %s", out)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 0 {
		t.Error("the record is still there after purge --state completed")
	}
	out, errOut, code = keysRun(t, env, "purge", hash, "--state", "completed")
	if code != 1 || !strings.Contains(out, `"state":""`) || !strings.Contains(errOut, "no record") {
		t.Errorf("purge --state of no record: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if _, errOut, code = keysRun(t, env, "purge", hash, "--state", "done"); code != 2 || !strings.Contains(errOut, `--state="done"`) {
		t.Errorf("purge --state done: exit %d, stderr %s; want a usage error naming the value", code, errOut)
	}
	for _, args := range [][]string{{"--state", ""}, {"--state="}} {
		k := completedKey(t, s, "empty-state-"+strings.Join(args, ""))
		out, errOut, code := keysRun(t, env, append([]string{"purge", k.String()}, args...)...)
		n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result()
		if code != 2 || n != 1 {
			t.Errorf("keys purge %q of a completed record: exit %d, record left %d\nstdout %s\nstderr %s\nwant a usage error (exit 2) and the record kept",
				args, code, n, out, errOut)
		}
	}
}

// TestKeysPurgeStateMalformedRecord: a record whose answer does not decode
// still has a state: `list --state` shows it (with its error) and `purge
// --state` judges it by that. (list --state used to leave it out, and purge
// failed with a message blaming Redis, leaving the runbook stuck.)
func TestKeysPurgeStateMalformedRecord(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	rdb := srv.Client()
	ctx := context.Background()
	for _, c := range []struct{ state, st, rec string }{
		{"completed", "c", "garbage"},
		{"unknown", "u", "abc"},
	} {
		k := claim.NewKey(nil, "malformed-"+c.state)
		rdb.HSet(ctx, claim.RecordKey("idem:", k), "st", c.st, "fp", "x", "rec", c.rec)
		for _, args := range [][]string{{"list"}, {"list", "--state", c.state}} {
			list := keysOK(t, env, args...)
			if !strings.Contains(list, `"key_hash":"`+k.String()+`","state":"`+c.state+`"`) || !strings.Contains(list, `"error":`) {
				t.Fatalf("keys %v does not show the record as %s, with its error: %s", args, c.state, list)
			}
		}
		out, errOut, code := keysRun(t, env, "purge", "--state", c.state, k.String())
		n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result()
		if code != 0 || n != 0 {
			t.Errorf("keys purge --state %s of a record `keys list` shows as %s: exit %d, record left %d\nstdout %q\nstderr %s",
				c.state, c.state, code, n, out, errOut)
		}
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

// TestKeysPurgeThenRetry: a purged key executes again, once, and then
// replays that new answer.
func TestKeysPurgeThenRetry(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	a, _ := startProxy(t, up.URL, env...)
	url := proxyURL(a, "/v1/orders")
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
		a, _ := startProxy(t, up.URL, env...)
		urls = append(urls, proxyURL(a, "/v1/orders"))
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

// Each way a purge can fail tells the operator what happened to the record
// and what reaches the replicas' caches now. Purging again is not always
// safe: a request may have executed and been recorded since.

// TestKeysPurgeOfNothingUnannounced: nothing to delete, and the PUBLISH
// refused: purged:false on stdout, and keys forget named.
func TestKeysPurgeOfNothingUnannounced(t *testing.T) {
	srv := redistest.Start(t)
	nopub := noPublishUser(t, srv)
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "hash", "never-claimed"))
	out, errOut, code := keysRun(t, nopub, "purge", hash)
	if code != 1 || strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":false}` || !strings.Contains(errOut, "nothing to delete for "+hash+", and could not announce") ||
		!strings.Contains(errOut, "REDIS_URL=") || !strings.Contains(errOut, "keys forget "+hash+" tells the replicas") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("purge of nothing, announcement refused: exit %d\nstdout %s\nstderr %s\nwant exit 1, purged:false, one line naming the Redis and keys forget", code, out, errOut)
	}
}

// TestKeysPurgeLostReply: the DEL reaches Redis, which runs it, but its
// reply is lost (a network cut; here a relay that drops every reply after
// the DEL). The purge gives up at --timeout; it cannot know whether the
// record is gone, so it says how to find out and what to do either way.
func TestKeysPurgeLostReply(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t)
	a, _ := startProxy(t, up.URL, "REDIS_URL="+srv.URL())
	c := newClient(t)
	url := proxyURL(a, "/v1/orders")
	const key = "lostreply"
	first := cachedAnswer(t, c, a, key)
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "hash", key))
	k, err := claim.ParseKeyHash(hash)
	if err != nil {
		t.Fatal(err)
	}
	relay := replyDroppingRelay(t, srv.Addr(), []byte("\r\ndel\r\n"))
	out, errOut, code := keysRun(t, []string{"REDIS_URL=redis://" + relay + "/0"}, "purge", "--timeout", "2s", hash)
	if code != 1 || out != "" {
		t.Fatalf("purge with its reply lost: exit %d, stdout %q; want exit 1 at --timeout, nothing on stdout", code, out)
	}
	if n, _ := srv.Client().Exists(context.Background(), claim.RecordKey("idem:", k)).Result(); n != 0 {
		t.Fatalf("the DEL did not run: this test shows nothing")
	}
	if r := mustPost(t, c, url, key, `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" || r.status != http.StatusCreated {
		t.Fatalf("the proxy's cache no longer replays (%d): this test shows nothing", r.status)
	}
	for _, want := range []string{"--timeout=2s", "the delete may have run all the same", "keys get " + hash, "purge again then", "keys forget " + hash + " tells the replicas"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

// replyDroppingRelay relays TCP to addr; once a client sends a command
// containing marker (bytes of its RESP form), every later reply to that
// client is dropped, as on a network cut after the request got through.
func replyDroppingRelay(t *testing.T, addr string, marker []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for range 20 { // bounded: the command's connections and retries
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", addr)
			if err != nil {
				_ = cc.Close()
				return
			}
			t.Cleanup(func() { _ = cc.Close(); _ = sc.Close() })
			var cut atomic.Bool
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := cc.Read(buf)
					if n > 0 {
						if bytes.Contains(bytes.ToLower(buf[:n]), marker) {
							cut.Store(true)
						}
						if _, werr := sc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = sc.Close()
						return
					}
				}
			}()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := sc.Read(buf)
					if n > 0 && !cut.Load() {
						if _, werr := cc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = cc.Close()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

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
	a, _ := startProxy(t, up.URL, "REDIS_URL="+srv.URL())
	b, _ := startProxy(t, up.URL, "REDIS_URL="+srv.URL())
	c := newClient(t)
	urlA := proxyURL(a, "/v1/orders")
	urlB := proxyURL(b, "/v1/orders")
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

// TestKeysForgetHeardByNobody: keys forget run with another KEY_PREFIX
// than the proxies' publishes where nobody listens; Redis says 0
// receivers, and the command says so (exit 0: the announcement was made).
func TestKeysForgetHeardByNobody(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	startProxy(t, up.URL, "REDIS_URL="+srv.URL(), "KEY_PREFIX=orders:")
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL(), "KEY_PREFIX=orders:"}, "hash", "nobody"))
	testutil.Eventually(t, 5*time.Second, "the proxy's purge subscription", func() bool {
		n, err := srv.Client().PubSubNumSub(context.Background(), "orders:purge").Result()
		return err == nil && n["orders:purge"] == 1
	})
	out, errOut, code := keysRun(t, []string{"REDIS_URL=" + srv.URL()}, "forget", hash) // KEY_PREFIX left at its default
	if code != 0 || !strings.Contains(out, `"announced":true`) || !strings.Contains(errOut, `no proxy is subscribed to idem:purge on this Redis: check that KEY_PREFIX="idem:"`) {
		t.Errorf("forget under another KEY_PREFIX: exit %d\nstdout %s\nstderr %s\nwant the note that nobody listens, naming KEY_PREFIX", code, out, errOut)
	}
	out, errOut, code = keysRun(t, []string{"REDIS_URL=" + srv.URL(), "KEY_PREFIX=orders:"}, "forget", hash)
	if code != 0 || !strings.Contains(out, `"announced":true`) || errOut != "" {
		t.Errorf("forget under the proxies' KEY_PREFIX: exit %d\nstdout %s\nstderr %s\nwant no note", code, out, errOut)
	}
}

// TestKeysRunsWithoutTheWebhookSecrets: idemproxy keys reads the proxies'
// environment for Redis and KEY_PREFIX (UPSTREAM_URL is not needed, the
// contract says). An operator who runs it from a workstation or a bastion
// with the proxies' ConfigMap (ROUTES included) has no business holding the
// senders' signing secrets, and the command uses none of them: it must not
// refuse to list or purge keys because a verify= variable is unset there,
// which would push operators to copy webhook secrets onto every machine
// they inspect Redis from.
func TestKeysRunsWithoutTheWebhookSecrets(t *testing.T) {
	srv := redistest.Start(t)
	environ := []string{
		"REDIS_URL=" + srv.URL(),
		"ROUTES=POST /hooks/github key=github scope= verify=GITHUB_WEBHOOK_SECRET",
	}
	var stdout, stderr bytes.Buffer
	if err := runKeys(context.Background(), []string{"list"}, environ, &stdout, &stderr); err != nil {
		t.Errorf("keys list with the proxies' ROUTES but without the webhook secret: %v\nstderr: %s", err, stderr.String())
	}
}
