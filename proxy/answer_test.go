package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// TestBehaviourTable is the README's "Behaviour" table, row by row, over
// the functions that decide every status. The HTTP tests (handler_test.go
// and the others) drive the same rows over real HTTP.
func TestBehaviourTable(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("http://127.0.0.1:1")
	h, err := New(nil, Options{Upstream: u, KeyHeader: "Idempotency-Key", UpstreamTimeout: time.Second,
		RequestReadTimeout: time.Second, MaxBodyBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	required := Policy{Required: true}
	open := Policy{FailOpen: true}
	store5xx := Policy{Store5xx: true}
	releaseAuth := Policy{ReleaseAuth: true}
	redisDown := fmt.Errorf("claim x: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")})
	redisOOM := fmt.Errorf("claim x: %w", oomError{})
	dialErr := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	timeout := fmt.Errorf("round trip: %w", context.DeadlineExceeded)

	rows := []struct {
		situation string
		got       answer
		status    int
		outcome   string
		typ       string
		retry     bool
	}{
		{"no key, key not required", h.keyAnswer(errNoKey, Policy{}, "POST"), 0, outcomeNoKey, "", false},
		{"no key, key required", h.keyAnswer(errNoKey, required, "POST"), 400, outcomeInvalid, typeKeyMissing, false},
		{"key invalid", h.keyAnswer(errors.New("key holds a comma"), Policy{}, "POST"), 400, outcomeInvalid, typeKeyInvalid, false},
		{"body over MAX_BODY_BYTES", h.bodyAnswer(&http.MaxBytesError{Limit: 10}, Policy{}), 413, outcomeTooLarge, typeBodyTooLarge, false},
		{"body not in time", h.bodyAnswer(errBodyTimeout, Policy{}), 408, outcomeInvalid, typeRequestTimeout, false},
		{"body unreadable", h.bodyAnswer(errors.New("unexpected EOF"), Policy{}), 400, outcomeInvalid, typeBodyUnreadable, false},
		{"upgrade not allowed", upgradeRefused("websocket"), 400, outcomeInvalid, typeUpgradeRefused, false},
		{"first request", recordAnswer(201, Policy{}, false), 201, outcomeExecuted, "", false},
		{"different fingerprint", h.claimAnswer(claim.ErrMismatch, nil, Policy{}), 422, outcomeMismatch, typeKeyReused, false},
		{"another upstream", h.claimAnswer(claim.ErrOtherUpstream, nil, open), 422, outcomeMismatch, typeKeyReused, false},
		{"first completed", notStoredAnswer(200), 200, outcomeReplayed, typeResponseNotStored, false},
		{"first in flight", h.claimAnswer(claim.ErrInFlight, nil, Policy{}), 409, outcomeInFlight, typeRequestOutstanding, true},
		{"client left while waiting", h.claimAnswer(context.Canceled, context.Canceled, Policy{}), 499, outcomeInFlight, "", false},
		{"record unreadable, even failing open", h.claimAnswer(claim.ErrBadRecord, nil, open), 500, outcomeStoreError, typeRecordUnreadable, false},
		{"Redis unreachable, fail closed", h.claimAnswer(redisDown, nil, Policy{}), 503, outcomeStoreError, typeStoreUnavailable, true},
		{"Redis unreachable, fail open", h.claimAnswer(redisDown, nil, open), 0, outcomeFailOpen, "", false},
		{"Redis refuses (OOM), fail open", h.claimAnswer(redisOOM, nil, open), 503, outcomeStoreError, typeStoreUnavailable, true},
		{"upstream unreachable", upstreamAnswer(dialErr, true), 502, outcomeReleased, typeUpstreamUnreachable, false},
		{"upstream 5xx, release", recordAnswer(503, Policy{}, false), 503, outcomeReleased, "", false},
		{"upstream 5xx, store", recordAnswer(503, store5xx, false), 503, outcomeExecuted, "", false},
		{"signature does not verify (verify=)", signatureInvalid(errors.New("no valid signature")), 401, outcomeSignatureInvalid, typeSignatureInvalid, false},
		{"upstream 401, key derived", recordAnswer(401, releaseAuth, false), 401, outcomeReleased, "", false},
		{"upstream 403, key derived", recordAnswer(403, releaseAuth, false), 403, outcomeReleased, "", false},
		{"upstream 401, header key or record4xx=all", recordAnswer(401, Policy{}, false), 401, outcomeExecuted, "", false},
		{"upstream 404, key derived", recordAnswer(404, releaseAuth, false), 404, outcomeExecuted, "", false},
		{"upstream timed out after sending", upstreamAnswer(timeout, false), 504, outcomeUpstreamError, typeUpstreamTimeout, false},
		{"connection reset after sending", upstreamAnswer(errors.New("connection reset"), false), 502, outcomeUpstreamError, typeUpstreamFailed, false},
		{"lock expired: takeover", recordAnswer(201, Policy{}, true), 201, outcomeTakeover, "", false},
		{"outcome unknown (hold), after a timeout", h.claimAnswer(&claim.UnknownError{Status: 504}, nil, open), 504, outcomeUnknown, typeOutcomeUnknown, false},
		{"outcome unknown (hold), after a reset", h.claimAnswer(&claim.UnknownError{Status: 502}, nil, Policy{}), 502, outcomeUnknown, typeOutcomeUnknown, false},
		{"outcome unknown (hold), lock expired", h.claimAnswer(&claim.UnknownError{Status: 504, Entered: true}, nil, Policy{}), 504, outcomeUnknown, typeOutcomeUnknown, false},
	}
	for _, r := range rows {
		if r.got.status != r.status || r.got.outcome != r.outcome || r.got.typ != r.typ || r.got.retryAfter != r.retry {
			t.Errorf("%s: got status %d outcome %q type %q retry %v; want %d %q %q %v",
				r.situation, r.got.status, r.got.outcome, r.got.typ, r.got.retryAfter, r.status, r.outcome, r.typ, r.retry)
		}
		if r.got.typ != "" && r.got.title == "" {
			t.Errorf("%s: problem without a title", r.situation)
		}
		if r.got.replayed != (r.outcome == outcomeUnknown) {
			t.Errorf("%s: Idempotent-Replayed %v", r.situation, r.got.replayed)
		}
	}
}

// TestObserveTable: in observe mode, what enforcing would have answered
// becomes an outcome, and the request is forwarded.
func TestObserveTable(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("http://127.0.0.1:1")
	h, err := New(nil, Options{Upstream: u, KeyHeader: "Idempotency-Key", UpstreamTimeout: time.Second,
		RequestReadTimeout: time.Second, MaxBodyBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	redisDown := fmt.Errorf("claim x: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")})
	rows := []struct {
		situation string
		enforce   answer
		outcome   string // "" when observe answers as enforce does
	}{
		{"no key, key required", h.keyAnswer(errNoKey, Policy{Required: true}, "POST"), outcomeWouldReject},
		{"key invalid", h.keyAnswer(errors.New("comma"), Policy{}, "POST"), outcomeWouldReject},
		{"body too large", h.bodyAnswer(&http.MaxBytesError{Limit: 10}, Policy{}), outcomeWouldReject},
		{"body stalled", h.bodyAnswer(errBodyTimeout, Policy{}), ""},
		{"body unreadable (the client broke off)", h.bodyAnswer(errors.New("unexpected EOF"), Policy{}), ""},
		{"different fingerprint", h.claimAnswer(claim.ErrMismatch, nil, Policy{}), outcomeWouldMismatch},
		{"first in flight", h.claimAnswer(claim.ErrInFlight, nil, Policy{}), outcomeWouldConflict},
		{"client left while waiting", h.claimAnswer(context.Canceled, context.Canceled, Policy{}), ""},
		{"first completed", answer{status: 201, outcome: outcomeReplayed}, outcomeWouldReplay},
		{"outcome unknown", h.claimAnswer(&claim.UnknownError{Status: 504}, nil, Policy{}), outcomeWouldReplay},
		{"Redis unreachable", h.claimAnswer(redisDown, nil, Policy{}), outcomeStoreError},
		{"Redis unreachable, fail open", h.claimAnswer(redisDown, nil, Policy{FailOpen: true}), outcomeStoreError},
		{"record unreadable", h.claimAnswer(claim.ErrBadRecord, nil, Policy{}), outcomeStoreError},
	}
	for _, r := range rows {
		got, ok := observeAnswer(r.enforce)
		if (r.outcome == "") == ok || got != r.outcome {
			t.Errorf("%s: observe gives %q (forwarded %v), want %q", r.situation, got, ok, r.outcome)
		}
	}
}

// oomError is an error reply of a Redis that answers but refuses, as
// go-redis returns it (it implements redis.Error).
type oomError struct{}

func (oomError) Error() string { return "OOM command not allowed when used memory > 'maxmemory'." }
func (oomError) RedisError()   {}

// TestPlainErrorBlame: a failed pass-through round trip is told by what
// failed first, whatever error the Transport reports (usually "context
// canceled", whoever canceled). The timings that order these in a real
// forward are microseconds apart (a 1xx written just as the watchdog's
// time runs out), so the states are built here; the HTTP tests
// (passthrough_test.go) drive the others.
func TestPlainErrorBlame(t *testing.T) {
	t.Parallel()
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
