package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview70FullRedisRefusesLargeStringCompletion: under maxmemory with
// noeviction (what the README asks for), a Redis already over its limit
// refuses a script's first write when that command may grow memory
// (deny-oom: SET, HSET, SETRANGE, APPEND), and lets every write after the
// script's first one through ("we can't stop in the middle"); DEL is a
// write but not deny-oom. d4f17d9 wrote a string record over 64 KiB DEL
// first, then SETRANGE: a full Redis took it past maxmemory by its size (up
// to 64 MiB), where it refuses a hash completion or a smaller string one.
// Now the large record's first write is its SETRANGE to the scratch key: it
// is refused too, and the claim stays in flight.
func TestReview70FullRedisRefusesLargeStringCompletion(t *testing.T) {
	srv := redistest.Start(t, "maxmemory-policy noeviction")
	rdb := srv.Client()
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	for _, tc := range []struct {
		f    form
		size int
		lost bool
	}{
		{forms[0], 100 << 10, false}, // control: refused (HSET first)
		{forms[1], 1 << 10, false},   // control: refused (SET first)
		{forms[1], 100 << 10, false}, // the fast path
		{forms[1], 1 << 20, true},    // the record lost meanwhile ("recreated")
	} {
		f, size, lost := tc.f, tc.size, tc.lost
		name := fmt.Sprintf("%s/%dKiB/lost=%v", f.name, size>>10, lost)
		t.Run(name, func(t *testing.T) {
			if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			s := claim.NewStore(rdb, "oom70:", nil, claim.StringRecords(f.str))
			k := claim.NewKey(nil, name)
			lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
			if err != nil || lease == nil {
				t.Fatalf("claim: %v, %v", lease, err)
			}
			key := claim.RecordKey("oom70:", k)
			if lost {
				rdb.Del(ctx, key)
			}
			before := infoMemory(t, rdb, "used_memory")
			// Redis is full: used_memory is over maxmemory.
			if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("z"), size)}
			cerr := lease.CompleteOnce(ctx, rec, time.Hour) // one attempt: the retries repeat it
			after := infoMemory(t, rdb, "used_memory")
			if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if cerr != nil && rdb.Exists(ctx, key).Val() == 0 && !lost {
				t.Errorf("the refused completion (%v) left no key: the in-flight claim was deleted", cerr)
			}
			if cerr == nil {
				t.Errorf("a Redis over maxmemory (noeviction) took the %d-byte answer: used_memory %d -> %d (maxmemory 1); "+
					"a hash completion, a string one of 64 KiB or less, and this one before d4f17d9 are refused (OOM)",
					size, before, after)
			}
		})
	}
}
