package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestPlainErrorBlame: a failed pass-through round trip is told by what
// failed first, whatever error the Transport reports (usually "context
// canceled", whoever canceled). The timings that order these in a real
// forward are microseconds apart (a 1xx written just as the watchdog's
// time runs out), so the states are built here; the HTTP tests
// (passthrough_clientgone_test.go, passthrough_test.go) drive the others.
func TestPlainErrorBlame(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	h, err := New(nil, Options{Upstream: u, KeyHeader: "Idempotency-Key", UpstreamTimeout: time.Second,
		RequestReadTimeout: time.Second, MaxBodyBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	type state struct {
		clientGone, bodyBroke, bodyTimedOut bool
		due                                 time.Time // the watchdog's
		paused, stopped, noConn             bool
	}
	for _, tc := range []struct {
		name   string
		s      state
		status int
		typ    string // "" when nothing is written
	}{
		{"client hung up, watchdog time left", state{clientGone: true, due: now.Add(time.Hour)}, statusClientClosed, ""},
		{"client hung up mid-body (watchdog paused)", state{clientGone: true, bodyBroke: true, paused: true, due: now.Add(-time.Hour)}, statusClientClosed, ""},
		{"client's 1xx write failed as the watchdog's time ran out", state{clientGone: true, due: now.Add(-time.Millisecond)}, http.StatusGatewayTimeout, typeUpstreamTimeout},
		{"watchdog's time ran out, client there", state{due: now.Add(-time.Millisecond)}, http.StatusGatewayTimeout, typeUpstreamTimeout},
		{"watchdog's time ran out during the dial", state{due: now.Add(-time.Millisecond), noConn: true}, http.StatusBadGateway, typeUpstreamUnreachable},
		{"watchdog stopped (an answer arrived), then the client left", state{clientGone: true, stopped: true, due: now.Add(-time.Millisecond)}, statusClientClosed, ""},
		{"body unreadable, client there", state{bodyBroke: true, due: now.Add(time.Hour)}, http.StatusBadRequest, typeBodyUnreadable},
		{"body stalled", state{bodyTimedOut: true, clientGone: true, due: now.Add(-time.Millisecond)}, http.StatusRequestTimeout, typeRequestTimeout},
		{"upstream broke off", state{due: now.Add(time.Hour)}, http.StatusBadGateway, typeUpstreamFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, hangUp := context.WithCancel(context.Background())
			defer hangUp()
			if tc.s.clientGone {
				hangUp()
			}
			wd := &watchdog{timer: time.NewTimer(time.Hour), d: time.Second, due: tc.s.due, paused: tc.s.paused, done: tc.s.stopped}
			defer wd.timer.Stop()
			wd.gotConn.Store(!tc.s.noConn)
			rec := httptest.NewRecorder()
			rc := http.NewResponseController(rec)
			sw := &statusWriter{ResponseWriter: rec, res: &result{log: &h.opts.Logger, rc: rc}, client: client, wd: wd,
				body: &idleBody{wd: wd, rc: rc, ReadCloser: io.NopCloser(strings.NewReader("")), length: -1}}
			sw.body.broke.Store(tc.s.bodyBroke)
			sw.body.timedOut.Store(tc.s.bodyTimedOut)
			ctx, cancel := context.WithCancelCause(client)
			defer cancel(nil)
			r := httptest.NewRequest(http.MethodPost, "/v1/orders", nil).WithContext(context.WithValue(ctx, watchdogKey{}, wd))

			var aborted any
			func() {
				defer func() { aborted = recover() }()
				h.plainError(sw, r, context.Canceled)
			}()
			if want := tc.typ == ""; (aborted == http.ErrAbortHandler) != want || aborted != nil && !want {
				t.Errorf("panic %v; want http.ErrAbortHandler (no answer, not even net/http's 200): %v", aborted, want)
			}

			if sw.status != tc.status {
				t.Errorf("status %d, want %d", sw.status, tc.status)
			}
			if tc.typ == "" {
				if rec.Body.Len() != 0 {
					t.Errorf("wrote %q to a client that hung up", rec.Body)
				}
				return
			}
			if got := rec.Body.String(); !strings.Contains(got, `"type":"`+tc.typ+`"`) {
				t.Errorf("problem %s, want type %s", got, tc.typ)
			}
		})
	}
	if !errors.Is(errUpstreamStalled, context.DeadlineExceeded) {
		t.Error("errUpstreamStalled is not a deadline: upstreamAnswer would not make it a 504")
	}
}
