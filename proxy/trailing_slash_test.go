package proxy_test

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestTrailingSlashStillMatchesWildcardRule: path.Clean drops the trailing
// slash, so "/v1/payments/" no longer matches "POST /v1/payments/*" (chi's
// wildcard needs the slash). Before the change it matched. A PUT rule (PUT
// not in METHODS) then stops covering PUT /v1/orders/ entirely.
func TestTrailingSlashStillMatchesWildcardRule(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /v1/payments/* required; PUT /v1/orders/*")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	r := e.do(req{path: "/v1/payments/", body: "x"}) // no key on a "required" route
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("POST /v1/payments/ without key: %d, want 400 (rule POST /v1/payments/* required)", r.StatusCode)
	}
	e.do(req{method: http.MethodPut, path: "/v1/orders/", key: "k", body: "x"})
	r = e.do(req{method: http.MethodPut, path: "/v1/orders/", key: "k", body: "x"})
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("PUT /v1/orders/ with a key executed twice (upstream calls %d): rule PUT /v1/orders/* not applied", e.calls.Load())
	}
}
