package proxy_test

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

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
	routes, err := proxy.ParseRoutes("POST /hooks/events key=cloudevents scope= fingerprint=none")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, realBackend, func(o *proxy.Options) { o.Routes = routes })

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
