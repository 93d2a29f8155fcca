package e2e

// The binary's life: signals, exit codes, a malformed environment, and
// what one process leaves in Redis for the next.

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

func TestBinary(t *testing.T) {
	t.Parallel()

	t.Run("SIGTERM finishes and records the in-flight request", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		up := newBlockingUpstream(t, 20*time.Second)
		p := startReady(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(),
			"UPSTREAM_TIMEOUT=10s", "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=27s")
		c := newClient(t)

		result := make(chan response, 1)
		go func() { result <- post(c, p.url("/v1/payments"), "sig-1", `{"amount":5}`) }()
		up.waitReceived(t)
		p.signal(t, syscall.SIGTERM)
		testutil.Eventually(t, 5*time.Second, "the proxy refuses connections after SIGTERM", func() bool {
			conn, err := net.DialTimeout("tcp", p.listen, 500*time.Millisecond)
			if err == nil {
				conn.Close()
				return false
			}
			return errors.Is(err, syscall.ECONNREFUSED)
		})
		if p.exited() {
			t.Fatalf("process exited before its in-flight request finished (code %d)", p.cmd.ProcessState.ExitCode())
		}
		up.release()

		var r response
		select {
		case r = <-result:
		case <-time.After(10 * time.Second):
			t.Fatalf("in-flight request got no answer within 10s")
		}
		if r.err != nil || r.status != http.StatusCreated {
			t.Fatalf("in-flight POST: got %v %v %q, want %v", r.status, r.err, r.body, http.StatusCreated)
		}
		if got := p.wait(t, 10*time.Second); got != 0 {
			t.Errorf("exit code: got %v, want 0\nstderr: %s", got, p.stderr.String())
		}

		// A fresh proxy on the same Redis replays the recorded answer.
		next := startProxy(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "ADMIN_ADDR=")
		again := mustPost(t, c, next.url("/v1/payments"), "sig-1", `{"amount":5}`)
		if got := again.header.Get("Idempotent-Replayed"); got != "true" {
			t.Errorf("retry on a new proxy: got status %v replayed=%q body %q, want a replay", again.status, got, again.body)
		}
		if again.status != r.status || again.body != r.body {
			t.Errorf("retry on a new proxy: got %v %q, want %v %q", again.status, again.body, r.status, r.body)
		}
		if got := up.Calls.Load(); got != 1 {
			t.Errorf("upstream calls: got %v, want 1", got)
		}
	})

	t.Run("SHUTDOWN_TIMEOUT runs out", func(t *testing.T) {
		t.Parallel()
		// SHUTDOWN_TIMEOUT must cover REQUEST_READ_TIMEOUT, UPSTREAM_TIMEOUT,
		// 10s of recording and the 6s a new connection may take to send its
		// headers, so the smallest allowed value is 18s here. What outlives
		// it is a pass-through answer that keeps streaming: UPSTREAM_TIMEOUT
		// bounds the time to its headers, not a body that flows.
		up := newStreamingUpstream(t, 40*time.Second)
		p := startReady(t, "UPSTREAM_URL="+up.URL,
			"UPSTREAM_TIMEOUT=1s", "REQUEST_READ_TIMEOUT=1s", "LOCK_TTL=10s", "SHUTDOWN_TIMEOUT=18s")
		c := newClient(t)

		streamClient := &http.Client{Transport: c.Transport} // no client timeout: the stream is long
		res, err := streamClient.Get(p.url("/v1/events"))
		if err != nil {
			t.Fatalf("GET stream: %v", err)
		}
		defer res.Body.Close()
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, res.Body); close(drained) }()
		p.signal(t, syscall.SIGTERM)
		signalled := time.Now()
		// The upstream streams for 40s: an exit around 18s proves the timeout.
		if got := p.wait(t, 25*time.Second); got == 0 {
			t.Errorf("exit code: got %v, want non-zero", got)
		}
		if took := time.Since(signalled); took < 10*time.Second {
			t.Errorf("exited %v after SIGTERM, want about SHUTDOWN_TIMEOUT=18s", took)
		}
		if got := p.stderr.String(); !strings.Contains(got, "SHUTDOWN_TIMEOUT") {
			t.Errorf("stderr: got %q, want it to name SHUTDOWN_TIMEOUT", got)
		}
		up.release()
		select { // the process is gone, so the stream ends
		case <-drained:
		case <-time.After(10 * time.Second):
			t.Errorf("stream still open 10s after the proxy exited")
		}
	})

	t.Run("malformed variable", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			env  string
			want string
		}{
			{"duration", "LOCK_TTL=abc", `LOCK_TTL="abc"`},
			{"bool", "REQUIRE_KEY=maybe", `REQUIRE_KEY="maybe"`},
			{"enum", "FAIL_MODE=sideways", `FAIL_MODE="sideways"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := startBinary(t, "UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=", tt.env)
				if got := p.wait(t, 10*time.Second); got == 0 {
					t.Errorf("exit code: got %v, want non-zero", got)
				}
				if got := p.stderr.String(); !strings.Contains(got, tt.want) {
					t.Errorf("stderr: got %q, want it to contain %s", got, tt.want)
				}
			})
		}
	})

	// idemproxy keys: the exit statuses of the process (0, 1, 2), and a
	// record read and purged by the binary.
	t.Run("keys", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		hash := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		srv.Client().HSet(t.Context(), "idem:{"+hash+"}", "st", "u", "rec", "504")
		for _, tt := range []struct {
			args   []string
			env    string
			code   int
			stdout string
			stderr string
		}{
			{[]string{"--help"}, "", 0, "Usage: idemproxy keys", ""},
			{[]string{"get", "--help"}, "", 0, "--body", ""},
			{[]string{"get", "abc"}, "REDIS_URL=" + srv.URL(), 2, "", "Usage: idemproxy keys get"},
			{[]string{"list"}, "", 1, "", "REDIS_URL is empty: keys needs the Redis the proxies use"},
			{[]string{"get", strings.Repeat("0", 64)}, "REDIS_URL=" + srv.URL(), 1, "", "no record for key_hash"},
			{[]string{"get", hash}, "REDIS_URL=" + srv.URL(), 0, `"state":"unknown","status":504`, ""},
			{[]string{"purge", hash}, "REDIS_URL=" + srv.URL(), 0, `{"key_hash":"` + hash + `","purged":true}`, ""},
		} {
			stdout, stderr, code := keysRun(t, []string{tt.env}, tt.args...)
			if code != tt.code || !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("idemproxy keys %q: exit %d\nstdout %q\nstderr %q\nwant exit %d, %q, %q", tt.args, code, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		}
	})
}

// TestHoldAfterSIGKILL is case (c) of ON_UNKNOWN=hold with the real binary:
// the proxy is SIGKILLed while its request is at the upstream. Another
// proxy on the same Redis answers 409 while the lock holds, then 504
// outcome-unknown, and goes on doing so past another LOCK_TTL: the request
// is never executed a second time.
func TestHoldAfterSIGKILL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newBlockingUpstream(t, 20*time.Second)
	const lockTTL = 2 * time.Second
	start := func() *proxy {
		return startReady(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "ON_UNKNOWN=hold",
			"UPSTREAM_TIMEOUT=1s", "LOCK_TTL="+lockTTL.String(), "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=18s")
	}

	first := start()
	c := newClient(t)
	sent := time.Now() // no later than the claim, whose lock runs from then
	go func() { _ = post(c, first.url("/v1/payments"), "kill-1", `{"amount":5}`) }()
	up.waitReceived(t)
	first.kill() // SIGKILL, our own child, by its pid

	url := start().url("/v1/payments")
	if r := mustPost(t, c, url, "kill-1", `{"amount":5}`); r.status != http.StatusConflict && time.Since(sent) < lockTTL {
		t.Errorf("within the lock: %d, want 409", r.status)
	}
	var last response
	testutil.Eventually(t, 10*time.Second, "504 outcome-unknown once the lock expired", func() bool {
		last = mustPost(t, c, url, "kill-1", `{"amount":5}`)
		return last.status == http.StatusGatewayTimeout
	})
	wantOutcomeUnknown(t, last)
	// Held means held for good: still 504 after another whole lock TTL,
	// which only the passing of that time can show.
	time.Sleep(lockTTL + 500*time.Millisecond)
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
