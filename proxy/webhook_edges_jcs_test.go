package proxy_test

import (
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestJSONFingerprintKeepsNumberPrecision
//
// Defect: fingerprint=json hashes jcs.Transform(body), and RFC 8785 writes
// every number as the IEEE-754 double nearest to it. Distinct JSON numbers
// that round to one double therefore compare equal: 64-bit ids above 2^53
// (Shopify, Twitter/Discord snowflakes: 820982911946154508 and ...509), or
// a value that underflows (1e-400 and 0). A key reused for a request that
// targets another account is then replayed the first answer instead of
// getting 422 — exactly the mistake the fingerprint is there to catch. The
// jcs fallback to bytes already exists for numbers out of range (1e400); it
// does not trigger for numbers that lose precision.
//
// Correct: a body whose numbers do not survive the round trip through a
// double (RFC 8785 section 3.2.2.3 / I-JSON: such data is outside JCS's
// domain) is compared as bytes (or numbers are kept as their exact decimal
// value); the second request here gets 422 naming fingerprint=json.
func TestJSONFingerprintKeepsNumberPrecision(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /v1/transfers fingerprint=json")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	for i, c := range []struct{ first, retry string }{
		{`{"to_account":820982911946154508,"amount":100}`, `{"to_account":820982911946154509,"amount":100}`},
		{`{"to_account":1,"fee":1e-400}`, `{"to_account":1,"fee":0}`},
	} {
		key := "k" + string(rune('a'+i))
		if r := e.do(req{path: "/v1/transfers", key: key, body: c.first}); r.StatusCode != http.StatusCreated {
			t.Fatalf("first: %d", r.StatusCode)
		}
		r := e.do(req{path: "/v1/transfers", key: key, body: c.retry})
		if r.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("%s then %s with one key: %d replayed=%q, want 422 (another body)", c.first, c.retry, r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
	}
	if got := e.calls.Load(); got != 2 {
		t.Errorf("upstream calls %d, want 2", got)
	}
}

// TestJSONFingerprintMemoryBounded
//
// Defect: with fingerprint=json every keyed request's body goes through
// jcs.Transform, which builds a tree of 72-byte nodes (plus a UTF-16 sort
// key per member) for the whole document. A 1 MiB body of "[0,0,0,...]"
// makes it allocate ~90 MiB; "[{},{},...]" ~50 MiB. Any client that sends
// any key can do this, once per request, concurrently: the memory bound the
// proxy documents for keyed requests (MAX_BODY_BYTES each, which is why the
// variable is capped at 64 MiB) no longer holds by two orders of magnitude.
//
// Correct: canonicalise without materialising a per-value tree (stream the
// tokens into the hash, sorting member spans only), or cap the work, so
// fingerprint=json costs O(body) extra memory: here, at most 8x the body
// beyond what the same request costs with fingerprint=strict.
func TestJSONFingerprintMemoryBounded(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /json fingerprint=json; POST /strict")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	body := "[" + strings.Repeat("0,", 1<<19-2) + "0]" // just under 1 MiB, the default MAX_BODY_BYTES
	alloc := func(path, key string) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := e.do(req{path: path, key: key, body: body})
		runtime.ReadMemStats(&after)
		if r.StatusCode != http.StatusCreated {
			t.Fatalf("%s: %d %s", path, r.StatusCode, r.body)
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	alloc("/strict", "warm") // warm pools, connections, series
	strict := alloc("/strict", "s1")
	json := alloc("/json", "j1")
	if extra := int64(json) - int64(strict); extra > 8*int64(len(body)) {
		t.Errorf("a %d-byte keyed body allocates %d MiB with fingerprint=json vs %d MiB with strict: %dx the body extra, want at most 8x",
			len(body), json>>20, strict>>20, extra/int64(len(body)))
	}
}
