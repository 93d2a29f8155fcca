package main

// Tests of main.go: run, as the binary's main calls it, in-process (its
// arguments, its environment, a context that ends it), start and shutdown,
// and the log they write. As a child process: internal/e2e.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestRunVersion: --version needs no configuration.
func TestRunVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	// No UPSTREAM_URL: --version must not need a configuration.
	err := run(context.Background(), []string{"idemproxy", "--version"}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run --version: got %v, want nil", err)
	}
	if got, want := stdout.String(), "idemproxy "+version; !strings.HasPrefix(got, want) {
		t.Errorf("stdout: got %q, want prefix %q", got, want)
	}
}

// TestRunBadConfigStartsNothing: a malformed variable stops run at once,
// naming it, before any listener is bound or any line logged.
func TestRunBadConfigStartsNothing(t *testing.T) {
	listen := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000", "LISTEN_ADDR=" + listen, "ADMIN_ADDR=" + admin, "LOCK_TTL=abc"}
	var stdout, stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), []string{"idemproxy"}, env, &stdout, &stderr) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("run with a bad config did not return within 10s: it must refuse to start")
	}
	if err == nil {
		t.Fatalf("run: got nil error, want one naming LOCK_TTL")
	}
	if got, want := err.Error(), `LOCK_TTL="abc"`; !strings.Contains(got, want) {
		t.Errorf("run error: got %v, want it to contain %s", got, want)
	}
	if got := stdout.String(); got != "" {
		t.Errorf("stdout: got %q, want nothing (no logger, nothing started)", got)
	}
	for _, addr := range []string{listen, admin} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("something listens on %s after a refused start", addr)
		}
	}
}

// TestRunServesUntilCancelled: run serves until its context ends, then
// returns nil.
func TestRunServesUntilCancelled(t *testing.T) {
	var stdout testutil.SyncBuffer
	p := startRun(t, &stdout)
	if r := mustPost(t, newClient(t), "http://"+p.listen+"/v1/orders", "run-1", `{"n":1}`); r.status != http.StatusCreated {
		t.Errorf("POST: got %v, want %v", r.status, http.StatusCreated)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run after cancel: got %v, want nil", err)
	}
	if !strings.Contains(stdout.String(), "idemproxy started") {
		t.Errorf("log: got %q, want a start line", stdout.String())
	}
}

// TestShutdownNotHeldByPurgeWatch: with a Redis that accepts connections
// and never answers, a proxy must still shut down within SHUTDOWN_TIMEOUT.
// watchPurges' close waited for WatchPurges, whose deferred PubSub.Close
// waits for the PubSub's mutex, which go-redis holds while it redials and
// handshakes (5 s and more each time): shutdown(1s) took about 9 s. With
// REPLAY_CACHE_BYTES=0 (no watch) it takes under a millisecond.
func TestShutdownNotHeldByPurgeWatch(t *testing.T) {
	addr := blackHole(t)
	up := newUpstream(t)
	cfg, err := loadConfig([]string{"REDIS_URL=redis://" + addr + "/0", "UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR="})
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(cfg, zerolog.New(&testutil.SyncBuffer{}))
	if err != nil {
		t.Fatal(err)
	}
	// A second after start the purge watch is, as a rule, redialling. Its
	// state cannot be observed from here; shutting down right after its
	// first logged failure (between attempts) takes a millisecond and shows
	// nothing, so this wait is a time, not a condition.
	time.Sleep(time.Second)
	began := time.Now()
	err = a.shutdown(time.Second)
	if took := time.Since(began); took > 2500*time.Millisecond {
		t.Errorf("shutdown(1s) with a stalled Redis took %v (err %v): the purge watch holds it", took.Round(time.Millisecond), err)
	}
}

// TestConsoleLogNoColourOffTerminal: LOG_FORMAT=console writes no colour
// codes into a buffer, a pipe or a file; only a terminal gets them.
func TestConsoleLogNoColourOffTerminal(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "LOG_FORMAT=console"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	l := newLogger(cfg, &buf)
	l.Warn().Str("addr", "127.0.0.1:1").Msg("to a buffer")
	if bytes.Contains(buf.Bytes(), []byte("\x1b")) || !strings.Contains(buf.String(), "to a buffer") {
		t.Errorf("console log to a buffer: %q, want the message without escape codes", buf.String())
	}

	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	l = newLogger(cfg, f)
	l.Error().Str("addr", "127.0.0.1:1").Msg("to a file")
	f.Close()
	b, _ := os.ReadFile(path)
	if bytes.Contains(b, []byte("\x1b")) || !bytes.Contains(b, []byte("to a file")) {
		t.Errorf("console log to a file: %q, want the message without escape codes", b)
	}
	if isTerminal(&buf) || isTerminal(f) {
		t.Errorf("isTerminal: true for a buffer or a file")
	}
}

// TestUpstreamURLQueryNotLogged: UPSTREAM_URL's query, where legacy APIs
// take credentials (?api_key=...), is never logged: the start line and the
// probe's warning show scheme, host, port and path. url.URL.Redacted, used
// before, hides only a password in the user info.
func TestUpstreamURLQueryNotLogged(t *testing.T) {
	up := newUpstream(t)
	closed := "http://127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) // nothing listens: the probe warns
	for _, base := range []string{up.URL, closed} {
		_, logs := startProxy(t, base+"/api?api_key=Zq7xUpstreamS3cret", "ADMIN_ADDR=")
		s := logs.String() // start logs synchronously, before it returns
		if strings.Contains(s, "Zq7xUpstreamS3cret") {
			t.Errorf("UPSTREAM_URL's query credential is in the log:\n%s", grepLines(s, "Zq7xUpstreamS3cret"))
		}
		if want := `"upstream":"` + base + `/api?(query not shown)"`; !strings.Contains(s, want) {
			t.Errorf("the log does not show UPSTREAM_URL as %s:\n%s", want, s)
		}
	}
}

// TestRequestIDIsTheProxysOwn: the request id is put on the answer before
// the handler runs. When everything after treated it as one header among
// the upstream's, an upstream sending an X-Request-Id of its own (Rails'
// ActionDispatch::RequestId and many other frameworks do by default) made a
// fresh answer carry two values and a replay only the upstream's recorded
// one, so the id a client quoted from a replay was in no access-log line of
// the proxy. README: "Added by the proxy and not recorded: X-Request-Id (new
// on each answer)".
func TestRequestIDIsTheProxysOwn(t *testing.T) {
	srv := redistest.Start(t)
	up := testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "upstream-request-id") // as Rails' ActionDispatch::RequestId
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	})
	a, logs := startProxy(t, up.URL, "REDIS_URL="+srv.URL(), "ADMIN_ADDR=")
	base := proxyURL(a, "")
	c := newClient(t)

	answers := map[string][]string{} // name -> X-Request-Id values
	for _, step := range []struct{ name, method, key string }{
		{"first (executed)", http.MethodPost, "rid-1"},
		{"duplicate (replayed)", http.MethodPost, "rid-1"},
		{"passthrough", http.MethodGet, ""},
	} {
		req, err := http.NewRequest(step.method, base+"/v1/orders", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if step.key != "" {
			req.Header.Set("Idempotency-Key", step.key)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("%s: status %d, want 201", step.name, res.StatusCode)
		}
		answers[step.name] = res.Header.Values("X-Request-Id")
	}

	logged := map[string]bool{} // request_id of the access-log lines
	for _, line := range strings.Split(logs.String(), "\n") {
		var e struct {
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Message == "request" {
			logged[e.RequestID] = true
		}
	}
	for name, ids := range answers {
		if len(ids) != 1 || !logged[ids[0]] {
			t.Errorf("%s: X-Request-Id %q, want exactly the proxy's own id, the request_id of its access-log line (the upstream's id is not new on each answer and names no proxy log line)", name, ids)
		}
	}
}
