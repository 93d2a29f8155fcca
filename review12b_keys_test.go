package main

// review12b: adversarial tests of `idemproxy keys` (issue 12). Each test
// fails on the code under review; see the review report for the fixes.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview12bKeysEndWithinTimeout: against a Redis that accepts
// connections and never answers, every command must end (exit 1) within
// --timeout, in every REDIS_MODE. go-redis ignores the context's deadline
// on the socket (ContextTimeoutEnabled is false) and the HELLO handshake
// waits for its own 5 s timeout: --timeout=1s takes 5 s.
func TestReview12bKeysEndWithinTimeout(t *testing.T) {
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

// TestReview12bKeysHashScopeEdges: keys hash must print the access log's
// key_hash for every request the proxy takes. Two scope cases differ:
//   - a scope header sent twice whose first value is empty: the proxy joins
//     ["", "acme"] into "\nacme"; keys hash --scope X-Tenant= --scope
//     X-Tenant=acme skips the separator for an empty first value ("acme");
//   - SCOPE_HEADERS naming one header twice (X-Tenant,x-tenant, accepted by
//     the config): the proxy fills both slots, keys hash only the first.
func TestReview12bKeysHashScopeEdges(t *testing.T) {
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
			a, logs := startEnv(t, append(env, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")...)
			req, _ := http.NewRequest(http.MethodPost, "http://"+a.proxyAddr.String()+"/v1/orders", strings.NewReader(`{}`))
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

// TestReview12bKeysNeverEchoSecrets: "Nothing is printed in clear that the
// proxy hashes (keys, scope values)". The likeliest operator slip, passing
// the idempotency key itself instead of its key_hash to get or purge, and a
// --scope without NAME=, echo the key / the credential on stderr (which
// ends up in shell history captures, CI logs, kubectl exec transcripts).
func TestReview12bKeysNeverEchoSecrets(t *testing.T) {
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

// TestReview12bKeysGetEscapesC1Controls: recorded header values come from
// the upstream (obs-text is legal in a field value) and keys get prints
// them to an operator's terminal. encoding/json escapes C0 controls
// (ESC becomes \u001b) but not DEL nor the C1 controls U+0080-U+009F:
// U+009B is CSI, U+009D OSC (terminal title, OSC 52 clipboard), which
// terminals that honour C1 controls execute. Output for a terminal and for
// jq must carry them escaped (\u009b), as it does ESC.
func TestReview12bKeysGetEscapesC1Controls(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	ctx := context.Background()
	s := claim.NewStore(srv.Client(), "idem:", nil)
	k := claim.NewKey([]string{""}, "c1")
	lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hostile := "ok\u009b2J\u009d0;pwned\u009c\x7f\x1b[31m"
	if err := lease.Complete(ctx, &claim.Record{Status: 200, Header: map[string][]string{"X-Note": {hostile}}}, time.Hour); err != nil {
		t.Fatal(err)
	}
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
