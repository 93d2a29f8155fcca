package main

// Helpers that the tests of several files of this package share: an
// upstream, the proxy started in-process, an HTTP client and its requests.
// Helpers for more than one package are in internal/testutil.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// newUpstream is a legacy API that answers 201 with a body naming the call.
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

func startApp(t *testing.T, cfg *Config) *app {
	t.Helper()
	return startAppLog(t, cfg, &testutil.SyncBuffer{})
}

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

func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
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

// cachedAnswer posts key to a's /v1/orders and retries it twice, each
// retry a replay of the first answer: the first from Redis, which fills the
// proxy's replay cache, the second from that cache (which it checks). It
// returns the first answer. a needs its admin listener.
func cachedAnswer(t *testing.T, c *http.Client, a *app, key string) response {
	t.Helper()
	waitReplayCacheOn(t, c, a)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
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
	body := getBody(t, c, "http://"+a.adminAddr.String()+"/metrics")
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

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
