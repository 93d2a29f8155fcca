package proxy_test

import (
	"fmt"
	"net/http"
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
	routes, err := proxy.ParseRoutes("POST /hooks/stripe key=stripe-events scope=; POST /hooks/ce key=cloudevents scope=")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
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
	routes, err := proxy.ParseRoutes("POST /noscope scope=; POST /tenant scope=X-Tenant")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
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
