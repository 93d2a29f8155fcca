package main

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// HSETNX answers for the field, not the key: a hash already at the key
// without onehash's field (a record of another layout, idemproxy's own, say)
// must not be claimed afresh. The claim refuses it and leaves its TTL as it
// was, and the request is not forwarded. (Review 76.)
func TestCeilingOneHashRefusesAForeignHash(t *testing.T) {
	for name, layout := range map[string]func(fp string, rec []byte) []any{
		"tok-fp-rec": func(fp string, rec []byte) []any { return []any{"tok", strings.Repeat("a", 16), "fp", fp, "rec", rec} },
		"idemproxy-hash": func(fp string, rec []byte) []any {
			return []any{"st", "c", "tok", strings.Repeat("a", 16), "fp", fp, "rec", rec}
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := startFront(t, "onehash")
			fp := sha256.Sum256([]byte("x"))
			rec := (&claim.Record{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("answer")}).Encode()
			for _, key := range []string{onewriteKey("same"), "copy"} {
				if err := f.rdb.HSet(f.ctx, key, layout(string(fp[:]), rec)...).Err(); err != nil {
					t.Fatal(err)
				}
				if err := f.rdb.PExpire(f.ctx, key, 24*time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}
			v, err := claimHashScript.Run(f.ctx, f.rdb, []string{"copy"}, strings.Repeat("b", 16), fp[:], lockTTL).Slice()
			if err == nil {
				t.Errorf("claim of a key holding another layout's hash: %v, want an error", v)
			}
			if ttl, _ := f.rdb.PTTL(f.ctx, "copy").Result(); ttl < 23*time.Hour {
				t.Errorf("the claim cut the hash's TTL from 24h to %v", ttl)
			}
			if n, _ := f.rdb.HExists(f.ctx, "copy", "c").Result(); n {
				t.Errorf("the refused claim left its field in the hash")
			}
			if code, _, _ := f.post("x"); code != http.StatusServiceUnavailable || f.hits.Load() != 0 {
				t.Errorf("a request over another layout's hash: %d, upstream hits %d; want 503 and none", code, f.hits.Load())
			}
		})
	}
}

// A claim resent after its own completion answers the replay, as
// onewrite's does, not "claimed". (Review 76.)
func TestCeilingOneHashResentClaimAfterCompletionReplays(t *testing.T) {
	_, rdb, ctx := redisFor(t, 10*time.Second)
	tok := strings.Repeat("a", 16)
	if v, err := claimHashScript.Run(ctx, rdb, []string{"k"}, tok, oneWriteFP, lockTTL).Slice(); err != nil || v[0] != "claimed" {
		t.Fatalf("claim: %v %v", v, err)
	}
	if s, err := completeHashScript.Run(ctx, rdb, []string{"k"}, tok, "record", recordTTL).Text(); err != nil || s != "ok" {
		t.Fatalf("complete: %v %v", s, err)
	}
	v, err := claimHashScript.Run(ctx, rdb, []string{"k"}, tok, oneWriteFP, lockTTL).Slice()
	if err != nil || len(v) != 2 || v[0] != "replay" || v[1] != "record" {
		t.Errorf("the claim resent after its completion: %v %v, want the replay", v, err)
	}
}
