package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestLargestJSONBodyFitsTheBufferBudget: a configuration the proxy
// accepts must be able to serve one request of every size it accepts, on
// an idle proxy. With MAX_BODY_BYTES=20MiB, FINGERPRINT=json and
// MAX_BUFFERED_BYTES left at its default, a keyed 16 MiB JSON body (one
// long string: a file upload) is refused 503 overloaded with Retry-After
// although nothing else is in flight, every time: the json profile reserves
// jcs.ScratchBound (about 1.6 times the body, the worst case for a body
// made of tiny members) on top of the body, and the start-up check
// (oneRequestBytes) never counted it. The client retries as told and never
// gets through; the operator sees "overloaded" on an idle replica.
func TestLargestJSONBodyFitsTheBufferBudget(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=",
		"MAX_BODY_BYTES=20971520", "FINGERPRINT=json")
	c := newClient(t)
	body := `{"file":"` + strings.Repeat("A", 16<<20) + `"}`
	r := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/uploads", "upload-1", body)
	if r.status != http.StatusCreated {
		t.Errorf("a keyed %d-byte JSON body (MAX_BODY_BYTES=20MiB) on an idle proxy: %d %s, want 201",
			len(body), r.status, firstLine(r.body))
	}
}
