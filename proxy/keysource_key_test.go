package proxy

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestKeySourceKeyMatchesDerive: the key `idemproxy keys hash` computes from
// the parts' values is the key derive reads from a request carrying them.
func TestKeySourceKeyMatchesDerive(t *testing.T) {
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
	if got, err := HeaderKey(`"abc"`, 255); got != "abc" || err != nil {
		t.Errorf(`HeaderKey("\"abc\"") = %q, %v; want "abc"`, got, err)
	}
	if _, err := HeaderKey("a,b", 255); err == nil {
		t.Errorf("HeaderKey(a,b): no error, want the comma refused")
	}
}
