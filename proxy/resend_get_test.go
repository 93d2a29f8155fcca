package proxy_test

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestKeyedBodilessRequestIsNeverResent: a ROUTES rule may cover GET (a legacy API with
// a non-idempotent GET). A keyed GET has no body, so ReverseProxy sends it
// with Body=nil: the Transport's rewindBody never calls the GetBody guard, and
// isReplayable is true for GET whatever the header's case. When the pooled
// connection breaks after the request was written, the Transport resends it
// (GET, HEAD, OPTIONS asking GetBody: the write counter has moved, and the
// resend is refused).
func TestKeyedBodilessRequestIsNeverResent(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			upstream, executed := hangUpOnce(t, "dup")
			routes, err := proxy.ParseRoutes(method + " /v1/send-sms")
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Upstream = upstream
				o.Routes = routes
			})
			// No key, and a GET whatever the method: a pooled connection.
			e.do(req{method: http.MethodGet, path: "/v1/send-sms"})
			r := e.do(req{method: method, path: "/v1/send-sms", key: "dup"})
			t.Logf("client got %d %q", r.StatusCode, r.body)
			if r.StatusCode != http.StatusBadGateway {
				t.Errorf("status %d, want 502", r.StatusCode)
			}
			if n := executed.Load(); n != 1 {
				t.Errorf("DOUBLE EXECUTION: upstream executed keyed %s %d times for one client request", method, n)
			}
		})
	}
}
