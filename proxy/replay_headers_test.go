package proxy_test

import (
	"net/http"
	"slices"
	"testing"
)

// A replay carries the recorded headers as the first answer carried them.
// On a route whose key is derived from the message the proxy echoes no key,
// so an upstream's own Idempotency-Key header goes out on the first answer
// and must go out on the replay too (it used to be dropped there).
func TestReplayKeepsUpstreamKeyHeaderOnDerivedRoute(t *testing.T) {
	forBoth(t, nil, func(t *testing.T, e *env) {
		e = webhookEnv(t, e.backend)
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Idempotency-Key", "upstream-own")
			w.WriteHeader(http.StatusCreated)
		})
		h := http.Header{"X-Github-Delivery": {"d-replay-echo"}, "X-Github-Event": {"push"}}
		first := e.do(req{path: "/hooks/github", header: h, body: "{}"})
		dup := e.do(req{path: "/hooks/github", header: h, body: "{}"})
		if first.StatusCode != http.StatusCreated || dup.StatusCode != http.StatusCreated || dup.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("first %d, duplicate %d replayed %q: want 201 and its replay", first.StatusCode, dup.StatusCode, dup.Header.Get("Idempotent-Replayed"))
		}
		want := []string{"upstream-own"}
		if got := first.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
			t.Errorf("first answer's Idempotency-Key %q, want %q", got, want)
		}
		if got := dup.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
			t.Errorf("replay's Idempotency-Key %q, want the recorded %q", got, want)
		}
	})
}

// On a header-keyed route the proxy's echo of the client's key wins over an
// upstream's own, on the first answer and on the replay alike.
func TestReplayEchoWinsOnHeaderRoute(t *testing.T) {
	forBoth(t, nil, func(t *testing.T, e *env) {
		e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Idempotency-Key", "upstream-own")
			w.WriteHeader(http.StatusCreated)
		})
		first := e.do(req{key: "client-key", body: "{}"})
		dup := e.do(req{key: "client-key", body: "{}"})
		want := []string{"client-key"}
		for name, r := range map[string]response{"first": first, "replay": dup} {
			if got := r.Header.Values("Idempotency-Key"); !slices.Equal(got, want) {
				t.Errorf("%s answer's Idempotency-Key %q, want %q", name, got, want)
			}
		}
	})
}
