package main

// Tests of the real binary: built with go build, run as a child process,
// stopped with signals.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("SIGTERM finishes and records the in-flight request", func(t *testing.T) {
		srv := redistest.Start(t)
		up := newBlockingUpstream(t, 20*time.Second)
		listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		p := startBinary(t, bin, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(),
			"LISTEN_ADDR="+listen, "ADMIN_ADDR="+admin, "UPSTREAM_TIMEOUT=10s", "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=27s")
		c := newClient(t)
		waitStatus(t, c, "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)

		result := make(chan response, 1)
		go func() { result <- post(c, "http://"+listen+"/v1/payments", "sig-1", `{"amount":5}`) }()
		select {
		case <-up.received:
		case <-time.After(10 * time.Second):
			t.Fatalf("upstream did not receive the request within 10s")
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		testutil.Eventually(t, 5*time.Second, "the proxy refuses connections after SIGTERM", func() bool {
			conn, err := net.DialTimeout("tcp", listen, 500*time.Millisecond)
			if err == nil {
				conn.Close()
				return false
			}
			return errors.Is(err, syscall.ECONNREFUSED)
		})
		select {
		case <-p.done:
			t.Fatalf("process exited before its in-flight request finished (code %d)", p.cmd.ProcessState.ExitCode())
		default:
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
		a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
		again := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/payments", "sig-1", `{"amount":5}`)
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
		// SHUTDOWN_TIMEOUT must cover UPSTREAM_TIMEOUT plus 10s of
		// recording, so the smallest allowed value is 11s here. What outlives
		// it is a pass-through answer that keeps streaming: UPSTREAM_TIMEOUT
		// bounds the time to its headers, not a body that flows.
		up := newStreamingUpstream(t, 40*time.Second)
		listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		p := startBinary(t, bin, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR="+listen, "ADMIN_ADDR="+admin,
			"UPSTREAM_TIMEOUT=1s", "REQUEST_READ_TIMEOUT=1s", "LOCK_TTL=10s", "SHUTDOWN_TIMEOUT=18s")
		c := newClient(t)
		waitStatus(t, c, "http://"+admin+"/readyz", http.StatusOK, 10*time.Second)

		streamClient := &http.Client{Transport: c.Transport} // no client timeout: the stream is long
		res, err := streamClient.Get("http://" + listen + "/v1/events")
		if err != nil {
			t.Fatalf("GET stream: %v", err)
		}
		defer res.Body.Close()
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, res.Body); close(drained) }()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		signalled := time.Now()
		// The upstream streams for 40s: an exit around 11s proves the timeout.
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
				listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
				p := startBinary(t, bin, "UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR="+listen, "ADMIN_ADDR=", tt.env)
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
			{[]string{"keys", "--help"}, "", 0, "Usage: idemproxy keys", ""},
			{[]string{"keys", "get", "--help"}, "", 0, "--body", ""},
			{[]string{"keys", "get", "abc"}, "REDIS_URL=" + srv.URL(), 2, "", "Usage: idemproxy keys get"},
			{[]string{"keys", "list"}, "", 1, "", "REDIS_URL is empty: keys needs the Redis the proxies use"},
			{[]string{"keys", "get", strings.Repeat("0", 64)}, "REDIS_URL=" + srv.URL(), 1, "", "no record for key_hash"},
			{[]string{"keys", "get", hash}, "REDIS_URL=" + srv.URL(), 0, `"state":"unknown","status":504`, ""},
			{[]string{"keys", "purge", hash}, "REDIS_URL=" + srv.URL(), 0, `{"key_hash":"` + hash + `","purged":true}`, ""},
		} {
			cmd := exec.Command(bin, tt.args...)
			cmd.Env = []string{tt.env}
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if code := cmd.ProcessState.ExitCode(); (err != nil && !errors.As(err, &ee)) || code != tt.code ||
				!strings.Contains(stdout.String(), tt.stdout) || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("idemproxy %q: exit %d (%v)\nstdout %q\nstderr %q\nwant exit %d, %q, %q", tt.args, code, err, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
			}
		}
	})
}

// proc is an idemproxy process this test started.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *testutil.SyncBuffer
	done           chan struct{}
}

// startBinary runs bin with exactly env; it is killed when the test ends if
// it is still running.
func startBinary(t *testing.T, bin string, env ...string) *proc {
	t.Helper()
	return startBinaryArgs(t, []string{bin}, env...)
}

// startBinaryArgs is startBinary with arguments: argv[0] is the program.
func startBinaryArgs(t *testing.T, argv []string, env ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", argv[0], err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill() // our own child, by its pid
			<-p.done
		}
		if t.Failed() {
			t.Logf("idemproxy stdout:\n%s\nstderr:\n%s", p.stdout.String(), p.stderr.String())
		}
	})
	return p
}

// wait returns the exit code, or fails the test if the process is still
// running after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("process %d still running after %v", p.cmd.Process.Pid, timeout)
		return -1
	}
}

// blockingUpstream holds each request until release (or hold runs out, or
// its client leaves), then answers 201.
type blockingUpstream struct {
	*testutil.Upstream
	received chan struct{}
	released chan struct{}
	once     sync.Once
}

func (u *blockingUpstream) release() { u.once.Do(func() { close(u.released) }) }

func newBlockingUpstream(t *testing.T, hold time.Duration) *blockingUpstream {
	t.Helper()
	u := &blockingUpstream{received: make(chan struct{}, 1), released: make(chan struct{})}
	u.Upstream = testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n := u.Calls.Load()
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case u.received <- struct{}{}:
		default:
		}
		timer := time.NewTimer(hold)
		defer timer.Stop()
		select {
		case <-u.released:
		case <-timer.C:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	})
	t.Cleanup(u.release) // runs first: lets Close return
	return u
}

// streamingUpstream answers every request 200 at once and then writes a
// line every 100ms until release, its client leaves, or hold runs out.
type streamingUpstream struct {
	*httptest.Server
	released chan struct{}
	once     sync.Once
}

func (u *streamingUpstream) release() { u.once.Do(func() { close(u.released) }) }

func newStreamingUpstream(t *testing.T, hold time.Duration) *streamingUpstream {
	t.Helper()
	u := &streamingUpstream{released: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		timer := time.NewTimer(hold)
		defer timer.Stop()
		for {
			select {
			case <-u.released:
				return
			case <-timer.C:
				return
			case <-r.Context().Done():
				return
			case <-tick.C:
				if _, err := io.WriteString(w, "data: tick\n\n"); err != nil {
					return
				}
				_ = rc.Flush()
			}
		}
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.release) // runs first: lets Close return
	return u
}
