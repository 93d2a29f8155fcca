package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestHoldAfterSIGKILL is case (c) of ON_UNKNOWN=hold with the real binary:
// the proxy is SIGKILLed while its request is at the upstream. Another
// proxy on the same Redis answers 409 while the lock holds, then 504
// outcome-unknown, and goes on doing so past another LOCK_TTL: the request
// is never executed a second time.
func TestHoldAfterSIGKILL(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemproxy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := redistest.Start(t)
	up := newBlockingUpstream(t, 20*time.Second)
	const lockTTL = 2 * time.Second
	start := func() (*proc, string) {
		listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		p := startBinary(t, bin, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR="+listen,
			"ADMIN_ADDR="+admin, "ON_UNKNOWN=hold", "UPSTREAM_TIMEOUT=1s", "LOCK_TTL="+lockTTL.String(),
			"REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=18s")
		waitStatus(t, newClient(t), "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)
		return p, "http://" + listen + "/v1/payments"
	}

	first, url := start()
	c := newClient(t)
	sent := time.Now() // no later than the claim, whose lock runs from then
	go func() { _ = post(c, url, "kill-1", `{"amount":5}`) }()
	select {
	case <-up.received:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream did not receive the request within 10s")
	}
	_ = first.cmd.Process.Kill() // SIGKILL, our own child, by its pid
	first.wait(t, 5*time.Second)

	_, url = start()
	if r := mustPost(t, c, url, "kill-1", `{"amount":5}`); r.status != http.StatusConflict && time.Since(sent) < lockTTL {
		t.Errorf("within the lock: %d, want 409", r.status)
	}
	var last response
	testutil.Eventually(t, 10*time.Second, "504 outcome-unknown once the lock expired", func() bool {
		last = mustPost(t, c, url, "kill-1", `{"amount":5}`)
		return last.status == http.StatusGatewayTimeout
	})
	wantOutcomeUnknown(t, last)
	time.Sleep(lockTTL + 500*time.Millisecond) // another whole lock TTL: still held
	wantOutcomeUnknown(t, mustPost(t, c, url, "kill-1", `{"amount":5}`))
	if got := up.Calls.Load(); got != 1 {
		t.Errorf("upstream executions %d, want 1", got)
	}
}

func wantOutcomeUnknown(t *testing.T, r response) {
	t.Helper()
	var p struct{ Type string }
	_ = json.Unmarshal([]byte(r.body), &p)
	if r.status != http.StatusGatewayTimeout || p.Type != "urn:idemproxy:problem:outcome-unknown" || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("got %d %s (replayed %q), want 504 outcome-unknown", r.status, r.body, r.header.Get("Idempotent-Replayed"))
	}
}
