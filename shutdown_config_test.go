package main

import "testing"

// TestShutdownTimeoutCoversRequestReadTimeout: the SHUTDOWN_TIMEOUT
// bound (UPSTREAM_TIMEOUT + 10s of recording) forgets the time a keyed
// request may still spend receiving its body before it is claimed and
// forwarded. http.Server.Shutdown does not cut a request whose body is
// arriving: one that started just before SIGTERM may read for
// REQUEST_READ_TIMEOUT, then call the upstream for UPSTREAM_TIMEOUT, then
// record for 10s. With the defaults (10s + 30s + 10s = 50s against
// SHUTDOWN_TIMEOUT=45s) the process can exit after forwarding but before
// recording: the claim stays in flight, and after LOCK_TTL the client's
// retry takes it over and executes again - exactly what the check exists
// to prevent.
//
// Correct: require SHUTDOWN_TIMEOUT >= REQUEST_READ_TIMEOUT +
// UPSTREAM_TIMEOUT + 10s (and raise the default and the chart's grace
// accordingly), or stop accepting keyed bodies that cannot finish in time.
func TestShutdownTimeoutCoversRequestReadTimeout(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=45s"} // all defaults
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a keyed request arriving at SIGTERM may need 10s (body) + 30s (upstream) + 10s (record) = 50s > SHUTDOWN_TIMEOUT 45s", env)
	}
	env = []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=5m", "SHUTDOWN_TIMEOUT=40s", "LOCK_TTL=60s"}
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a body may take 5m before its 30s upstream call, SHUTDOWN_TIMEOUT is 40s", env)
	}
}
