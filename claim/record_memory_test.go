package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestLargeRecordTakesItsSize: a recorded answer takes about its size in
// Redis for as long as its TTL, in either form. A string record above
// 64 KiB was written as SET of its head, then APPEND of the answer, and
// Redis grows a string it appends to greedily: up to twice its length (1 MiB
// more above 1 MiB), never given back. A 100 KiB answer took 229 KB of
// Redis memory, a 1.5 MiB one 2.5 MiB: under maxmemory with noeviction,
// Redis refuses writes that much sooner. Both ways a string record is
// written from its answer are checked: the completion of an in-flight
// claim, and the rewrite of a record lost meanwhile ("recreated").
// jemalloc's size classes round up by at most a quarter.
func TestLargeRecordTakesItsSize(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, f := range forms {
		for _, size := range []int{100 << 10, 1536 << 10} {
			for _, lost := range []bool{false, true} {
				name := fmt.Sprintf("%s/%dKiB/lost=%v", f.name, size>>10, lost)
				s := claim.NewStore(rdb, "mem:", nil, claim.StringRecords(f.str))
				k := claim.NewKey(nil, name)
				lease, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if err != nil || lease == nil {
					t.Fatalf("%s: claim: %v, %v", name, lease, err)
				}
				key := recordKey("mem:", k)
				if lost {
					rdb.Del(ctx, key)
				}
				rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("0123456789abcdef"), size/16)}
				if err := lease.Complete(ctx, rec, time.Hour); err != nil {
					t.Fatalf("%s: complete: %v", name, err)
				}
				used, err := rdb.MemoryUsage(ctx, key, 0).Result()
				if err != nil {
					t.Fatal(err)
				}
				if limit := int64(size) * 5 / 4; used > limit {
					t.Errorf("%s: the record takes %d bytes of Redis memory for a %d-byte answer (more than %d)", name, used, size, limit)
				}
				if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
					t.Errorf("%s: the record expires in %v, want the completion's TTL of 1h", name, ttl)
				}
				_, got, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if err != nil || got == nil || got.Status != 201 || !bytes.Equal(got.Body, rec.Body) {
					t.Errorf("%s: replay: %v, %v; want the recorded answer", name, got != nil, err)
				}
			}
		}
	}
}

// TestLargeRecordIgnoresLeftoverScratch: a large string record is built in a
// scratch key that no script leaves behind. Were one there (a bug, or a
// hand-made key), SETRANGE would write over its bytes and keep its tail:
// the record must come out exact all the same.
func TestLargeRecordIgnoresLeftoverScratch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := claim.NewStore(rdb, "scr:", nil, claim.StringRecords(true))
	k := claim.NewKey(nil, "leftover")
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
	if err != nil || lease == nil {
		t.Fatalf("claim: %v, %v", lease, err)
	}
	scratch := recordKey("scr:", k) + ":w"
	rdb.Set(ctx, scratch, bytes.Repeat([]byte("!"), 300<<10), 0)
	rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16)}
	if err := lease.Complete(ctx, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, got, err := s.Acquire(ctx, k, fp("A"), terms); err != nil || got == nil || !bytes.Equal(got.Body, rec.Body) {
		t.Errorf("replay after a leftover scratch key: %v, %v; want the recorded answer", got != nil, err)
	}
	if n := rdb.Exists(ctx, scratch).Val(); n != 0 {
		t.Errorf("the scratch key is left behind")
	}
}
