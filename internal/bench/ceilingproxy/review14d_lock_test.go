package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// review14d: a claim whose forward failed (the upstream hung up: 502) must
// not hold its key for the record's 24 h TTL: once its lock deadline has
// passed, the next request takes the key over and is forwarded, as with
// idemproxy's claim.lua. (The ceiling used to write the deadline and never
// read it.)
func TestReview14dExpiredLockIsTakenOver(t *testing.T) {
	srv := redistest.Start(t)
	var hits, fail atomic.Int64
	fail.Store(1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.ReadAll(r.Body)
		if fail.Load() == 1 {
			// the upstream dies mid-request: no answer at all
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	c, err := newCeiling(u, srv.Addr(), "scripts")
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(c)
	defer front.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	post := func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/orders", strings.NewReader(`{"a":1}`))
		req.Header.Set("Idempotency-Key", "k-lock")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(); code != http.StatusBadGateway {
		t.Fatalf("first request, upstream hung up: status %d, want 502", code)
	}
	rdb := srv.Client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, "idem:{*}").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %q, %v: want the one in-flight record", keys, err)
	}
	pttl := rdb.PTTL(ctx, keys[0]).Val()
	// The lock's deadline passes (as it would after LOCK_TTL, 60 s): rewrite
	// it to 1 ms after the epoch, keeping state, token, fingerprint and TTL.
	if err := rdb.Eval(ctx, `local v = redis.call('GET', KEYS[1])
return redis.call('SET', KEYS[1], string.sub(v, 1, 49) .. '1\n', 'KEEPTTL')`, keys).Err(); err != nil {
		t.Fatal(err)
	}
	fail.Store(0)
	before := hits.Load()
	code := post()
	if code == http.StatusConflict || hits.Load() == before {
		t.Errorf("retry after the lock deadline passed: status %d, upstream hits %d -> %d; want it taken over and forwarded. "+
			"The failed claim holds its key for its whole TTL (%v left), not for the %d ms lock", code, before, hits.Load(), pttl.Round(time.Minute), lockTTL)
	}
}
