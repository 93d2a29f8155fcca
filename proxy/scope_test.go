package proxy

import (
	"net/http"
	"slices"
	"testing"
)

func TestScopeValues(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Add("X-Tenant", "")
	h.Add("X-Tenant", "acme")
	h.Add("Authorization", "Bearer t")
	for _, tc := range []struct {
		names []string
		want  []string
	}{
		{nil, []string{}},
		{[]string{"Authorization"}, []string{"Bearer t"}},
		{[]string{"x-tenant"}, []string{"\nacme"}},                       // every value, the empty first one too
		{[]string{"X-Tenant", "x-tenant"}, []string{"\nacme", "\nacme"}}, // a name listed twice fills both
		{[]string{"X-Absent", "host", "Authorization"}, []string{"", "h.example", "Bearer t"}},
	} {
		var buf [4]string
		if got := ScopeValues(h, "h.example", tc.names, buf[:]); !slices.Equal(got, tc.want) {
			t.Errorf("ScopeValues(%q) = %q, want %q", tc.names, got, tc.want)
		}
		if got := ScopeValues(h, "h.example", tc.names, nil); !slices.Equal(got, tc.want) {
			t.Errorf("ScopeValues(%q, nil buf) = %q, want %q", tc.names, got, tc.want)
		}
	}
}
