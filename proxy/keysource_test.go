package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
)

// memoryHandler is a Handler over miniredis with ROUTES spec, whose
// in-memory upstream (memoryUpstream) counts its calls.
func memoryHandler(t *testing.T, spec string) (*Handler, *atomic.Int64) {
	t.Helper()
	routes, err := ParseRoutes(spec)
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var calls atomic.Int64
	opts := memoryOptions(routes)
	opts.Logger = zerolog.New(io.Discard)
	opts.Transport = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return memoryUpstream(r)
	})
	h, err := New(claim.NewStore(rdb, "idem:", nil), opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, &calls
}

// postTo sends one POST through h and returns what it answered.
func postTo(h *Handler, path, body string, header map[string]string) deadlineRecorder {
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := newRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestJSONKeyKeepsSenderWrittenReplacementCharacter: a U+FFFD the sender
// wrote ("\ufffd" escaped, or the bytes EF BF BD) is an ordinary character
// of the id. Only a U+FFFD that decoding put in place of invalid UTF-8 or an
// unpaired surrogate makes a json: part absent. Every string holding U+FFFD
// used to count as absent, so each redelivery of such a message was
// forwarded without a key and executed again, silently, while the same
// event in CloudEvents binary mode was keyed.
func TestJSONKeyKeepsSenderWrittenReplacementCharacter(t *testing.T) {
	t.Parallel()
	h, calls := memoryHandler(t, "POST /hooks key=json:/id scope=")
	for name, body := range map[string]string{
		"escaped U+FFFD":    `{"id":"evt_\ufffd_1","type":"order.paid"}`,
		"UTF-8 EF BF BD":    "{\"id\":\"evt_\xef\xbf\xbd_2\",\"type\":\"order.paid\"}",
		"escaped, nested 2": `{"type":"order.paid","id":"evt_3\uFFFD"}`,
	} {
		before := calls.Load()
		first := postTo(h, "/hooks", body, nil)
		second := postTo(h, "/hooks", body, nil)
		if got := calls.Load() - before; got != 1 {
			t.Errorf("%s: a redelivery of one message (valid UTF-8 id with U+FFFD) reached the upstream %d times, want 1 "+
				"(first %d, second %d, Idempotent-Replayed=%q)", name, got, first.Code, second.Code,
				second.Header().Get("Idempotent-Replayed"))
		}
	}
}

// TestJSONKeyDuplicateMemberIsInvalid: a member named twice on the
// pointer's path ({"id":"evt_A","id":"evt_B"}) is a 400 key-invalid naming
// the part, as a header: or query: part sent twice is. Parsers disagree on
// which member counts (encoding/json and JavaScript the last; gjson,
// jsonparser and cJSON the first). The key used to be the last one: on a
// fingerprint=none route a first-wins upstream executed evt_A under key
// evt_B, and the genuine evt_B was then answered with evt_A's record and
// never executed.
func TestJSONKeyDuplicateMemberIsInvalid(t *testing.T) {
	t.Parallel()
	h, calls := memoryHandler(t, "POST /hooks/stripe key=stripe-events scope= fingerprint=none")
	w := postTo(h, "/hooks/stripe", `{"id":"evt_A","object":"event","id":"evt_B"}`, nil)
	if w.Code != http.StatusBadRequest {
		t.Errorf("a body naming the key member twice (evt_A, evt_B) was answered %d and reached the upstream %d time(s); "+
			"want 400 key-invalid as for a header: or query: part that appears twice", w.Code, calls.Load())
	}
	// What it leads to on this route: the genuine evt_B gets the answer of
	// the message above instead of executing.
	w = postTo(h, "/hooks/stripe", `{"id":"evt_B","object":"event"}`, nil)
	if w.Header().Get("Idempotent-Replayed") == "true" {
		t.Errorf("event evt_B was answered with the recorded answer of the body that named evt_A first (upstream calls %d)", calls.Load())
	}
}

// TestKeySourceKeyMatchesDerive: the key `idemproxy keys hash` computes from
// the parts' values is the key derive reads from a request carrying them.
func TestKeySourceKeyMatchesDerive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		source string
		header map[string]string
		body   string
		values []string
	}{
		{"github", "github", map[string]string{"X-GitHub-Delivery": "72d3162e"}, "", []string{"72d3162e"}},
		{"cloudevents binary", "cloudevents", map[string]string{"ce-source": "%2Forders", "ce-id": "A-1"}, "", []string{"/orders", "A-1"}},
		{"cloudevents structured", "cloudevents", nil, `{"source":"/orders","id":"A-1"}`, []string{"/orders", "A-1"}},
		{"composite", "header:X-A+query:b", map[string]string{"X-A": "a"}, "", []string{"a", "bc"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks, err := ParseKeySource(tt.source)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("POST", "/hook?b=bc", strings.NewReader(tt.body))
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			want, err := ks.derive(r, []byte(tt.body), 255)
			if err != nil {
				t.Fatalf("derive: %v", err)
			}
			got, err := ks.Key(tt.values)
			if err != nil || got != want {
				t.Errorf("Key(%q) = %q, %v; want %q (derive)", tt.values, got, err, want)
			}
		})
	}
	ks, _ := ParseKeySource("cloudevents")
	if _, err := ks.Key([]string{"only-one"}); err == nil || !strings.Contains(err.Error(), "takes 2 (header:ce-source+header:ce-id) or 2 (json:/source+json:/id) values, not 1") {
		t.Errorf("Key with one value for cloudevents: err %v, want the part counts named", err)
	}
}

func TestHeaderKey(t *testing.T) {
	t.Parallel()
	if got, err := HeaderKey(`"abc"`, 255); got != "abc" || err != nil {
		t.Errorf(`HeaderKey("\"abc\"") = %q, %v; want "abc"`, got, err)
	}
	if _, err := HeaderKey("a,b", 255); err == nil {
		t.Errorf("HeaderKey(a,b): no error, want the comma refused")
	}
}
