package main

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// With -design onehash a first request runs onewrite's design on a hash:
// HSETNX, PEXPIRE to claim, HGET, HSET, PEXPIRE to complete, and no clock;
// the completion is fenced by the claim's token as onewrite's is.
func TestCeilingOneHashScripts(t *testing.T) {
	f := startFront(t, "onehash")
	ctx, rdb, post := f.ctx, f.rdb, f.post
	if code, body, replayed := post("x"); code != http.StatusCreated || body != "answer" || replayed != "" {
		t.Fatalf("first request: %d %q replayed %q", code, body, replayed)
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cmdstat_hsetnx:calls=1,", "cmdstat_hget:calls=1,", "cmdstat_hset:calls=1,", "cmdstat_pexpire:calls=2,"} {
		if !strings.Contains(stats, want) {
			t.Errorf("want %s in the first request's commands:\n%s", want, stats)
		}
	}
	for _, not := range []string{"cmdstat_time:", "cmdstat_set:", "cmdstat_get:", "cmdstat_hmget:"} {
		if strings.Contains(stats, not) {
			t.Errorf("the first request ran %s:\n%s", not, stats)
		}
	}
	f.checkDuplicates(t)

	claimAs := func(tok string) string {
		t.Helper()
		v, err := claimHashScript.Run(ctx, rdb, []string{"k"}, tok, oneWriteFP, lockTTL).Slice()
		if err != nil || len(v) == 0 {
			t.Fatalf("claim: %v %v", v, err)
		}
		return v[0].(string)
	}
	completeAs := func(tok string) string {
		t.Helper()
		s, err := completeHashScript.Run(ctx, rdb, []string{"k"}, tok, "record-"+tok, recordTTL).Text()
		if err != nil {
			t.Fatalf("complete: %v", err)
		}
		return s
	}
	tokA, tokB := strings.Repeat("a", 16), strings.Repeat("b", 16)
	if got := claimAs(tokA); got != "claimed" {
		t.Fatalf("claim A: %q", got)
	}
	if ttl, _ := rdb.PTTL(ctx, "k").Result(); ttl <= 0 || ttl > time.Duration(lockTTL)*time.Millisecond {
		t.Errorf("A's claim's TTL %v, want at most the lock TTL", ttl)
	}
	if got := claimAs(tokA); got != "claimed" {
		t.Errorf("A's claim resent: %q, want claimed", got)
	}
	if got := claimAs(tokB); got != "inflight" {
		t.Errorf("claim B while A holds the key: %q, want inflight", got)
	}
	// A's lock expires (Redis's PEXPIRE; DEL stands for it) and B takes the key.
	if err := rdb.Del(ctx, "k").Err(); err != nil {
		t.Fatal(err)
	}
	if got := claimAs(tokB); got != "claimed" {
		t.Fatalf("claim B after A's lock expired: %q", got)
	}
	if got := completeAs(tokA); got != "lost" {
		t.Errorf("A completing over B's claim: %q, want lost", got)
	}
	if rec, _ := rdb.HGet(ctx, "k", "rec").Result(); rec != "" {
		t.Errorf("A's late completion wrote %q over B's claim", rec)
	}
	if got := completeAs(tokB); got != "ok" {
		t.Errorf("B completing its own claim: %q, want ok", got)
	}
	if ttl, _ := rdb.PTTL(ctx, "k").Result(); ttl <= time.Duration(lockTTL)*time.Millisecond {
		t.Errorf("B's record's TTL %v, want the record TTL", ttl)
	}
	if v, err := claimHashScript.Run(ctx, rdb, []string{"k"}, tokA, oneWriteFP, lockTTL).Slice(); err != nil || len(v) != 2 || v[0] != "replay" || v[1] != "record-"+tokB {
		t.Errorf("a duplicate of B's request: %v %v, want B's record replayed", v, err)
	}
	if got := claimAs(strings.Repeat("c", 16)); got != "replay" {
		t.Errorf("another claim of the completed key: %q, want replay", got)
	}
	if v, _ := claimHashScript.Run(ctx, rdb, []string{"k"}, tokA, strings.Repeat("g", 32), lockTTL).Slice(); len(v) == 0 || v[0] != "mismatch" {
		t.Errorf("another fingerprint: %v, want mismatch", v)
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
