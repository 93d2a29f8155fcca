package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestScopeByHostIsNotSilentlyEmpty
//
// Defect: scope= accepts any name (routes.go, case "scope": only "" and ':'
// are refused) and scopeValues reads r.Header. net/http moves Host out of
// the header map into r.Host, so scope=Host — the natural choice for a
// multi-tenant receiver where each tenant's sender posts to its own domain
// — always yields "": every tenant lands in the one anonymous scope. Message
// ids are only unique per sender (here both tenants' senders number their
// events), so tenant B's delivery "1" is answered with tenant A's recorded
// response (A's data leaks to B, and B's event is never executed). The same
// holds for header:Host in a SOURCE (never present: every delivery is
// forwarded unguarded) and for SCOPE_HEADERS=Host.
//
// Correct: scope by the request's host when Host is named (r.Host), or
// refuse at start, quoting the rule, names the proxy can never see (Host,
// Transfer-Encoding, ...). Here: tenant B's delivery executes.
func TestScopeByHostIsNotSilentlyEmpty(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/orders key=header:X-Event-Id scope=Host")
	if err != nil {
		if strings.Contains(err.Error(), `"POST /hooks/orders key=header:X-Event-Id scope=Host"`) {
			return // refused at start, quoting the rule: an acceptable fix
		}
		t.Fatal(err)
	}
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Routes = routes })
	send := func(host string) *http.Response {
		hr, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.srv.URL+"/hooks/orders", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		hr.Host = host
		hr.Header.Set("X-Event-Id", "1")
		resp, err := e.srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	send("tenant-a.example.com")
	b := send("tenant-b.example.com")
	if b.Header.Get("Idempotent-Replayed") == "true" || e.calls.Load() != 2 {
		t.Errorf("scope=Host: tenant B's event 1 got tenant A's recorded answer (replayed=%q, upstream calls %d, want 2)",
			b.Header.Get("Idempotent-Replayed"), e.calls.Load())
	}
}
