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
// connection breaks after the request was written, the Transport resends it.
func TestKeyedBodilessRequestIsNeverResent(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
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
			e.do(req{method: method, path: "/v1/send-sms"}) // no key: warms a pooled upstream connection
			r := e.do(req{method: method, path: "/v1/send-sms", key: "dup"})
			t.Logf("client got %d %q", r.StatusCode, r.body)
			if n := executed.Load(); n != 1 {
				t.Errorf("DOUBLE EXECUTION: upstream executed keyed %s %d times for one client request", method, n)
			}
		})
	}
}
