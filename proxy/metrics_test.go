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
	t.Parallel()
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

// TestReleasedHighStatusCountsAsFailure: the proxy handles an upstream status of 600-999 as a server
// failure: recordAnswer releases it like a 5xx (ON_5XX=release, the
// default) and the trace marks it an error. Before 83b900a such an answer was
// counted under code_class "error"; now it is "6xx".."9xx", a class no
// dashboard panel ("2xx..5xx, and error") or alert on code_class=~"5xx|error"
// looks at, so answers the proxy released as failures vanish from them.
func TestReleasedHighStatusCountsAsFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, nil)
	var status atomic.Int64
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) })
	for i, s := range []int{http.StatusServiceUnavailable, 799} {
		status.Store(int64(s))
		if got := e.do(req{method: "POST", path: "/x", key: "r14f" + string(rune('a'+i)), body: "{}"}); got.StatusCode != s {
			t.Fatalf("request %d: status %d, want %d", i, got.StatusCode, s)
		}
	}
	released := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "default", "outcome": "released", "key_source": "header"})
	if released != 2 {
		t.Fatalf("released %v, want 2 (503 and 799 both released as server failures)", released)
	}
	failures := 0.0
	for _, class := range []string{"5xx", "error"} {
		failures += counter(t, e.reg, "idemproxy_upstream_duration_seconds", map[string]string{"route": "default", "code_class": class})
	}
	if failures != released {
		t.Errorf("upstream answers under code_class 5xx|error: %v; the proxy released %v as server failures", failures, released)
	}
}
