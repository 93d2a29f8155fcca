package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Review of -design onewrite's fence (commit 19eeb83). Its completion then
// overwrote the key first (SET XX GET PX recordTTL) and, when the previous
// value was another claim's, put it back with PX lockTTL, whatever TTL it
// had: a stale completion cut the completed record of the proxy that took
// over from 24 h to the lock TTL (a retry a minute later executed again),
// or re-armed its in-flight lock. The completion now reads first and
// writes nothing over a value that is not its claim's.

func onewriteKey(key string) string {
	kh := sha256.Sum256([]byte(key))
	return "idem:{" + hex.EncodeToString(kh[:]) + "}"
}

// redisFor starts a redis-server for t and returns it with a client and a
// context of d, both ended with the test.
func redisFor(t *testing.T, d time.Duration) (*redistest.Server, *redis.Client, context.Context) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return srv, rdb, ctx
}

// The scripts alone: A claims, A's lock expires (Redis's PX; DEL stands for
// it), B claims and completes, then A's late completion arrives. It must be
// "lost" and leave B's record exactly as it was: value and TTL.
func TestReviewOWStaleCompletionKeepsTakeoverRecordTTL(t *testing.T) {
	_, rdb, ctx := redisFor(t, 10*time.Second)

	ow := oneWrite{t, ctx, rdb}
	completeAs := ow.complete
	tokA, tokB := strings.Repeat("a", 16), strings.Repeat("b", 16)
	ow.takeOver(tokA, tokB)
	if got := completeAs(tokB); got != "ok" {
		t.Fatalf("complete B: %q", got)
	}
	before, _ := rdb.PTTL(ctx, "k").Result()
	recB, _ := rdb.Get(ctx, "k").Result()

	if got := completeAs(tokA); got != "lost" {
		t.Errorf("A's late completion over B's record: %q, want lost", got)
	}
	if v, _ := rdb.Get(ctx, "k").Result(); v != recB {
		t.Errorf("B's record changed: %q, want %q", v, recB)
	}
	after, _ := rdb.PTTL(ctx, "k").Result()
	if after < before-time.Second {
		t.Errorf("A's late completion cut B's record's TTL from %v to %v (the lock TTL is %v): "+
			"B's record will vanish within a minute and a retry executes again within the key's TTL",
			before, after, time.Duration(lockTTL)*time.Millisecond)
	}
}

// The same through the proxy: A's request is held at the upstream while its
// lock expires, B's request with the same key and body is forwarded and
// recorded, then A's upstream answers. B's record must keep its record TTL.
func TestReviewOWStaleCompletionOverRecordEndToEnd(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	defer rdb.Close()
	var hits atomic.Int64
	arrivedA := make(chan struct{})
	releaseA := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if hits.Add(1) == 1 {
			close(arrivedA)
			select {
			case <-releaseA:
			case <-time.After(15 * time.Second):
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "answer A")
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "answer B")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	c, err := newCeiling(u, srv.Addr(), "onewrite")
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(c)
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := &http.Client{Timeout: 18 * time.Second}
	post := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/orders", strings.NewReader(`{"a":1}`))
		req.Header.Set("Idempotency-Key", "ow-stale")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	doneA := make(chan int, 1)
	go func() {
		code, _ := post()
		doneA <- code
	}()
	select {
	case <-arrivedA:
	case <-ctx.Done():
		t.Fatal("A never reached the upstream")
	}
	rk := onewriteKey("ow-stale")
	// A's lock expires on Redis's clock (as after LOCK_TTL).
	if err := rdb.PExpire(ctx, rk, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := rdb.Exists(ctx, rk).Result(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's claim did not expire")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, body := post(); code != http.StatusCreated || body != "answer B" {
		t.Fatalf("B after A's lock expired: %d %q, want 201 from the upstream", code, body)
	}
	before, _ := rdb.PTTL(ctx, rk).Result()
	if before <= time.Duration(lockTTL)*time.Millisecond {
		t.Fatalf("B's record TTL %v, want the record TTL", before)
	}
	close(releaseA)
	select {
	case <-doneA:
	case <-ctx.Done():
		t.Fatal("A never finished")
	}
	after, _ := rdb.PTTL(ctx, rk).Result()
	if after < before-time.Second {
		t.Errorf("after A's late completion B's record expires in %v (was %v): a retry after %v executes a third time",
			after, before, after.Round(time.Second))
	}
	if got := hits.Load(); got != 2 {
		t.Errorf("upstream hits %d, want 2 (A, then B after takeover)", got)
	}
}

// A late completion over the in-flight claim of the proxy that took over must
// not move that claim's lock expiry: Redis's PX from B's claim decides when B's
// key may be taken over, not the time A's completion arrived.
func TestReviewOWStaleCompletionDoesNotReArmTakeoverLock(t *testing.T) {
	_, rdb, ctx := redisFor(t, 10*time.Second)
	ow := oneWrite{t, ctx, rdb}
	tokA, tokB := strings.Repeat("a", 16), strings.Repeat("b", 16)
	ow.takeOver(tokA, tokB)
	// B's claim has aged 58 s of its 60 s lock (Redis's clock).
	if err := rdb.PExpire(ctx, "k", 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if got := ow.complete(tokA); got != "lost" {
		t.Fatalf("A's late completion: %q, want lost", got)
	}
	if ttl, _ := rdb.PTTL(ctx, "k").Result(); ttl > 2*time.Second {
		t.Errorf("A's late completion re-armed B's lock: it expires in %v, was at most 2s", ttl)
	}
}

// go-redis resends a completion whose reply was lost (MaxRetries: 1). The
// resend finds the request's own record and answers "ok" (it rewrites the
// same value and refreshes its TTL): safe.
func TestReviewOWResentCompletionIsOwnRecord(t *testing.T) {
	srv, rdb, ctx := redisFor(t, 20*time.Second)
	if err := completeOneScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	relay := newDropOnce(t, srv.Addr(), []byte(completeOneScript.Hash()))
	f := startFrontAt(t, "onewrite", relay.ln.Addr().String())
	code, body, _ := f.post(`{"a":1}`)
	if relay.dropped.Load() != 1 {
		t.Fatalf("the completion's reply was not dropped (dropped %d)", relay.dropped.Load())
	}
	if code != http.StatusCreated {
		t.Fatalf("first request whose completion reply was lost: %d %q, want 201", code, body)
	}
	rk := onewriteKey("same")
	v, err := rdb.Get(ctx, rk).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "c") {
		t.Errorf("key holds %q, want a completed record", v)
	}
	if ttl, _ := rdb.PTTL(ctx, rk).Result(); ttl <= time.Duration(lockTTL)*time.Millisecond {
		t.Errorf("record TTL %v, want the record TTL", ttl)
	}
	if code, _, replayed := f.post(`{"a":1}`); code != http.StatusCreated || replayed != "true" {
		t.Errorf("duplicate: %d replayed %q, want a replay", code, replayed)
	}
	if got := f.hits.Load(); got != 1 {
		t.Errorf("upstream hits %d, want 1", got)
	}
}
