package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

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

// TestRedisLibraryLogsAsJSON: with Redis unreachable, go-redis's own log
// lines come out through the proxy's logger as JSON, not as plain text.
func TestRedisLibraryLogsAsJSON(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) // nothing listens there
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=redis://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	st, err := openRedis(cfg, newLogger(cfg, logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := st.client.Ping(ctx).Err(); err == nil {
		t.Fatalf("PING %s answered; want it unreachable", addr)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if entry["component"] == "go-redis" && strings.Contains(entry["message"].(string), addr) {
			found = true
		}
	}
	if !found {
		t.Errorf("no go-redis line naming %s in the log:\n%s", addr, logs)
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
		_, logs := startEnv(t, "UPSTREAM_URL="+base+"/api?api_key=Zq7xUpstreamS3cret",
			"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
		s := logs.String() // start logs synchronously, before it returns
		if strings.Contains(s, "Zq7xUpstreamS3cret") {
			t.Errorf("UPSTREAM_URL's query credential is in the log:\n%s", grepLines(s, "Zq7xUpstreamS3cret"))
		}
		if want := `"upstream":"` + base + `/api?(query not shown)"`; !strings.Contains(s, want) {
			t.Errorf("the log does not show UPSTREAM_URL as %s:\n%s", want, s)
		}
	}
}
