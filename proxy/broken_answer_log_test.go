package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAnswerBrokenMidBodyIsLoggedWithItsRequest: an upstream answer whose
// body breaks off is logged as a warning of its request (request_id, the
// read error), keyed or not, and not as ReverseProxy's own line without a
// level or an id, which no one can tie to a request.
func TestAnswerBrokenMidBodyIsLoggedWithItsRequest(t *testing.T) {
	for _, key := range []string{"", "broken-1"} {
		name := "pass-through"
		if key != "" {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, miniBackend, nil)
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "partial")
				_ = http.NewResponseController(w).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
			})
			// The client sees the answer cut short, or no answer at all
			// (the cut can come before the headers are flushed).
			_, _ = e.send(context.Background(), e.srv, req{key: key, body: "b"})
			access := waitLogLine(t, e.logs, `"message":"request"`, 5*time.Second)
			var a struct {
				ID string `json:"request_id"`
			}
			if err := json.Unmarshal([]byte(access), &a); err != nil || a.ID == "" {
				t.Fatalf("access line %s: %v", access, err)
			}
			var found bool
			for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Errorf("a log line that is not JSON: %q", l)
					continue
				}
				if m["level"] == nil {
					t.Errorf("a log line without a level: %s", l)
				}
				msg, _ := m["message"].(string)
				if strings.Contains(msg, "broke off") {
					found = true
					if m["level"] != "warn" || m["request_id"] != a.ID || m["error"] == nil {
						t.Errorf("the broken answer's line %s: want level warn, request_id %s and the read error", l, a.ID)
					}
				}
			}
			if !found {
				t.Errorf("no line says the answer broke off:\n%s", e.logs)
			}
		})
	}
}
