package e2e

// Helpers shared by the tests of this package: the binary as a child
// process, what it logs and exports, `idemproxy keys` as a subprocess,
// upstreams, and keyed requests.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// raceEnabled is set (race_test.go) when the tests are built with -race;
// the binary is built the same way then.
var raceEnabled bool

// proc is a process a test started: the binary or make. It is killed
// (SIGKILL, by its pid) when the test ends if it still runs, and its
// output is shown if the test failed.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *testutil.SyncBuffer
	done           chan struct{}
}

// startProc runs argv (argv[0] is the program) with exactly env: nothing of
// the test's own environment reaches it.
func startProc(t *testing.T, argv []string, env ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append([]string{}, env...) // never nil: nil would pass the test's own
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", argv[0], err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the race detector found a data race in %s (pid %d):\n%s", argv[0], p.cmd.Process.Pid, p.stderr.String())
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stdout:\n%s\nstderr:\n%s", argv[0], p.cmd.Process.Pid, tail(p.stdout.String(), 60), tail(p.stderr.String(), 60))
		}
	})
	return p
}

// startBinary runs the binary with exactly env.
func startBinary(t *testing.T, env ...string) *proc {
	t.Helper()
	return startProc(t, []string{binary}, env...)
}

// signal sends sig to the process, by its pid, unless it has exited.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("pid %d has exited already (code %d); cannot send it %v", p.cmd.Process.Pid, p.cmd.ProcessState.ExitCode(), sig)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v to pid %d: %v", sig, p.cmd.Process.Pid, err)
	}
}

// kill SIGKILLs the process, by its pid, unless it has exited, and waits
// for it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait returns the exit code, or fails the test if the process still runs
// after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("pid %d still running after %v", p.cmd.Process.Pid, timeout)
		return -1
	}
}

// proxy is the binary serving: its listeners' addresses, read from its
// start line.
type proxy struct {
	*proc
	listen string // host:port of LISTEN_ADDR
	admin  string // host:port of ADMIN_ADDR; "" when it has none
}

// startProxy runs the binary with env and waits (at most 30 s) until it
// serves: its admin listener answers /healthz (without one, its listener
// accepts), and, unless LOG_LEVEL hides it, it has logged "idemproxy
// started" (start-up is over then: the readiness check and the upstream
// probe have run). LISTEN_ADDR and ADMIN_ADDR are free ports of 127.0.0.1
// unless env sets them. It does not wait for /readyz: see startReady.
func startProxy(t *testing.T, env ...string) *proxy {
	t.Helper()
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	_, fixedListen := vars["LISTEN_ADDR"]
	_, fixedAdmin := vars["ADMIN_ADDR"]
	quiet := vars["LOG_LEVEL"] == "warn" || vars["LOG_LEVEL"] == "error"
	for attempt := 1; ; attempt++ {
		p := &proxy{listen: vars["LISTEN_ADDR"], admin: strings.TrimSpace(vars["ADMIN_ADDR"])}
		var ports []string
		if !fixedListen {
			p.listen = "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
			ports = append(ports, "LISTEN_ADDR="+p.listen)
		}
		if !fixedAdmin {
			p.admin = "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
			ports = append(ports, "ADMIN_ADDR="+p.admin)
		}
		p.proc = startBinary(t, append(ports, env...)...)
		err := p.waitServing(quiet)
		if err == nil {
			return p
		}
		// A free port can be taken before the proxy binds it: try others.
		if attempt < 3 && len(ports) > 0 && p.exited() && strings.Contains(p.stderr.String(), "address already in use") {
			t.Logf("the proxy could not bind its port, trying others: %s", strings.TrimSpace(p.stderr.String()))
			continue
		}
		t.Fatalf("%v\nstderr: %s\nstdout: %s", err, p.stderr, tail(p.stdout.String(), 20))
	}
}

// waitServing waits until p serves (see startProxy).
func (p *proxy) waitServing(quiet bool) error {
	c := plainClient()
	c.Timeout = time.Second
	deadline := time.Now().Add(30 * time.Second)
	for {
		var up bool
		if p.admin != "" {
			status, _, err := get(c, "http://"+p.admin+"/healthz")
			up = err == nil && status == http.StatusOK
		} else if conn, err := net.DialTimeout("tcp", p.listen, time.Second); err == nil {
			conn.Close()
			up = true
		}
		if up && (quiet || strings.Contains(p.logs(), `"message":"idemproxy started"`)) {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("the proxy exited (code %d) before it served", p.cmd.ProcessState.ExitCode())
		}
		if time.Now().After(deadline) {
			return errors.New("the proxy did not serve within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startReady is startProxy, then a wait (at most 10 s) until /readyz
// answers 200. The proxy needs its admin listener.
func startReady(t *testing.T, env ...string) *proxy {
	t.Helper()
	p := startProxy(t, env...)
	p.waitReady(t, http.StatusOK, 10*time.Second)
	return p
}

// url is the address of path on the proxy's listener.
func (p *proxy) url(path string) string { return "http://" + p.listen + path }

// adminURL is the address of path on the proxy's admin listener.
func (p *proxy) adminURL(t *testing.T, path string) string {
	t.Helper()
	if p.admin == "" {
		t.Fatal("the proxy has no admin listener (ADMIN_ADDR)")
	}
	return "http://" + p.admin + path
}

// waitReady polls /readyz until it answers want, at most within, and
// returns that body.
func (p *proxy) waitReady(t *testing.T, want int, within time.Duration) string {
	t.Helper()
	return waitStatus(t, plainClient(), p.adminURL(t, "/readyz"), want, within)
}

// stop sends SIGTERM and returns the exit code; it fails the test if the
// process has not exited within timeout.
func (p *proxy) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	return p.wait(t, timeout)
}

// logs is everything the proxy has written to stdout: its JSON log. Lines
// at info and below reach it within about 100 ms (the log buffer), the
// others at once.
func (p *proxy) logs() string { return p.stdout.String() }

// logLines returns the proxy's log lines, decoded.
func (p *proxy) logLines() []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(p.logs(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// countLog counts the log lines whose message contains msg.
func (p *proxy) countLog(msg string) int {
	n := 0
	for _, m := range p.logLines() {
		if s, _ := m["message"].(string); strings.Contains(s, msg) {
			n++
		}
	}
	return n
}

// metric reads the value of an unlabelled series from the proxy's /metrics.
func (p *proxy) metric(t *testing.T, name string) float64 {
	t.Helper()
	body := getBody(t, plainClient(), p.adminURL(t, "/metrics"))
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, line, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s: not in /metrics", name)
	return 0
}

// waitReplayCacheOn waits until the proxy's replay cache answers: once its
// purge subscription is verified, milliseconds after the start. Before that
// every replay is read from Redis, and a test of what the cache does would
// show nothing.
func (p *proxy) waitReplayCacheOn(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "idemproxy_replay_cache_on 1", func() bool {
		return p.metric(t, "idemproxy_replay_cache_on") == 1
	})
}

// cachedAnswer posts key to the proxy's /v1/orders and retries it twice,
// each retry a replay of the first answer: the first from Redis, which
// fills the replay cache, the second from that cache (which it checks). It
// returns the first answer.
func (p *proxy) cachedAnswer(t *testing.T, c *http.Client, key string) response {
	t.Helper()
	p.waitReplayCacheOn(t)
	url := p.url("/v1/orders")
	first := mustPost(t, c, url, key, `{}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %q", first.status, first.body)
	}
	var hits float64
	for i := range 2 {
		if i == 1 {
			hits = p.metric(t, "idemproxy_replay_cache_hits_total")
		}
		if r := mustPost(t, c, url, key, `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want a replay of %q", r.status, r.body, first.body)
		}
	}
	if n := p.metric(t, "idemproxy_replay_cache_hits_total") - hits; n != 1 {
		t.Fatalf("the second retry made %v replay cache hits, want 1 (answered from the cache)", n)
	}
	return first
}

// keysRun runs `idemproxy keys args...` with exactly env and returns its
// output and exit status.
func keysRun(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"keys"}, args...)...)
	cmd.Env = append([]string{}, env...) // never nil: nil would pass the test's own
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run idemproxy keys: %v", err)
	}
	if strings.Contains(errOut.String(), "WARNING: DATA RACE") {
		t.Errorf("the race detector found a data race in idemproxy keys %q:\n%s", args, errOut.String())
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// keysOK runs keys and fails t unless it exits 0.
func keysOK(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := keysRun(t, env, args...)
	if code != 0 {
		t.Fatalf("keys %q: exit %d\nstderr: %s", args, code, errOut)
	}
	return out
}

// newUpstream answers 201 with a body naming the call.
func newUpstream(t *testing.T) *testutil.Upstream {
	t.Helper()
	var u *testutil.Upstream
	u = testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n := u.Calls.Load()
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n)
	})
	return u
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

// waitReceived waits (at most 10 s) until the upstream has received a request.
func (u *blockingUpstream) waitReceived(t *testing.T) {
	t.Helper()
	select {
	case <-u.received:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream did not receive the request within 10s")
	}
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

// newClient is an HTTP client with its own connections, closed when the
// test ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// plainClient is for one-off reads of the admin listener.
func plainClient() *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

type response struct {
	status int
	header http.Header
	body   string
	err    error
}

// post sends a keyed POST; safe to call from any goroutine.
func post(c *http.Client, url, key, body string) response {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

func mustPost(t *testing.T, c *http.Client, url, key, body string) response {
	t.Helper()
	r := post(c, url, key, body)
	if r.err != nil {
		t.Fatalf("POST %s (key %s): %v", url, key, r.err)
	}
	return r
}

func get(c *http.Client, url string) (int, string, error) {
	res, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// waitStatus polls url until it answers want, and returns that body.
func waitStatus(t *testing.T, c *http.Client, url string, want int, timeout time.Duration) string {
	t.Helper()
	var body string
	testutil.Eventually(t, timeout, fmt.Sprintf("GET %s answers %d", url, want), func() bool {
		status, b, err := get(c, url)
		body = b
		return err == nil && status == want
	})
	return body
}

func getBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	status, body, err := get(c, url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: got %v %v, want %v", url, status, err, http.StatusOK)
	}
	return body
}

func checkProblem(t *testing.T, r response, status int) {
	t.Helper()
	if got := r.header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", got)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem: got %+v, want status %v and type, title, detail set", p, status)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// tail returns the last n lines of s, each cut at 400 bytes.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	lines = lines[max(0, len(lines)-n):]
	for i, line := range lines {
		if len(line) > 400 {
			lines[i] = line[:400] + "..."
		}
	}
	return strings.Join(lines, "\n")
}
