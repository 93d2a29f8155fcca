package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// webhookRoutes is a route per preset, as the README's webhook section
// configures them.
const webhookRoutes = "POST /hooks/github key=github scope=;" +
	"POST /hooks/standard key=standard-webhooks scope=;" +
	"POST /hooks/stripe key=stripe-events scope= fingerprint=none;" +
	"POST /hooks/shopify key=shopify scope= fingerprint=none;" +
	"POST /hooks/sns key=sns scope=;" +
	"POST /hooks/events key=cloudevents scope= fingerprint=none;" +
	"POST /hooks/composite key=header:X-Tenant+query:event|json:/event/id scope=;" +
	"POST /hooks/required key=github scope= required;" +
	"POST /hooks/json key=stripe-events scope= fingerprint=json"

func webhookEnv(t *testing.T, backend string) *env {
	t.Helper()
	routes, err := proxy.ParseRoutes(webhookRoutes)
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, backend, func(o *proxy.Options) { o.Routes = routes })
}

const stripeEvent = `{"id":"evt_1NGqQ2LkdIwHu7ixaxS2bDnD","object":"event","api_version":"2023-10-16",` +
	`"created":1686089970,"data":{"object":{"id":"pi_3NGqPzLkdIwHu7ix0YbwwpJ8","object":"payment_intent",` +
	`"amount":2000,"currency":"usd","status":"succeeded"}},"livemode":false,"pending_webhooks":%d,` +
	`"request":{"id":"req_Kt4Yu8PcZ8cvJZ","idempotency_key":null},"type":"payment_intent.succeeded"}`

// TestWebhookPresets: each sender's redelivery (same message id, headers
// such as timestamps and signatures changed) is replayed; the upstream runs
// once per message; a derived key is never echoed.
func TestWebhookPresets(t *testing.T) {
	t.Parallel()
	forBoth(t, nil, func(t *testing.T, e *env) {
		e = webhookEnv(t, e.backend)
		deliveries := []struct {
			name        string
			path        string
			first, redo http.Header
			body, redoB string
		}{
			{"github", "/hooks/github",
				http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "X-Github-Event": {"push"}, "X-Hub-Signature-256": {"sha256=aa"}},
				http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "X-Github-Event": {"push"}, "X-Hub-Signature-256": {"sha256=aa"}},
				`{"ref":"refs/heads/main"}`, `{"ref":"refs/heads/main"}`},
			{"standard-webhooks", "/hooks/standard",
				http.Header{"Webhook-Id": {"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}, "Webhook-Timestamp": {"1674087231"}, "Webhook-Signature": {"v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="}},
				http.Header{"Webhook-Id": {"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}, "Webhook-Timestamp": {"1674087531"}, "Webhook-Signature": {"v1,Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eHF1dXg="}},
				`{"type":"invoice.paid","data":{"id":"inv_1"}}`, `{"type":"invoice.paid","data":{"id":"inv_1"}}`},
			{"stripe-events", "/hooks/stripe",
				http.Header{"Stripe-Signature": {"t=1686089970,v1=abc"}},
				http.Header{"Stripe-Signature": {"t=1686090270,v1=def"}},
				fmt.Sprintf(stripeEvent, 2), fmt.Sprintf(stripeEvent, 1)},
			{"shopify", "/hooks/shopify",
				http.Header{"X-Shopify-Event-Id": {"98880550-7158-44d4-b7cd-2c97c8a091b5"}, "X-Shopify-Webhook-Id": {"b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"}, "X-Shopify-Topic": {"orders/create"}},
				http.Header{"X-Shopify-Event-Id": {"98880550-7158-44d4-b7cd-2c97c8a091b5"}, "X-Shopify-Webhook-Id": {"0f8bb7a3-1b35-4c8f-9d2a-1c7b3c2e9a10"}, "X-Shopify-Topic": {"orders/create"}},
				`{"id":820982911946154508}`, `{"id":820982911946154508}`},
			{"sns", "/hooks/sns",
				http.Header{"X-Amz-Sns-Message-Id": {"165545c9-2a5c-472c-8df2-7ff2be2b3b1b"}, "X-Amz-Sns-Message-Type": {"Notification"}},
				http.Header{"X-Amz-Sns-Message-Id": {"165545c9-2a5c-472c-8df2-7ff2be2b3b1b"}, "X-Amz-Sns-Message-Type": {"Notification"}},
				`{"Type":"Notification","MessageId":"165545c9-2a5c-472c-8df2-7ff2be2b3b1b","Message":"hello"}`,
				`{"Type":"Notification","MessageId":"165545c9-2a5c-472c-8df2-7ff2be2b3b1b","Message":"hello"}`},
			{"cloudevents binary then structured", "/hooks/events",
				http.Header{"Ce-Id": {"A234-1234-1234"}, "Ce-Source": {"/mycontext"}, "Ce-Specversion": {"1.0"}, "Ce-Type": {"com.example.someevent"}, "Content-Type": {"application/json"}},
				http.Header{"Content-Type": {"application/cloudevents+json"}},
				`{"a":1}`,
				`{"specversion":"1.0","type":"com.example.someevent","source":"/mycontext","id":"A234-1234-1234","datacontenttype":"application/json","data":{"a":1}}`},
		}
		for i, d := range deliveries {
			first := e.do(req{path: d.path, header: d.first, body: d.body})
			redo := e.do(req{path: d.path, header: d.redo, body: d.redoB})
			if first.StatusCode != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("%s: first delivery %d %s", d.name, first.StatusCode, first.body)
			}
			if redo.StatusCode != http.StatusCreated || redo.Header.Get("Idempotent-Replayed") != "true" || string(redo.body) != string(first.body) {
				t.Errorf("%s: redelivery %d replayed %q %s, want the first answer replayed", d.name, redo.StatusCode, redo.Header.Get("Idempotent-Replayed"), redo.body)
			}
			if got := e.calls.Load(); got != int64(i+1) {
				t.Errorf("%s: upstream calls %d, want %d (one per message)", d.name, got, i+1)
			}
			if first.Header.Get("Idempotency-Key") != "" || redo.Header.Get("Idempotency-Key") != "" {
				t.Errorf("%s: a derived key was echoed", d.name)
			}
		}
		// A new message id on the same route executes.
		if r := e.do(req{path: "/hooks/github", header: http.Header{"X-Github-Delivery": {"another"}}, body: "{}"}); r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("a new delivery id was replayed")
		}
		for _, d := range deliveries {
			if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": d.path, "key_source": "derived", "outcome": "replayed"}); got != 1 {
				t.Errorf("%s: derived replays counted %v, want 1", d.path, got)
			}
		}
		if strings.Count(e.logs.String(), `"key_source":"derived"`) < 2*len(deliveries) {
			t.Errorf("access log lacks key_source=derived")
		}
	})
}

// TestWebhookRedeliveriesConcurrent: 50 concurrent redeliveries of one
// message execute it once.
func TestWebhookRedeliveriesConcurrent(t *testing.T) {
	t.Parallel()
	e := webhookEnv(t, realBackend)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, _ = e.send(t.Context(), e.srv, req{path: "/hooks/github", header: http.Header{"X-Github-Delivery": {"same-delivery"}}, body: "{}"})
		})
	}
	wg.Wait()
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d for 50 concurrent redeliveries, want 1", got)
	}
}

// TestKeySourceRules: composite and alternative sources, invalid and
// missing parts, required routes, and the body limit before a json: key.
func TestKeySourceRules(t *testing.T) {
	t.Parallel()
	e := webhookEnv(t, miniBackend)
	e.opts.MaxBodyBytes = 1 << 20
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	// Composite: header + query; the same values in another combination differ.
	a := e.do(req{path: "/hooks/composite?event=bc", header: hdr("X-Tenant", "a"), body: "{}"})
	b := e.do(req{path: "/hooks/composite?event=c", header: hdr("X-Tenant", "ab"), body: "{}"})
	if a.Header.Get("Idempotent-Replayed") != "" || b.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a+bc and ab+c shared a key")
	}
	// The alternative: json:/event/id when the first alternative is incomplete.
	c1 := e.do(req{path: "/hooks/composite", body: `{"event":{"id":"e-1"}}`})
	c2 := e.do(req{path: "/hooks/composite", body: `{"event":{"id":"e-1"}}`})
	if c1.StatusCode != http.StatusCreated || c2.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("alternative json:/event/id: %d then replayed %q", c1.StatusCode, c2.Header.Get("Idempotent-Replayed"))
	}
	// No alternative complete: forwarded without a guarantee.
	before := e.calls.Load()
	e.do(req{path: "/hooks/composite", body: `{"other":1}`})
	e.do(req{path: "/hooks/composite", body: `{"other":1}`})
	if e.calls.Load()-before != 2 {
		t.Errorf("requests without any key part were not both forwarded")
	}
	// Present but empty, or repeated: 400 key-invalid naming the part.
	for name, r := range map[string]req{
		"empty":    {path: "/hooks/github", header: hdr("X-Github-Delivery", ""), body: "{}"},
		"repeated": {path: "/hooks/github", header: hdr("X-Github-Delivery", "a", "X-Github-Delivery", "b"), body: "{}"},
		"query x2": {path: "/hooks/composite?event=a&event=b", header: hdr("X-Tenant", "t"), body: "{}"},
	} {
		got := e.do(r)
		if got.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, got.StatusCode)
			continue
		}
		if p := got.problem(t); p["type"] != "urn:idemproxy:problem:key-invalid" || !strings.Contains(fmt.Sprint(p["detail"]), "key part") {
			t.Errorf("%s: problem %v", name, p)
		}
	}
	// Required: 400 key-missing naming the SOURCE.
	r := e.do(req{path: "/hooks/required", body: "{}"})
	if r.StatusCode != http.StatusBadRequest {
		t.Fatalf("required without the delivery header: %d", r.StatusCode)
	}
	if p := r.problem(t); p["type"] != "urn:idemproxy:problem:key-missing" || !strings.Contains(fmt.Sprint(p["detail"]), "key=github") {
		t.Errorf("required: problem %v", p)
	}
}

// TestKeyFromBodyHonoursBodyLimit: with a json: part the body is read first,
// so MAX_BODY_BYTES answers 413 before the key is looked for.
func TestKeyFromBodyHonoursBodyLimit(t *testing.T) {
	t.Parallel()
	routes, err := proxy.ParseRoutes("POST /hooks/stripe key=stripe-events scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes; o.MaxBodyBytes = 64 })
	r := e.do(req{path: "/hooks/stripe", body: fmt.Sprintf(stripeEvent, 1)})
	if r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", r.StatusCode)
	}
	// A body that is not JSON holds no key: forwarded as is, body intact.
	r = e.do(req{path: "/hooks/stripe", body: "not json"})
	if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), `"body_len":8`) {
		t.Errorf("non-JSON body: %d %s, want forwarded with its 8 bytes", r.StatusCode, r.body)
	}
}

// TestKeyFromBodyNotJSONIsCountedAndWarnedOnce: a sender whose bodies are
// never JSON to the proxy (a byte-order mark, gzip) gets no key on a json:
// route, and every delivery runs without protection. That must not be
// silent: each is counted by route, and the first on each route is logged
// as a warning (once: the count tells the rest).
func TestKeyFromBodyNotJSONIsCountedAndWarnedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /hooks/stripe key=stripe-events scope=; POST /hooks/ce key=cloudevents scope=")
	})
	bom := "\xef\xbb\xbf" + fmt.Sprintf(stripeEvent, 1)
	for range 3 {
		if r := e.do(req{path: "/hooks/stripe", body: bom}); r.StatusCode != http.StatusCreated {
			t.Fatalf("BOM-prefixed event: %d, want forwarded", r.StatusCode)
		}
	}
	e.do(req{path: "/hooks/stripe", body: "\x1f\x8b\x08 gzip"})
	// A JSON body without the id is not counted: it is JSON.
	e.do(req{path: "/hooks/stripe", body: `{"object":"event"}`})
	// Binary-mode CloudEvents carry the key in headers: a non-JSON body
	// does not matter there.
	e.do(req{path: "/hooks/ce", body: "plain text", header: http.Header{"Ce-Source": {"/s"}, "Ce-Id": {"1"}}})
	if got := counter(t, e.reg, "idemproxy_key_body_not_json_total", map[string]string{"route": "/hooks/stripe"}); got != 4 {
		t.Errorf("idemproxy_key_body_not_json_total{route=/hooks/stripe} = %v, want 4", got)
	}
	if got := counter(t, e.reg, "idemproxy_key_body_not_json_total", map[string]string{"route": "/hooks/ce"}); got != 0 {
		t.Errorf("idemproxy_key_body_not_json_total{route=/hooks/ce} = %v, want 0 (its key came from headers)", got)
	}
	if n := strings.Count(e.logs.String(), "a body that is not JSON arrived"); n != 1 {
		t.Errorf("%d warnings about bodies that are not JSON, want 1 (once per route):\n%s", n, e.logs)
	}
}

// TestFingerprintProfiles: json ignores member order, whitespace, number
// spelling (per RFC 8785) and query order; falls back to bytes for bodies
// that are not JSON; none ignores body and query; strict sees all.
func TestFingerprintProfiles(t *testing.T) {
	t.Parallel()
	routes, err := proxy.ParseRoutes("POST /json fingerprint=json; POST /none fingerprint=none; POST /strict")
	if err != nil {
		t.Fatal(err)
	}
	forBoth(t, func(o *proxy.Options) { o.Routes = routes }, func(t *testing.T, e *env) {
		same := func(path, key, b1, b2 string) (int, string) {
			t.Helper()
			e.do(req{path: path, key: key, body: b1})
			r := e.do(req{path: strings.Replace(path, "?a=1&b=2", "?b=2&a=1", 1), key: key, body: b2})
			detail := ""
			if r.StatusCode == http.StatusUnprocessableEntity {
				detail = fmt.Sprint(r.problem(t)["detail"])
			}
			return r.StatusCode, detail
		}
		if s, _ := same("/json", "j1", `{"a":1,"b":[1,2]}`, "{ \"b\" : [1, 2],\n \"a\" : 1.0 }"); s != http.StatusCreated {
			t.Errorf("json: reordered members, whitespace, 1.0: %d, want the replay", s)
		}
		if s, _ := same("/json?a=1&b=2", "j2", `{}`, `{}`); s != http.StatusCreated {
			t.Errorf("json: reordered query: %d, want the replay", s)
		}
		if s, d := same("/json", "j3", `{"a":1}`, `{"a":2}`); s != http.StatusUnprocessableEntity || !strings.Contains(d, "fingerprint=json") {
			t.Errorf("json: another value: %d %q, want 422 naming the profile", s, d)
		}
		if s, _ := same("/json", "j4", `not json`, `not  json`); s != http.StatusUnprocessableEntity {
			t.Errorf("json: non-JSON bodies compared as bytes: %d, want 422", s)
		}
		if s, _ := same("/none?a=1&b=2", "n1", `{"a":1}`, `{"a":2}`); s != http.StatusCreated {
			t.Errorf("none: other body and query: %d, want the replay", s)
		}
		if s, d := same("/strict", "s1", `{"a":1,"b":2}`, `{"b":2,"a":1}`); s != http.StatusUnprocessableEntity || !strings.Contains(d, "fingerprint=strict") {
			t.Errorf("strict: reordered members: %d %q, want 422 naming the profile", s, d)
		}
	})
}

// TestRouteScope: scope= on a route replaces SCOPE_HEADERS (empty: no
// scope), so a sender whose Authorization changes still redelivers to one key.
func TestRouteScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /noscope scope=; POST /tenant scope=X-Tenant") })
	auth := func(v string, extra ...string) http.Header {
		h := http.Header{"Authorization": {v}}
		if len(extra) == 2 {
			h.Set(extra[0], extra[1])
		}
		return h
	}
	e.do(req{path: "/noscope", key: "k", body: "x", header: auth("Bearer one")})
	if r := e.do(req{path: "/noscope", key: "k", body: "x", header: auth("Bearer two")}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("scope=: another Authorization did not replay")
	}
	e.do(req{path: "/tenant", key: "k", body: "x", header: auth("Bearer one", "X-Tenant", "a")})
	if r := e.do(req{path: "/tenant", key: "k", body: "x", header: auth("Bearer two", "X-Tenant", "a")}); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("scope=X-Tenant: same tenant, other token did not replay")
	}
	if r := e.do(req{path: "/tenant", key: "k", body: "x", header: auth("Bearer one", "X-Tenant", "b")}); r.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("scope=X-Tenant: another tenant replayed")
	}
}

func TestParseKeySourceErrors(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "nope", "header:", "query:", "json:id", "json:/a~2", "xml:/a", "github+header:X", "header:A B"} {
		if _, err := proxy.ParseKeySource(bad); err == nil {
			t.Errorf("ParseKeySource(%q) accepted", bad)
		}
	}
	// Alternatives of one length are refused unless a preset has them: the
	// key holds the values, not which alternative gave them, so X-Order: 42
	// and X-Customer: 42 would be one key.
	for _, ambiguous := range []string{"header:X-Order|header:X-Customer", "header:ce-source+header:ce-id|json:/source+json:/id", "json:/a|header:B+header:C|query:d"} {
		_, err := proxy.ParseKeySource(ambiguous)
		if err == nil || !strings.Contains(err.Error(), "would share a key") {
			t.Errorf("ParseKeySource(%q) = %v; want alternatives of one length refused", ambiguous, err)
		}
	}
	for _, good := range []string{"github", "standard-webhooks", "stripe-events", "shopify", "sns", "cloudevents", "header:A+query:b|json:/c/0", "header:X-Order|header:X-Customer+header:X-Tenant"} {
		if _, err := proxy.ParseKeySource(good); err != nil {
			t.Errorf("ParseKeySource(%q): %v", good, err)
		}
	}
	if _, err := proxy.ParseRoutes("POST /x key=nope"); err == nil || !strings.Contains(err.Error(), `"POST /x key=nope"`) {
		t.Errorf("a malformed SOURCE must stop the process quoting the rule: %v", err)
	}
}

// FuzzParseKeySource: never panics; what parses derives keys without
// panicking.
func FuzzParseKeySource(f *testing.F) {
	for _, s := range []string{"github", "cloudevents", "header:A+query:b|json:/c/0", "json:/a~1b", "|", "+", "json:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = proxy.ParseKeySource(s)
	})
}

// TestCloudEventsBinaryHeadersArePercentDecoded
//
// Defect: the cloudevents preset takes ce-source and ce-id as the raw
// header bytes. The CloudEvents HTTP binding (v1.0.2, section 3.1.3.2)
// requires a binary-mode sender to percent-encode space, '"', '%' and every
// character outside U+0021..U+007E in those headers, and a receiver to
// percent-decode them; in structured mode the same attributes travel as
// plain JSON strings. So one event (id "order 42", source "/shop/München")
// arrives as `ce-id: order%2042` in binary mode and "id":"order 42" in
// structured mode, and the proxy derives two different keys: the second
// delivery executes again. That breaks the contract's "a CloudEvent
// delivered in binary mode and in structured mode (same source, same id) is
// one key".
//
// Correct: for the header parts of the cloudevents preset, unquote and
// percent-decode the values (rejecting invalid UTF-8) before combining them,
// so both modes give one key; the redelivery is replayed and the upstream
// runs once.
func TestCloudEventsBinaryHeadersArePercentDecoded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /hooks/events key=cloudevents scope= fingerprint=none")
	})

	binary := e.do(req{path: "/hooks/events", body: `{"order":"1234"}`, header: http.Header{
		"Ce-Specversion": {"1.0"},
		"Ce-Type":        {"com.example.order.created"},
		"Ce-Id":          {"order%2042"},         // id "order 42", as the binding encodes it
		"Ce-Source":      {"/shop/M%C3%BCnchen"}, // source "/shop/München"
		"Content-Type":   {"application/json"},
	}})
	if binary.StatusCode != http.StatusCreated {
		t.Fatalf("binary delivery: %d %s", binary.StatusCode, binary.body)
	}
	structured := e.do(req{path: "/hooks/events", header: http.Header{"Content-Type": {"application/cloudevents+json"}},
		body: `{"specversion":"1.0","type":"com.example.order.created","id":"order 42","source":"/shop/München",` +
			`"datacontenttype":"application/json","data":{"order":"1234"}}`})
	if structured.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the same event in structured mode was not replayed (status %d): binary-mode ce-* values are not percent-decoded, so the two modes give two keys", structured.StatusCode)
	}
	if got := e.calls.Load(); got != 1 {
		t.Errorf("upstream executed the one event %d times, want 1", got)
	}
}

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
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /v1/transfers fingerprint=json") })
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
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /json fingerprint=json; POST /strict") })
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
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /hooks/stripe key=stripe-events scope= fingerprint=none")
	})
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
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /hooks/items key=json:/items/-0/id scope=") })
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
	t.Parallel()
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /hooks/q key=query:id scope=") })
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
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = mustRoutes(t, "POST /hooks/q key=query:id scope=") })
	r := e.do(req{path: "/hooks/q?id=a&id=b;c", body: "{}"})
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("?id=a&id=b;c: %d (upstream calls %d), want 400 key-invalid: id appears twice", r.StatusCode, e.calls.Load())
	}
}

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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestKeyPartOrderDoesNotChangeTheAnswer
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
	t.Parallel()
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

// TestIncompleteAlternativeDoesNotRefuse
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
	t.Parallel()
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Routes = mustRoutes(t, "POST /hooks/events key=cloudevents scope= fingerprint=none")
	})
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
