package main

// Tests of run(): what the binary's main does with its arguments, its
// environment and a context, in-process.

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

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
