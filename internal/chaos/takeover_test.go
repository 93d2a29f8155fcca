package chaos

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// A proxy dies while its upstream call runs: the upstream executes the key
// (201). After LOCK_TTL a retry takes the abandoned claim over, and the
// upstream answers it 503: with ON_5XX=release the claim is released, and
// the access log says outcome=released, not takeover. The next retry
// claims the key afresh and the upstream executes it again (201). Two
// executions with recorded-class answers, and no line names the key_hash
// as taken over, lost or unrecorded: only the takeover-age histogram,
// which carries no key, counted it. The chaos matrix finds this in its
// proxy-kill and upstream-* rows (silent duplicates).
//
// The chaos matrix found this: the takeover is now logged with its
// key_hash whatever the request's final outcome.
func TestTakeoverReleasedIsAnnounced(t *testing.T) {
	bin := binary(t)
	srv := redistest.Start(t, "maxmemory-policy noeviction")
	start := time.Now()

	var (
		mu    sync.Mutex
		execs []Execution
	)
	entered := make(chan struct{}, 1)
	answers := []int{201, 503, 201}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		n := len(execs)
		status := answers[min(n, len(answers)-1)]
		id := "x" + itoa6(n+1)
		b := `{"key":"` + r.Header.Get("Idempotency-Key") + `","exec":"` + id + `"}` + "\n"
		execs = append(execs, Execution{ID: id, Key: r.Header.Get("Idempotency-Key"), Auth: r.Header.Get("Authorization"), Proxy: -1, Start: time.Since(start), Status: status, Body: b})
		mu.Unlock()
		if n == 0 {
			entered <- struct{}{}
			time.Sleep(300 * time.Millisecond) // executing when its proxy dies
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, b)
	}))
	defer up.Close()

	fleet := NewFleet(start, bin, 2, func(int) []string {
		return []string{"UPSTREAM_URL=" + up.URL, "REDIS_URL=" + srv.URL(), "LOCK_TTL=2s", "UPSTREAM_TIMEOUT=1s",
			"SHUTDOWN_TIMEOUT=30s", "LOG_LEVEL=info", "LOG_FORMAT=json"}
	})
	for slot := range 2 {
		if err := fleet.Start(slot); err != nil {
			t.Fatal(err)
		}
		defer fleet.Term(slot, 5*time.Second)
	}
	const key, auth = "defect-takeover-released", "Bearer a"
	post := func(slot int) int {
		req, _ := http.NewRequest(http.MethodPost, fleet.URLs()[slot]+"/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", auth)
		res, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
		if err != nil {
			return 0
		}
		defer res.Body.Close()
		_, _ = io.ReadAll(res.Body)
		return res.StatusCode
	}
	go post(0)
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first request never reached the upstream")
	}
	fleet.Kill(0) // mid-call: the upstream still executes and answers 201
	time.Sleep(2500 * time.Millisecond)
	if got := post(1); got != 503 { // takeover, answered 503: released
		t.Fatalf("takeover answered %d, want the upstream's 503", got)
	}
	if got := post(1); got != 201 { // a fresh claim: executes again
		t.Fatalf("retry answered %d, want 201", got)
	}
	fleet.Term(1, 5*time.Second)

	h := &History{Row: "defect", OnUnknown: "expire",
		Keys: []KeyInfo{{Key: key, Auth: auth, Hash: claim.NewKey([]string{auth}, key).String()}}}
	mu.Lock()
	h.Execs = append(h.Execs, execs...)
	mu.Unlock()
	h.Logs, h.Incs = fleet.Snapshot()
	r := Check(h)
	if r.Effective != 2 {
		t.Fatalf("%d executions answered below 500, want 2 (the setup did not work): %v", r.Effective, h.Execs)
	}
	if r.Silent > 0 {
		var lines []string
		for _, l := range h.Logs {
			if l.KeyHash == h.Keys[0].Hash {
				lines = append(lines, l.Level+" "+l.Outcome+" "+l.Message)
			}
		}
		t.Errorf("the key executed twice (201, then 201 after a takeover answered 503) and nothing named its key_hash "+
			"as taken over, lost or unrecorded:\n%v\nits log lines:\n  %s", r.Findings, strings.Join(lines, "\n  "))
	}
}
