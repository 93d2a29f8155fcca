package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestSourceRefusesNamesThatCanNeverMatch
//
// Defect: ParseKeySource accepts header:NAME whenever NAME is non-empty and
// holds no space, tab, ':' or ','; route scope= likewise accepts any name
// without ':'. A NAME that is not an RFC 9110 token (a stray quote, a
// parenthesis, '/', '@', non-ASCII) can never arrive as a header, so the
// route silently never finds its key: every delivery is forwarded without a
// guarantee (or every one is 400 with required) and the scope is always
// empty. The contract says a malformed SOURCE stops the process at start,
// quoting the rule; a name no request can carry is malformed.
//
// Correct: require NAME to be a token (and, for header:, not one net/http
// strips such as Host or Transfer-Encoding); refuse the rule at start.
func TestSourceRefusesNamesThatCanNeverMatch(t *testing.T) {
	for _, rule := range []string{
		`POST /x key=header:X-Event-Id"`,
		`POST /x key=header:X(Event)`,
		`POST /x key=header:X/Event`,
		`POST /x key=header:X-Évent`,
		`POST /x key=header:Host`,
		`POST /x key=header:X-Event-Id scope=X-Tenant"`,
		`POST /x key=header:X-Event-Id scope=X(Tenant)`,
	} {
		if _, err := proxy.ParseRoutes(rule); err == nil {
			t.Errorf("ROUTES %q accepted: that name can never be read from a request", rule)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", rule)) {
			t.Errorf("ROUTES %q refused without quoting the rule: %v", rule, err)
		}
	}
}

// TestBodyLimitDetailOnDerivedRoute
//
// Defect: on a route whose SOURCE has a json: part every covered request's
// body is read first, so a webhook that sends no Idempotency-Key (and whose
// route never reads that header) gets 413 whose detail says "Requests with
// an Idempotency-Key may carry at most N bytes" (answer.go bodyAnswer). The
// sender's operator is told the limit applies to something the request does
// not carry; the 413 happened because of key=json:....
//
// Correct: on a derived-key route the detail names the route's SOURCE (or
// simply "Requests to this route"), not IDEMPOTENCY_HEADER.
func TestBodyLimitDetailOnDerivedRoute(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/stripe key=stripe-events scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes; o.MaxBodyBytes = 16 })
	r := e.do(req{path: "/hooks/stripe", body: `{"id":"evt_1","object":"event"}`})
	if r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", r.StatusCode)
	}
	if d := fmt.Sprint(r.problem(t)["detail"]); strings.Contains(d, "Idempotency-Key") || !strings.Contains(d, "stripe-events") {
		t.Errorf("413 detail %q: talks about an Idempotency-Key the delivery does not carry, and does not name key=stripe-events", d)
	}
}
