package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFixedAnswer: the answer is a replay's shape (201, the key echoed,
// Idempotent-Replayed), the body is read, and SPIN makes each request take
// at least that long.
func TestFixedAnswer(t *testing.T) {
	for _, spin := range []time.Duration{0, 20 * time.Millisecond} {
		srv := httptest.NewServer(handler(spin))
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Idempotency-Key", "k-1")
		start := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" ||
			resp.Header.Get("Idempotency-Key") != "k-1" || string(body) != string(answerBody) {
			t.Fatalf("spin %v: %d %v %q", spin, resp.StatusCode, resp.Header, body)
		}
		if took < spin {
			t.Fatalf("spin %v: answered in %v", spin, took)
		}
	}
}
