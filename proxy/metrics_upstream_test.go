package proxy_test

import (
	"net/http"
	"sync/atomic"
	"testing"
)

// idemproxy_upstream_duration_seconds counts each forwarded keyed request
// once, under its route and the class of the upstream's status ("error"
// when there was no answer, or a status above 599, which the proxy handles
// as a failure).
func TestUpstreamDurationByClass(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	var status atomic.Int64
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) })
	for i, s := range []int{http.StatusCreated, http.StatusCreated, http.StatusConflict, http.StatusServiceUnavailable, 799} {
		status.Store(int64(s))
		if got := e.do(req{method: "POST", path: "/x", key: "k" + string(rune('a'+i)), body: "{}"}); got.StatusCode != s {
			t.Fatalf("request %d: status %d, want %d", i, got.StatusCode, s)
		}
	}
	for class, want := range map[string]float64{"2xx": 2, "4xx": 1, "5xx": 1, "error": 1, "3xx": 0} {
		if got := counter(t, e.reg, "idemproxy_upstream_duration_seconds", map[string]string{"route": "default", "code_class": class}); got != want {
			t.Errorf("code_class %s: %v observations, want %v", class, got, want)
		}
	}
}
