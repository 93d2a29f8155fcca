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

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// The ceiling is only a floor if it does the work it claims: a first request
// is claimed, forwarded once and recorded in Redis (the product's record
// encoding, after the token, fingerprint and Redis time), and its duplicate
// is never forwarded.
func TestCeilingClaimsForwardsOnceAndRecords(t *testing.T) {
	srv := redistest.Start(t)
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(append([]byte(`{"echo":`), append(b, '}')...))
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	c, err := newCeiling(u, srv.Addr(), "scripts")
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(c)
	defer front.Close()

	post := func(key string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/orders", strings.NewReader(`{"a":1}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("k1"); code != http.StatusCreated || body != `{"echo":{"a":1}}` {
		t.Fatalf("first request: %d %q", code, body)
	}
	// The duplicate is replayed from Redis, then from the process's map.
	for i := range 2 {
		if code, body := post("k1"); code != http.StatusCreated || body != `{"echo":{"a":1}}` {
			t.Errorf("duplicate %d: %d %q, want the recorded answer", i, code, body)
		}
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("upstream hits %d, want 1", n)
	}

	// The record: 'c', token (16), fingerprint (32), Redis ms and '\n', then
	// the encoded answer, with the record TTL.
	rdb := srv.Client()
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), "idem:{*}").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %q, %v: want one record", keys, err)
	}
	v, err := rdb.Get(context.Background(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	nl := strings.IndexByte(v[49:], '\n')
	if v[0] != 'c' || nl < 1 {
		t.Fatalf("record %q: want state c and a Redis time", v)
	}
	rec, err := claim.DecodeRecord([]byte(v[49+nl+1:]))
	if err != nil || rec.Status != http.StatusCreated || string(rec.Body) != `{"echo":{"a":1}}` {
		t.Errorf("recorded answer %+v, %v", rec, err)
	}
	if ttl := rdb.PTTL(context.Background(), keys[0]).Val(); ttl < 23*time.Hour {
		t.Errorf("record TTL %v, want the 24h record TTL", ttl)
	}
}

// Without Redis the same work is done but the scripts: every request is
// forwarded (its answer is never replayed: nothing claimed it).
func TestCeilingLocalForwardsEveryRequest(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	c, err := newCeiling(u, "", "scripts")
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(c)
	defer front.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, front.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "same")
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("upstream hits %d, want 2", n)
	}
}

// With -design commands a first request is claimed and recorded by two
// plain SETs, no script: forwarded once, its duplicate replayed from the
// claim's reply, a different body under the same key refused.
func TestCeilingCommandsClaimsWithTwoPlainSets(t *testing.T) {
	f := startFront(t, "commands")
	ctx, rdb, post := f.ctx, f.rdb, f.post
	if code, body, replayed := post("x"); code != http.StatusCreated || body != "answer" || replayed != "" {
		t.Fatalf("first request: %d %q replayed %q", code, body, replayed)
	}
	// Before the duplicate: nothing in the process's map yet, so the
	// replay comes from the claim's reply.
	f.checkDuplicates(t)
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stats, "cmdstat_eval") {
		t.Errorf("a script ran:\n%s", stats)
	}
	// Two SETs for the first request, one (refused) for each duplicate.
	if !strings.Contains(stats, "cmdstat_set:calls=4,") {
		t.Errorf("want 4 SET calls:\n%s", stats)
	}
	keys, err := rdb.Keys(ctx, "idem:{*}").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %q, %v: want one record", keys, err)
	}
	v, err := rdb.Get(ctx, keys[0]).Result()
	if err != nil || len(v) < 49 || v[0] != 'c' {
		t.Fatalf("record %q, %v: want state c", v, err)
	}
	if rec, err := claim.DecodeRecord([]byte(v[49:])); err != nil || rec.Status != http.StatusCreated || string(rec.Body) != "answer" {
		t.Errorf("recorded answer %+v, %v", rec, err)
	}
}

// With -design onewrite each first request runs two scripts of one SET
// each (and the completion's GET), and the completion is fenced by the
// claim's token: one whose claim
// expired, or was taken over, writes nothing and is "lost".
func TestCeilingOneWriteScripts(t *testing.T) {
	f := startFront(t, "onewrite")
	ctx, rdb, post := f.ctx, f.rdb, f.post
	if code, body, replayed := post("x"); code != http.StatusCreated || body != "answer" || replayed != "" {
		t.Fatalf("first request: %d %q replayed %q", code, body, replayed)
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	// go-redis tries EVALSHA first and loads each script with EVAL on
	// NOSCRIPT: one SET per script either way, and the completion's GET.
	if !strings.Contains(stats, "cmdstat_set:calls=2,") || !strings.Contains(stats, "cmdstat_get:calls=1,") || strings.Contains(stats, "cmdstat_time:") {
		t.Errorf("want the first request to run two SETs, one GET and nothing else:\n%s", stats)
	}
	f.checkDuplicates(t)

	// The fence, on the scripts themselves.
	ow := oneWrite{t, ctx, rdb}
	claimAs, completeAs := ow.claim, ow.complete
	tokA, tokB := strings.Repeat("a", 16), strings.Repeat("b", 16)
	if got := claimAs(tokA); got != "claimed" {
		t.Fatalf("claim A: %q", got)
	}
	if got := claimAs(tokB); got != "inflight" {
		t.Errorf("claim B while A holds the key: %q, want inflight", got)
	}
	// A's lock expires (Redis's PX) and B takes the key.
	if err := rdb.Del(ctx, "k").Err(); err != nil {
		t.Fatal(err)
	}
	if got := claimAs(tokB); got != "claimed" {
		t.Fatalf("claim B after A's lock expired: %q", got)
	}
	if got := completeAs(tokA); got != "lost" {
		t.Errorf("A completing over B's claim: %q, want lost", got)
	}
	if v, _ := rdb.Get(ctx, "k").Result(); v != "i"+tokB+oneWriteFP {
		t.Errorf("after A's late completion the key holds %q, want B's claim", v)
	}
	if ttl, _ := rdb.PTTL(ctx, "k").Result(); ttl <= 0 || ttl > time.Duration(lockTTL)*time.Millisecond {
		t.Errorf("B's claim's TTL %v, want at most the lock TTL", ttl)
	}
	if got := completeAs(tokB); got != "ok" {
		t.Errorf("B completing its own claim: %q, want ok", got)
	}
	if ttl, _ := rdb.PTTL(ctx, "k").Result(); ttl <= time.Duration(lockTTL)*time.Millisecond {
		t.Errorf("B's record's TTL %v, want the record TTL", ttl)
	}
	// A completion whose claim expired with nobody taking it over writes
	// nothing.
	if err := rdb.Del(ctx, "k").Err(); err != nil {
		t.Fatal(err)
	}
	if got := completeAs(tokA); got != "lost" {
		t.Errorf("completing an expired claim: %q, want lost", got)
	}
	if n, _ := rdb.Exists(ctx, "k").Result(); n != 0 {
		t.Errorf("an expired claim's completion wrote the key")
	}
}

// front is a ceiling proxy of one design in front of an upstream that
// answers 201 "answer", with Redis's command statistics reset.
type front struct {
	ctx  context.Context
	rdb  *redis.Client
	hits *atomic.Int64 // requests the upstream got
	// post sends body under Idempotency-Key "same" and returns the status,
	// the body and Idempotent-Replayed.
	post func(body string) (int, string, string)
}

func startFront(t *testing.T, design string) *front {
	t.Helper()
	srv := redistest.Start(t)
	f := startFrontAt(t, design, srv.Addr())
	f.rdb = srv.Client()
	t.Cleanup(func() { _ = f.rdb.Close() })
	if err := f.rdb.ConfigResetStat(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return f
}

// startFrontAt is startFront with the Redis at redisAddr (a relay, say),
// and no client of its own (f.rdb is nil).
func startFrontAt(t *testing.T, design, redisAddr string) *front {
	t.Helper()
	f := &front{hits: new(atomic.Int64)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		_, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("answer"))
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	c, err := newCeiling(u, redisAddr, design)
	if err != nil {
		t.Fatal(err)
	}
	fs := httptest.NewServer(c)
	t.Cleanup(fs.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	f.ctx = ctx
	client := &http.Client{Timeout: 15 * time.Second}
	f.post = func(body string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fs.URL, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "same")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed")
	}
	return f
}

// checkDuplicates: after the first request with body "x", its duplicate is
// replayed, a different body under the same key refused, and the upstream
// got the first request alone.
func (f *front) checkDuplicates(t *testing.T) {
	t.Helper()
	if code, body, replayed := f.post("x"); code != http.StatusCreated || body != "answer" || replayed != "true" {
		t.Errorf("duplicate: %d %q replayed %q, want the recorded answer", code, body, replayed)
	}
	if code, _, _ := f.post("y"); code != http.StatusConflict {
		t.Errorf("another body under the same key: %d, want 409", code)
	}
	if got := f.hits.Load(); got != 1 {
		t.Errorf("upstream hits %d, want 1", got)
	}
}

// oneWrite runs -design onewrite's scripts on key "k", with one fingerprint
// (oneWriteFP), and returns their answers.
type oneWrite struct {
	t   *testing.T
	ctx context.Context
	rdb *redis.Client
}

var oneWriteFP = strings.Repeat("f", 32)

func (o oneWrite) claim(tok string) string {
	o.t.Helper()
	v, err := claimOneScript.Run(o.ctx, o.rdb, []string{"k"}, tok, oneWriteFP, lockTTL).Slice()
	if err != nil || len(v) == 0 {
		o.t.Fatalf("claim: %v %v", v, err)
	}
	return v[0].(string)
}

// takeOver: a claims, its lock expires (Redis's PX; DEL stands for it), and
// b claims the key.
func (o oneWrite) takeOver(a, b string) {
	o.t.Helper()
	if got := o.claim(a); got != "claimed" {
		o.t.Fatalf("claim %q: %q", a[:1], got)
	}
	if err := o.rdb.Del(o.ctx, "k").Err(); err != nil {
		o.t.Fatal(err)
	}
	if got := o.claim(b); got != "claimed" {
		o.t.Fatalf("claim %q after the first one's lock expired: %q", b[:1], got)
	}
}

func (o oneWrite) complete(tok string) string {
	o.t.Helper()
	s, err := completeOneScript.Run(o.ctx, o.rdb, []string{"k"}, tok, "c"+tok+oneWriteFP+"record-"+tok, recordTTL).Text()
	if err != nil {
		o.t.Fatalf("complete: %v", err)
	}
	return s
}
