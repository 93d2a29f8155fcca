package proxy_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestJSONPartDistinctIdsDoNotCollide
//
// Defect: a json: part is read by decoding the body with encoding/json
// (jsonpointer_tmp.go jsonPointerValue), which replaces every ill-formed
// UTF-16 escape (a lone surrogate such as \ud800 or \udbff) and every
// invalid UTF-8 byte with U+FFFD; json.Valid accepts both. Distinct message
// ids therefore derive one key: with the stripe-events preset and the
// recommended fingerprint=none, the second message is answered with the
// first one's recorded 2xx and never reaches the upstream — the sender
// counts it delivered and it is lost. (With strict it gets 422 forever.)
// jcs.Transform, used for the fingerprint, rejects exactly these inputs.
//
// Correct: a member whose string is not well-formed (lone surrogate
// escape, invalid UTF-8) counts as absent (or 400 key-invalid), or the key
// uses the member's exact source bytes; two different ids never share a key.
func TestJSONPartDistinctIdsDoNotCollide(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/stripe key=stripe-events scope= fingerprint=none")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Routes = routes })
	for _, pair := range [][2]string{
		{`{"id":"evt_\ud800","type":"a"}`, `{"id":"evt_\udbff","type":"b"}`},
		{"{\"id\":\"evt2_\xff\",\"type\":\"a\"}", "{\"id\":\"evt2_\xfe\",\"type\":\"b\"}"},
	} {
		before := e.calls.Load()
		e.do(req{path: "/hooks/stripe", body: pair[0]})
		second := e.do(req{path: "/hooks/stripe", body: pair[1]})
		if second.Header.Get("Idempotent-Replayed") == "true" || e.calls.Load()-before != 2 {
			t.Errorf("%q then %q: the second, another message, was replayed=%q (upstream calls %d, want 2): both ids decode to U+FFFD and share a key",
				pair[0], pair[1], second.Header.Get("Idempotent-Replayed"), e.calls.Load()-before)
		}
	}
}

// TestJSONPointerArrayIndexGrammar
//
// Defect: an array reference token is parsed with strconv.Atoi, which
// accepts "-0"; only leading '0' is refused. RFC 6901 section 4:
// array-index = %x30 / ( %x31-39 *(%x30-39) ); "-0" is not an index, so
// json:/items/-0/id must find nothing in an array (and "-" alone means the
// nonexistent element after the last). Today it reads items[0].
//
// Correct: accept only the RFC's array-index grammar; /items/-0/id is
// absent, the request has no key and each is forwarded.
func TestJSONPointerArrayIndexGrammar(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/items key=json:/items/-0/id scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	body := `{"items":[{"id":"first"}]}`
	e.do(req{path: "/hooks/items", body: body})
	r := e.do(req{path: "/hooks/items", body: body})
	if r.Header.Get("Idempotent-Replayed") == "true" || e.calls.Load() != 2 {
		t.Errorf("json:/items/-0/id matched items[0] (replayed=%q, upstream calls %d): -0 is not an RFC 6901 array index",
			r.Header.Get("Idempotent-Replayed"), e.calls.Load())
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/hooks/items", "outcome": "no_key"}); got != 2 {
		t.Errorf("no_key count %v, want 2", got)
	}
}
