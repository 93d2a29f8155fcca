package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestKeyPartOrderDoesNotChangeTheAnswer (review17a)
//
// The defect it guards against: KeySource.derive checked each part (repeated, empty, too long,
// bad ce-* escape) as soon as it read it and answered 400 at once, but
// skipped to the next alternative as soon as it meets an absent part. So
// whether an unusable part of an incomplete alternative refuses the request
// depends on whether it is written before or after the absent part: one
// request (X-A empty, X-B absent, a JSON body with an id) gets 400 from
// key=header:X-A+header:X-B|json:/id and is keyed (201, then replayed) by
// key=header:X-B+header:X-A|json:/id.
//
// Contract (Part 2): "A SOURCE is one or more parts joined by + (all parts
// must be present: one composite key)"; "the first alternative whose parts
// are all present is used". Nothing there depends on the order of the
// parts inside a composite; whichever reading of "each part must be 1 to
// MAX_KEY_LENGTH bytes" is taken, both routes must answer alike.
func TestKeyPartOrderDoesNotChangeTheAnswer(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /ab key=header:X-A+header:X-B|json:/id scope=;" +
		"POST /ba key=header:X-B+header:X-A|json:/id scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	for _, h := range []http.Header{
		{"X-A": {""}},
		{"X-A": {"one", "two"}},
		{"X-A": {strings.Repeat("a", 300)}},
	} {
		id := fmt.Sprintf("m-%d", len(h["X-A"])+len(h["X-A"][0]))
		ab := e.do(req{path: "/ab", header: h, body: `{"id":"` + id + `"}`})
		ba := e.do(req{path: "/ba", header: h, body: `{"id":"` + id + `"}`})
		if ab.StatusCode != ba.StatusCode {
			t.Errorf("one request (%d X-A line(s), the first %d bytes; no X-B; body id %s): key=header:X-A+header:X-B|json:/id answers %d %s, key=header:X-B+header:X-A|json:/id answers %d",
				len(h["X-A"]), len(h["X-A"][0]), id, ab.StatusCode, strings.TrimSpace(string(ab.body)), ba.StatusCode)
		}
	}
}

// TestIncompleteAlternativeDoesNotRefuse (review17a)
//
// The same defect as it meets a sender: a structured-mode CloudEvent (id
// and source in the JSON body) that also carries a stray ce-source header
// (empty, doubled, with a literal % or longer than MAX_KEY_LENGTH) but no
// ce-id is refused with 400 key-invalid on every delivery, although the
// cloudevents preset's first alternative is incomplete (no ce-id) and its
// second, json:/source+json:/id, is complete. The sender retries the 400
// until it gives up; the event is never delivered.
//
// Contract: "the first alternative whose parts are all present is used";
// the 400 for an unusable part concerns the alternative that is used.
func TestIncompleteAlternativeDoesNotRefuse(t *testing.T) {
	routes, err := proxy.ParseRoutes("POST /hooks/events key=cloudevents scope= fingerprint=none")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	structured := func(id string) string {
		return `{"specversion":"1.0","type":"com.example.order.created","source":"/mycontext/orders","id":"` + id + `","data":{"n":1}}`
	}
	cases := []struct {
		name   string
		header http.Header
		id     string
	}{
		{"empty ce-source", http.Header{"Ce-Source": {""}}, "e-1"},
		{"ce-source twice", http.Header{"Ce-Source": {"/a", "/b"}}, "e-2"},
		{"ce-source with a literal %", http.Header{"Ce-Source": {"/orders/100%"}}, "e-3"},
		{"ce-source longer than MAX_KEY_LENGTH", http.Header{"Ce-Source": {"/" + strings.Repeat("s", 300)}}, "e-4"},
	}
	for _, c := range cases {
		first := e.do(req{path: "/hooks/events", header: c.header, body: structured(c.id)})
		again := e.do(req{path: "/hooks/events", header: c.header, body: structured(c.id)})
		if first.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" {
			detail := ""
			if first.Header.Get("Content-Type") == "application/problem+json" {
				detail = fmt.Sprint(first.problem(t)["detail"])
			}
			t.Errorf("%s, no ce-id, structured body with id and source: first delivery %d %q, redelivery replayed=%q; want 201 keyed by json:/source+json:/id, then the replay",
				c.name, first.StatusCode, detail, again.Header.Get("Idempotent-Replayed"))
		}
	}
}
