package main

// Tests of probe.go: the dial to UPSTREAM_URL at start.

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestProbeUpstream: one bounded dial at start; a warning naming
// UPSTREAM_URL when nothing answers, silence when something does.
func TestProbeUpstream(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var logs testutil.SyncBuffer
	logger := zerolog.New(&logs)
	up, _ := url.Parse("http://user:secret@" + l.Addr().String() + "/base")
	if !probeUpstream(context.Background(), up, logger) {
		t.Errorf("probe of a listening upstream: false, want true")
	}
	if logs.String() != "" {
		t.Errorf("probe of a listening upstream logged %q, want nothing", logs.String())
	}

	down, _ := url.Parse("http://user:secret@127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) + "/base")
	begin := time.Now()
	if probeUpstream(context.Background(), down, logger) {
		t.Errorf("probe of a closed port: true, want false")
	}
	if d := time.Since(begin); d > probeTimeout+time.Second {
		t.Errorf("probe took %s, want at most about %s", d, probeTimeout)
	}
	var entry struct{ Level, Upstream, Message, Error string }
	if err := json.Unmarshal([]byte(logs.String()), &entry); err != nil {
		t.Fatalf("want one JSON warning, got %q: %v", logs.String(), err)
	}
	if entry.Level != "warn" || !strings.Contains(entry.Message, "UPSTREAM_URL") || entry.Error == "" {
		t.Errorf("warning %+v: want level warn, a message naming UPSTREAM_URL and the dial error", entry)
	}
	if entry.Upstream != down.Redacted() || strings.Contains(logs.String(), "secret") {
		t.Errorf("warning names upstream %q, want %q without the password", entry.Upstream, down.Redacted())
	}
}
