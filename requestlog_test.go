package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/hlog"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// Every answer carries a new X-Request-Id, and the request's log lines carry
// the same id as request_id.
func TestRequestLogIDInHeaderAndLog(t *testing.T) {
	var logs testutil.SyncBuffer
	logger := zerolog.New(&logs)
	h := withRequestLog(logger, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hlog.FromRequest(r).Info().Str("path", r.URL.Path).Msg("request")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	var ids []string
	for _, path := range []string{"/a", "/b"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if len(id) != 20 {
			t.Fatalf("%s: X-Request-Id %q, want a 20-character xid", path, id)
		}
		ids = append(ids, id)
	}
	if ids[0] == ids[1] {
		t.Errorf("two requests, one id %q", ids[0])
	}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	var n int
	for sc.Scan() {
		var line struct {
			Path      string `json:"path"`
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		if want := map[string]string{"/a": ids[0], "/b": ids[1]}[line.Path]; line.RequestID != want {
			t.Errorf("%s: request_id %q, want the answer's X-Request-Id %q", line.Path, line.RequestID, want)
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d log lines, want 2", n)
	}
}

// The middleware runs on every request: at most six allocations (the id,
// the logger's context and its place in the request context, the request
// copy, the header value); hlog.NewHandler with hlog.RequestIDHandler took
// ten.
func TestRequestLogAllocations(t *testing.T) {
	h := withRequestLog(zerolog.New(nil).Level(zerolog.WarnLevel), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	w := httptest.NewRecorder()
	if n := testing.AllocsPerRun(200, func() {
		clear(w.HeaderMap)
		h.ServeHTTP(w, r)
	}); n > 6 {
		t.Errorf("%.0f allocations per request, want at most 6", n)
	}
}
