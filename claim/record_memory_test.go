package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
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
		for _, size := range []int{100 << 10, 1536 << 10, 9 << 20} {
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

// TestLargeRecordOverBulkLenKeepsTheClaim: proto-max-bulk-len bounds what
// SETRANGE makes of a string, so an encoding Redis took as an argument can
// be refused as a record once its head is added. Redis keeps a script's
// earlier writes: the first write of a large record must be the one refused,
// so that the claim stays as it was (in flight, with its TTL), and the
// client's retry is refused, not executed again. A hash replica's claim,
// completed by a string replica, is overwritten by one SET, which Redis
// does not bound: the record is taken, and replayed.
func TestLargeRecordOverBulkLenKeepsTheClaim(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := claim.NewStore(rdb, "back:", nil, claim.StringRecords(true))
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	// An encoding 40 bytes under 1 MiB: an argument a 1mb proto-max-bulk-len
	// takes, a record it refuses.
	rec := &claim.Record{Status: 201}
	for n := 1<<20 - 60; len(rec.Encode()) < 1<<20-40; n++ {
		rec.Body = bytes.Repeat([]byte("p"), n)
	}
	for _, form := range []string{"string", "hash"} {
		k := claim.NewKey(nil, "back "+form)
		key := recordKey("back:", k)
		lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: %v, %v", form, lease, err)
		}
		if form == "hash" {
			asHashClaim(t, rdb, key, 30*time.Minute)
		}
		before, ttl := rdb.Dump(ctx, key).Val(), rdb.PTTL(ctx, key).Val()
		if err := rdb.ConfigSet(ctx, "proto-max-bulk-len", "1mb").Err(); err != nil {
			t.Fatal(err)
		}
		cerr := lease.CompleteOnce(ctx, rec, time.Hour)
		if err := rdb.ConfigSet(ctx, "proto-max-bulk-len", "512mb").Err(); err != nil {
			t.Fatal(err)
		}
		if form == "string" {
			if cerr == nil {
				t.Fatalf("%s: a record over proto-max-bulk-len was taken", form)
			}
			if rdb.Dump(ctx, key).Val() != before {
				t.Errorf("%s: after the refused completion (%v) the key is not the claim it was", form, cerr)
			}
			if left := rdb.PTTL(ctx, key).Val(); left > ttl || left < ttl-5*time.Second {
				t.Errorf("%s: the claim expires in %v; want its %v", form, left, ttl)
			}
		}
		l2, got, err := s.Acquire(ctx, k, fp("A"), terms)
		switch {
		case l2 != nil:
			t.Errorf("%s: the client's retry got a new lease after the completion (%v): the request executes again", form, cerr)
		case cerr == nil && (got == nil || !bytes.Equal(got.Body, rec.Body)):
			t.Errorf("%s: the completion was taken, and the retry got %v, %v; want its replay", form, got != nil, err)
		case cerr != nil && (got != nil || err == nil):
			t.Errorf("%s: the completion was refused (%v), and the retry got %v, %v; want it in flight", form, cerr, got != nil, err)
		}
	}
}

// asHashClaim rewrites the string record at key as a hash replica writes
// the same record, expiring in ttl.
func asHashClaim(t *testing.T, rdb *redis.Client, key string, ttl time.Duration) {
	t.Helper()
	v, err := rdb.Get(ctx, key).Bytes()
	if err != nil || len(v) < 10 {
		t.Fatalf("%s: no string record (%v)", key, err)
	}
	args, p := []any{}, 10
	for i, f := range []string{"st", "tok", "fp", "up", "at", "ld", "ct", "tr"} {
		n := int(v[2+i])
		if n > 0 {
			args = append(args, f, string(v[p:p+n]))
		}
		p += n
	}
	rdb.Del(ctx, key)
	rdb.HSet(ctx, key, args...)
	rdb.PExpire(ctx, key, ttl)
}
