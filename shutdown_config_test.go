package main

import "testing"

// TestShutdownTimeoutCoversRequestReadTimeout: http.Server.Shutdown does
// not cut a request whose body is arriving. One that started just before
// SIGTERM may read for REQUEST_READ_TIMEOUT, call the upstream for
// UPSTREAM_TIMEOUT, then record for 10s; a SHUTDOWN_TIMEOUT shorter than
// that sum exits with its claim in flight, and after LOCK_TTL the client's
// retry executes again. So loadConfig refuses it (the earlier rule, without
// REQUEST_READ_TIMEOUT, accepted 45s against the defaults' 50s).
func TestShutdownTimeoutCoversRequestReadTimeout(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=45s"} // the earlier default
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a keyed request arriving at SIGTERM may need 10s (body) + 30s (upstream) + 10s (record) = 50s > SHUTDOWN_TIMEOUT 45s", env)
	}
	env = []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=5m", "SHUTDOWN_TIMEOUT=40s", "LOCK_TTL=60s"}
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a body may take 5m before its 30s upstream call, SHUTDOWN_TIMEOUT is 40s", env)
	}
}
