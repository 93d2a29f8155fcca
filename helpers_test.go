package main

// Helpers that the tests of several files of this package share: an
// upstream, the proxy started in-process, an HTTP client and its requests.
// Helpers for more than one package are in internal/testutil.

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
