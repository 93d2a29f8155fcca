package main

import (
	"strings"
	"testing"
)

// TestWaitTimeoutCountsAgainstTheLock: with REDIS_WAIT_REPLICAS the claim's
// answer comes back only after WAIT (up to REDIS_WAIT_TIMEOUT), and the lock
// runs from the claim. A lock that does not outlast WAIT and the upstream
// call lets a retry take the claim over while the first request still runs
// (review17c: both were forwarded, the key executed twice), so such a
// configuration does not start; the same for a route's lock=, and
// SHUTDOWN_TIMEOUT covers the WAIT too.
func TestWaitTimeoutCountsAgainstTheLock(t *testing.T) {
	base := []string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0?read_timeout=30s"}
	for _, tc := range []struct {
		name string
		env  []string
		want string // "" accepted; else a refusal containing it
	}{
		{"WAIT beyond the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=15s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"},
			`REDIS_WAIT_TIMEOUT="15s" + UPSTREAM_TIMEOUT="1s" must be below LOCK_TTL="6s"`},
		{"WAIT plus upstream equal to the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=5s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"},
			`must be below LOCK_TTL="6s"`},
		{"WAIT plus upstream below the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=4s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"}, ""},
		{"no WAIT: the timeout does not count", []string{"REDIS_WAIT_TIMEOUT=15s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"}, ""},
		{"a route's lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=3s", "UPSTREAM_TIMEOUT=2s", "ROUTES=POST /v1/* lock=4s"},
			`lock=4s must be above REDIS_WAIT_TIMEOUT="3s" + UPSTREAM_TIMEOUT="2s"`},
		{"a route's lock that outlasts both", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=3s", "UPSTREAM_TIMEOUT=2s", "ROUTES=POST /v1/* lock=6s"}, ""},
		{"shutdown without room for WAIT", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"},
			`SHUTDOWN_TIMEOUT="60s" must be at least REQUEST_READ_TIMEOUT="10s" + UPSTREAM_TIMEOUT="30s" + REDIS_WAIT_TIMEOUT="8s"`},
		{"shutdown with room for WAIT", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s", "SHUTDOWN_TIMEOUT=64s"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(append(append([]string{}, base...), tc.env...))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted; want a refusal containing %s", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("refusal %v\ndoes not contain %s", err, tc.want)
			}
		})
	}
}
