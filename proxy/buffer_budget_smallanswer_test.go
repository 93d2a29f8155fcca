package proxy_test

import (
	"bytes"
	"net/http"
	"testing"
)

// TestBufferBudgetFullRefusesBodilessRequests: with MAX_BUFFERED_BYTES full,
// a keyed request without a body is either refused before anything is
// claimed (503, and its retry executes) or executed and its answer replayed
// byte for byte; never executed and then unreplayable. (Found by review: it
// took nothing at the body stage, was executed, and its 43-byte answer
// found no room and was recorded without its body.)
func TestBufferBudgetFullRefusesBodilessRequests(t *testing.T) {
	forBoth(t, budgetOptions, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		// The whole budget held by two requests at the upstream.
		first := holdOne(t, e, g, "held-1", 40<<10)
		second := holdOne(t, e, g, "held-2", 24<<10)
		if got := bufferedBytes(t, e); got != 64<<10 {
			t.Fatalf("idemproxy_buffered_bytes %v, want the full %d", got, 64<<10)
		}

		orig := e.do(req{key: "no-body", body: ""})
		g.open()
		<-first
		<-second

		retry := e.do(req{key: "no-body", body: ""})
		switch orig.StatusCode {
		case http.StatusServiceUnavailable:
			// Refused before claiming: the retry must execute.
			if retry.StatusCode != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("refused first, then retry: status %d replayed %q %s; want a fresh 201", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), retry.body)
			}
		case http.StatusCreated:
			t.Logf("first (budget full, no body): %d %s", orig.StatusCode, orig.body)
			t.Logf("retry: %d replayed=%q %s", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), retry.body)
			if retry.StatusCode != http.StatusCreated || !bytes.Equal(retry.body, orig.body) {
				t.Errorf("a %d-byte answer executed while MAX_BUFFERED_BYTES was full is not replayable: retry got %d %s, want the recorded %s byte for byte",
					len(orig.body), retry.StatusCode, retry.body, orig.body)
			}
		default:
			t.Fatalf("first: status %d %s", orig.StatusCode, orig.body)
		}
	})
}
