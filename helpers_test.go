package main

// Helpers that the tests of several files of this package share: an
// upstream, the proxy started in-process (start, or run as main calls it),
// an HTTP client and its requests, what the admin listener exports,
// `idemproxy keys` through run, and Redis as tests need it. Helpers for more
// than one package are in internal/testutil and internal/redistest.
//
// A test runs in parallel (t.Parallel) only when it mostly waits and shares
// nothing: the process-wide state some tests change (the OTEL_* environment
// and otel's error handler, zerolog.ErrorHandler, Go's memory limit and
// memlimit.go's variables, which run sets too) is left to serial tests,
// which all end before the parallel ones start, and so are tests whose
// assertions are tight time bounds. go-redis has one logger for
// the process (set by every openRedis), so a parallel test must not assert
// that a log or keys' stderr holds nothing else.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// parallelTests is how many of the parallel tests below run at once unless
// -parallel says otherwise: they wait (on a probe period, on WAIT, on a
// TTL), they do not use the CPU.
const parallelTests = 4

func TestMain(m *testing.M) {
	flag.Parse()
	testutil.DefaultParallel(parallelTests)
	os.Exit(m.Run())
}

// newUpstream stands in for the protected API: it answers 201 with a body
// and a Location naming the call.
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

// startEnv loads env and starts the proxy; it is shut down when the test ends.
func startEnv(t *testing.T, env ...string) (*app, *testutil.SyncBuffer) {
	t.Helper()
	cfg, err := loadConfig(env)
	if err != nil {
		t.Fatalf("loadConfig(%q): %v", env, err)
	}
	logs := &testutil.SyncBuffer{}
	return startAppLog(t, cfg, logs), logs
}

// startProxy starts the proxy in front of upstream, its two listeners on
// free ports of 127.0.0.1, with env added (a later entry wins over an
// earlier one); it is shut down when the test ends.
func startProxy(t *testing.T, upstream string, env ...string) (*app, *testutil.SyncBuffer) {
	t.Helper()
	return startEnv(t, append([]string{"UPSTREAM_URL=" + upstream, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0"}, env...)...)
}

// proxyURL is the address of path on a's listener.
func proxyURL(a *app, path string) string { return "http://" + a.proxyAddr.String() + path }

// adminURL is the address of path on a's admin listener.
func adminURL(a *app, path string) string { return "http://" + a.adminAddr.String() + path }

// startApp starts the proxy with cfg, its log discarded.
func startApp(t *testing.T, cfg *Config) *app {
	t.Helper()
	return startAppLog(t, cfg, &testutil.SyncBuffer{})
}

// startAppLog starts the proxy with cfg, logging to logs, and shuts it down
// when the test ends (showing the log if the test failed).
func startAppLog(t *testing.T, cfg *Config, logs *testutil.SyncBuffer) *app {
	t.Helper()
	a, err := start(cfg, zerolog.New(logs).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := a.shutdown(5 * time.Second); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return a
}

// newClient is an HTTP client with its own connections, closed when the
// test ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// response is what a request got back.
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

// mustPost is post, failing t if the request got no answer.
func mustPost(t *testing.T, c *http.Client, url, key, body string) response {
	t.Helper()
	r := post(c, url, key, body)
	if r.err != nil {
		t.Fatalf("POST %s (key %s): %v", url, key, r.err)
	}
	return r
}

// get GETs url and returns the status and body.
func get(c *http.Client, url string) (int, string, error) {
	res, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// getStatus GETs url and returns the status, failing t if it cannot.
func getStatus(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	status, _, err := get(c, url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return status
}

// getBody GETs url and returns the body, failing t unless it is a 200.
func getBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	status, body, err := get(c, url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: got %v %v, want %v", url, status, err, http.StatusOK)
	}
	return body
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

// checkProblem checks that r is a problem+json answer of status.
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

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// cachedAnswer posts key to a's /v1/orders and retries it twice, each
// retry a replay of the first answer: the first from Redis, which fills the
// proxy's replay cache, the second from that cache (which it checks). It
// returns the first answer. a needs its admin listener.
func cachedAnswer(t *testing.T, c *http.Client, a *app, key string) response {
	t.Helper()
	waitReplayCacheOn(t, c, a)
	url := proxyURL(a, "/v1/orders")
	first := mustPost(t, c, url, key, `{}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %q", first.status, first.body)
	}
	var hits float64
	for i := range 2 {
		if i == 1 {
			hits = metric(t, c, a, "idemproxy_replay_cache_hits_total")
		}
		if r := mustPost(t, c, url, key, `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want a replay of %q", r.status, r.body, first.body)
		}
	}
	if n := metric(t, c, a, "idemproxy_replay_cache_hits_total") - hits; n != 1 {
		t.Fatalf("the second retry made %v replay cache hits, want 1 (answered from the cache)", n)
	}
	return first
}

// waitReplayCacheOn waits until a's replay cache answers: once its purge
// subscription is verified, milliseconds after the start. Before that
// every replay is read from Redis, and a test of what the cache does
// would show nothing. a needs its admin listener.
func waitReplayCacheOn(t *testing.T, c *http.Client, a *app) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "idemproxy_replay_cache_on 1", func() bool {
		return metric(t, c, a, "idemproxy_replay_cache_on") == 1
	})
}

// metric reads the value of an unlabelled series from a's /metrics.
func metric(t *testing.T, c *http.Client, a *app, name string) float64 {
	t.Helper()
	if a.adminAddr == nil {
		t.Fatal("metric: the proxy has no admin listener (ADMIN_ADDR)")
	}
	body := getBody(t, c, adminURL(a, "/metrics"))
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

// noPublishUser makes a user of srv that may use the proxy's keys but no
// Pub/Sub channel (Redis 7's default for a new user: a purge's
// announcement is refused), and returns the environment of a keys command
// run as that user.
func noPublishUser(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "nopub", "on", ">op-secret", "~idem:*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	return []string{"REDIS_URL=redis://nopub:op-secret@" + srv.Addr() + "/0"}
}

// blackHole is a TCP listener on 127.0.0.1 that accepts and never
// answers: a stalled Redis (CLIENT PAUSE, a frozen VM, a TCP proxy whose
// backend is gone).
func blackHole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// runProxy is run running in-process: its listeners, and stop, which
// cancels it and returns run's error (the test fails if run does not return
// within 10s).
type runProxy struct {
	listen, admin string
	stop          func() error
}

// startRun runs run in-process against a test upstream, with its two
// listeners on free ports of 127.0.0.1 and extra added to its environment,
// and waits until /readyz answers 200.
func startRun(t *testing.T, stdout io.Writer, extra ...string) runProxy {
	t.Helper()
	up := newUpstream(t)
	p := runProxy{
		listen: "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
		admin:  "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
	}
	env := append([]string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=" + p.listen, "ADMIN_ADDR=" + p.admin,
		"UPSTREAM_TIMEOUT=5s", "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=22s"}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"idemproxy"}, env, stdout, &stderr) }()
	p.stop = func() error {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("run did not return within 10s of ctx cancel")
			return nil
		}
	}
	waitStatus(t, newClient(t), "http://"+p.admin+"/readyz", http.StatusOK, 10*time.Second)
	return p
}

// keysRun runs `idemproxy keys args...` through run, as main does, with
// env, and returns its output and exit status.
func keysRun(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	// stderr also becomes go-redis's logger (openRedis), which proxies of
	// the same test process may write to: a buffer safe for that.
	var out bytes.Buffer
	var errb testutil.SyncBuffer
	err := run(context.Background(), append([]string{"idemproxy", "keys"}, args...), env, &out, &errb)
	if code = exitCode(err); err != nil && code == 1 {
		_, _ = errb.Write([]byte("idemproxy: " + err.Error() + "\n")) // what main prints
	}
	return out.String(), errb.String(), code
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

// normalise replaces what changes from run to run (times, TTLs,
// fingerprints) in keys' JSON output.
func normalise(s string) string {
	s = regexp.MustCompile(`"(claimed_at|completed_at|lock_expires_at)":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"`).ReplaceAllString(s, `"$1":"TIME"`)
	s = regexp.MustCompile(`"ttl_ms":[1-9]\d*`).ReplaceAllString(s, `"ttl_ms":TTL`)
	s = regexp.MustCompile(`"Date":\["[^"]+"\]`).ReplaceAllString(s, `"Date":["DATE"]`)
	return regexp.MustCompile(`"fingerprint":"[0-9a-f]{64}"`).ReplaceAllString(s, `"fingerprint":"FP"`)
}

// lastKeyHash returns the key_hash of the last access-log line ("request").
func lastKeyHash(t *testing.T, logs string) string {
	t.Helper()
	var hash string
	for line := range strings.SplitSeq(logs, "\n") {
		var e struct {
			Message string `json:"message"`
			KeyHash string `json:"key_hash"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Message == "request" {
			hash = e.KeyHash
		}
	}
	if hash == "" {
		t.Fatalf("no access-log line with a key_hash in:\n%s", logs)
	}
	return hash
}

// storeRecord claims k on s and records rec for it, as a proxy does.
func storeRecord(t *testing.T, s *claim.Store, k claim.Key, rec *claim.Record) {
	t.Helper()
	ctx := context.Background()
	lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil || lease == nil {
		t.Fatalf("claim %s: lease %v, err %v", k, lease, err)
	}
	if err := lease.Complete(ctx, rec, time.Hour); err != nil {
		t.Fatalf("record %s: %v", k, err)
	}
}

// completedKey claims the key named key on s and records a 201 for it.
func completedKey(t *testing.T, s *claim.Store, key string) claim.Key {
	t.Helper()
	k := claim.NewKey(nil, key)
	storeRecord(t, s, k, &claim.Record{Status: 201, Body: []byte("done")})
	return k
}

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
