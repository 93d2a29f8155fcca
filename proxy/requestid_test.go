package proxy_test

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestRequestIDOnEveryAnswerAndLogLine: every answer, whichever path wrote
// it, carries one new X-Request-Id (the proxy's, over an upstream's), and
// every log line of that request carries the same id as request_id: the
// access-log line and the warnings of a failed forward alike.
func TestRequestIDOnEveryAnswerAndLogLine(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "upstream-id") // as Rails' ActionDispatch::RequestId
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	})
	// A second replica whose upstream refuses connections: its failures are
	// logged on the pass-through path (plainError) and on the keyed one.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	opts := e.opts
	opts.Upstream, _ = url.Parse(closed)
	opts.Default.Hold = false
	_, down, _ := e.newProxy(opts)

	steps := []struct {
		name string
		srv  string
		r    req
		want int
		line string // a log line of this request besides the access log
	}{
		{name: "executed", r: req{key: "rid-1", body: "b"}, want: http.StatusCreated},
		{name: "replayed", r: req{key: "rid-1", body: "b"}, want: http.StatusCreated},
		{name: "pass-through", r: req{method: http.MethodGet}, want: http.StatusCreated},
		{name: "problem", r: req{key: strings.Repeat("k", 300), body: "b"}, want: http.StatusBadRequest},
		{name: "pass-through failed", srv: "down", r: req{method: http.MethodGet}, want: http.StatusBadGateway, line: "upstream request failed"},
		{name: "keyed failed", srv: "down", r: req{key: "rid-2", body: "b"}, want: http.StatusBadGateway},
	}
	ids := map[string]string{} // request id -> step
	for _, s := range steps {
		srv := e.srv
		if s.srv == "down" {
			srv = down
		}
		r := e.doTo(srv, s.r)
		if r.StatusCode != s.want {
			t.Fatalf("%s: status %d, want %d: %s", s.name, r.StatusCode, s.want, r.body)
		}
		got := r.Header.Values(proxy.RequestIDHeader)
		if len(got) != 1 || len(got[0]) != 20 {
			t.Fatalf("%s: X-Request-Id %q, want one 20-character xid", s.name, got)
		}
		if prev, dup := ids[got[0]]; dup {
			t.Fatalf("%s: request id %q already given to %s", s.name, got[0], prev)
		}
		ids[got[0]] = s.name
	}

	accessLines := map[string]int{} // step -> access-log lines
	otherLines := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(e.logs.String()))
	for sc.Scan() {
		var line struct {
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		if line.RequestID == "" {
			if line.Message == "request" || line.Message == "upstream request failed" {
				t.Errorf("a request's log line without request_id: %s", sc.Bytes())
			}
			continue
		}
		step, ok := ids[line.RequestID]
		if !ok {
			t.Errorf("log line with a request_id that no answer carried: %s", sc.Bytes())
			continue
		}
		if line.Message == "request" {
			accessLines[step]++
		} else {
			otherLines[step] = append(otherLines[step], line.Message)
		}
	}
	for _, s := range steps {
		if accessLines[s.name] != 1 {
			t.Errorf("%s: %d access-log lines with its request_id, want 1", s.name, accessLines[s.name])
		}
		if s.line != "" && !slices.Contains(otherLines[s.name], s.line) {
			t.Errorf("%s: no %q line with its request_id (lines: %q)", s.name, s.line, otherLines[s.name])
		}
	}
	if len(otherLines["keyed failed"]) == 0 {
		t.Errorf("keyed failed: no warning with its request_id besides the access log")
	}
}

// TestRequestAboveInfoLevel: with LOG_LEVEL=warn the access-log line is not
// written (finish returns before building it), but the request is still
// counted, its answer still carries its id, and its warnings still carry
// that id as request_id.
func TestRequestAboveInfoLevel(t *testing.T) {
	e := newEnv(t, miniBackend, nil)
	logs := &testutil.SyncBuffer{}
	reg := prometheus.NewRegistry()
	opts := e.opts
	opts.Logger = zerolog.New(logs).Level(zerolog.WarnLevel)
	opts.Metrics = proxy.NewMetrics(reg)
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", opts.Metrics.ObserveScript), opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	for range 2 {
		if r := e.doTo(srv, req{key: "warn-1", body: "b"}); r.StatusCode != http.StatusCreated || len(r.Header.Values(proxy.RequestIDHeader)) != 1 {
			t.Fatalf("status %d, X-Request-Id %q", r.StatusCode, r.Header.Values(proxy.RequestIDHeader))
		}
	}
	if got := counter(t, reg, "idemproxy_requests_total", map[string]string{"outcome": "replayed"}); got != 1 {
		t.Errorf("replayed requests counted %v, want 1", got)
	}
	if got := counter(t, reg, "idemproxy_responses_total", map[string]string{"code": "201"}); got != 2 {
		t.Errorf("201 responses counted %v, want 2", got)
	}
	if strings.Contains(logs.String(), `"message":"request"`) {
		t.Errorf("an access-log line at LOG_LEVEL=warn:\n%s", logs)
	}

	e.setUpstream(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
	r := e.doTo(srv, req{method: http.MethodGet})
	if r.StatusCode != http.StatusBadGateway {
		t.Fatalf("failed pass-through: status %d, want 502", r.StatusCode)
	}
	id := r.Header.Get(proxy.RequestIDHeader)
	if !strings.Contains(logs.String(), `"request_id":"`+id+`"`) || !strings.Contains(logs.String(), "upstream request failed") {
		t.Errorf("the failed pass-through's warning does not carry its request_id %q:\n%s", id, logs)
	}
}
