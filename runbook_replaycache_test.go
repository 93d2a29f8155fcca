package main

import (
	"os"
	"strings"
	"testing"
)

// TestRunbookReplayCacheOffFailMode: the runbook "## IdemproxyReplayCacheOff" (docs/runbook.md) says
// "Nothing is replayed wrongly and nothing executes twice; replays cost a Redis round trip
// each", and lists "Redis unreachable from the pod" among its causes. While Redis is
// unreachable replays are not read from Redis: they follow FAIL_MODE, and with FAIL_MODE=open a
// retry of a completed request is forwarded again ("Replay cache", "Redis unreachable"; the
// metric's own row says "or follow FAIL_MODE while it is unreachable"). The section, and the
// alerts-table row ("every replay is read from Redis"), should say so.
func TestRunbookReplayCacheOffFailMode(t *testing.T) {
	b, err := os.ReadFile("docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	_, sec, ok := strings.Cut(readme, "\n## IdemproxyReplayCacheOff\n")
	if !ok {
		t.Fatal("no runbook section")
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	flat := strings.Join(strings.Fields(sec), " ")
	if strings.Contains(flat, "nothing executes twice") && strings.Contains(flat, "unreachable") && !strings.Contains(flat, "FAIL_MODE") {
		t.Errorf("runbook IdemproxyReplayCacheOff says nothing executes twice and names Redis unreachable as a cause, without FAIL_MODE (open: retries of completed requests are forwarded again)")
	}
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `IdemproxyReplayCacheOff` |") && !strings.Contains(line, "FAIL_MODE") {
			t.Errorf("alerts table row says %q; while Redis is unreachable replays follow FAIL_MODE, not read from Redis", line)
		}
	}
}
