package main

// The purge watch's log when the probe is refused (review17g).

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestProbeRefusedLoggedOnceWithItsHint: the proxy's Redis user has the
// channel but not PUBLISH (the README's second requirement, easy to miss).
// Each cycle's probe is refused. It was logged as a new failure every cycle
// (a confirmation ended the last one, with the cache on meanwhile,
// unverified), with a hint to grant the channel, which the user has. Now
// the cache turns on only when a probe comes back, so one unchanging cause
// is one line (then at most one a minute), with the PUBLISH hint.
func TestProbeRefusedLoggedOnceWithItsHint(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "idemproxy", "on", ">proxy-secret", "~idem:*", "+@all", "-publish",
		"resetchannels", "&idem:purge").Err(); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	_, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL=redis://idemproxy:proxy-secret@"+srv.Addr()+"/0",
		"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
	count := func(s string) int { return strings.Count(logs.String(), s) }
	testutil.Eventually(t, 15*time.Second, "the refused probe is logged", func() bool {
		return count("purge subscription failed") >= 1
	})
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "purge subscription failed") {
			line = l
			break
		}
	}
	if strings.Contains(line, "NOPERM") && !strings.Contains(strings.ToLower(line), "+publish") {
		t.Errorf("PUBLISH refused, but the hint names only the channel the user already has:\n%s", line)
	}
	// One more cycle: 1 s backoff, 10 s until the next probe, margin.
	deadline := time.Now().Add(13 * time.Second)
	for time.Now().Before(deadline) && count("purge subscription failed") < 2 {
		time.Sleep(200 * time.Millisecond)
	}
	if n, on := count("purge subscription failed"), count("purge subscription confirmed"); n >= 2 {
		t.Errorf("one unchanging cause (no PUBLISH) logged %d failure lines and %d \"cache on again\" lines within ~25 s "+
			"(want 1, then at most once a minute); the cache flaps on for 10 s of every 11, never verified", n, on)
	}
}
