package proxy_test

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestQueryPartNotSilentlyDropped
//
// Defect: a query: part is read with r.URL.Query() (keysource.go derive,
// partQuery), which silently drops every pair url.ParseQuery rejects: a pair
// holding ';' ("invalid semicolon separator") or a bad %-escape. The
// message id is in the URL, the upstream (any WHATWG/RFC 3986 parser splits
// on '&' only) sees it, but the proxy sees no key: the request is "as if no
// key was sent" and forwarded without any guarantee, so every redelivery of
// the same message executes again — silently (outcome no_key).
//
// Correct: a parameter that is present is never treated as absent. Either
// take the pair as the upstream does (split on '&' only: id = "evt;1") or
// answer 400 key-invalid naming the part; never forward it unguarded. Here:
// the second identical delivery must not execute.
func TestQueryPartNotSilentlyDropped(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/q key=query:id scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Routes = routes })
	for _, q := range []string{"id=evt;1", "id=evt%zz1"} {
		before := e.calls.Load()
		first := e.do(req{path: "/hooks/q?" + q, body: "{}"})
		redo := e.do(req{path: "/hooks/q?" + q, body: "{}"})
		if n := e.calls.Load() - before; n > 1 {
			t.Errorf("?%s: upstream executed the same delivery %d times (statuses %d, %d, replayed %q): the id parameter was dropped and the request forwarded without a key",
				q, n, first.StatusCode, redo.StatusCode, redo.Header.Get("Idempotent-Replayed"))
		}
	}
}

// TestQueryPartExactlyOnceCountsRejectedPairs
//
// Defect: "query:NAME — exactly one occurrence, else 400". The count is
// taken after url.ParseQuery dropped the pairs it rejects, so
// ?id=a&id=b;c counts one id ("a") and is keyed by it, while the upstream
// sees two id parameters (a, and "b;c") and may act on either. The rule
// exists so that two readings of one request never share a record.
//
// Correct: 400 key-invalid (the part appears twice).
func TestQueryPartExactlyOnceCountsRejectedPairs(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/q key=query:id scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	r := e.do(req{path: "/hooks/q?id=a&id=b;c", body: "{}"})
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("?id=a&id=b;c: %d (upstream calls %d), want 400 key-invalid: id appears twice", r.StatusCode, e.calls.Load())
	}
}
