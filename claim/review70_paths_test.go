package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview70LargeRecordEveryPath (passes: evidence, not a finding): every
// completion path of complete.lua that writes a string record, with answers
// at and around the 64 KiB switch and above 1 MiB, with and without a
// trace, on a real redis-server: the replay is the answer byte for byte,
// the record has the completion's TTL, and takes about its size.
func TestReview70LargeRecordEveryPath(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	strS := claim.NewStore(rdb, "p70:", nil, claim.StringRecords(true))
	short := claim.Terms{LockTTL: 50 * time.Millisecond, TTL: time.Hour}
	hold := claim.Terms{LockTTL: 50 * time.Millisecond, TTL: time.Hour, Hold: true}
	long := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	for _, path := range []string{"fast", "recreated", "hash rewritten", "late", "held unknown"} {
		for _, size := range []int{65536 - 200, 65536, 65537, 70000, 1<<20 + 3} {
			for _, trace := range []string{"", "0123456789abcdef0123456789abcdef-0123456789abcdef"} {
				name := fmt.Sprintf("%s/%d/trace=%v", path, size, trace != "")
				k := claim.NewKey(nil, name)
				key := claim.RecordKey("p70:", k)
				var lease *claim.Lease
				var err error
				switch path {
				case "fast", "recreated", "hash rewritten":
					lease, _, err = strS.Acquire(ctx, k, fp("A"), long)
				case "late":
					lease, _, err = strS.Acquire(ctx, k, fp("A"), short)
				case "held unknown":
					lease, _, err = strS.Acquire(ctx, k, fp("A"), hold)
				}
				if err != nil || lease == nil {
					t.Fatalf("%s: claim %v", name, err)
				}
				switch path {
				case "recreated":
					rdb.Del(ctx, key)
				case "hash rewritten":
					asHashClaim(t, rdb, key, time.Hour)
				case "late":
					time.Sleep(80 * time.Millisecond)
				case "held unknown":
					time.Sleep(80 * time.Millisecond)
					if _, _, err := strS.Acquire(ctx, k, fp("A"), hold); err == nil {
						t.Fatalf("%s: the expired claim was not held", name)
					}
				}
				rec := &claim.Record{Status: 201, Header: map[string][]string{"A": {"b"}},
					Body: bytes.Repeat([]byte{'a', 0, 0xff, '\n'}, size/4+1)[:size], Trace: trace}
				if err := lease.Complete(ctx, rec, 30*time.Minute); err != nil {
					t.Fatalf("%s: complete %v", name, err)
				}
				want := "string"
				if path == "hash rewritten" && len(rec.Encode()) > 65536 {
					want = "hash" // a large answer over a hash claim keeps it a hash
				}
				if typ := rdb.Type(ctx, key).Val(); typ != want {
					t.Errorf("%s: record is a %s, want a %s", name, typ, want)
				}
				if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 29*time.Minute || ttl > 30*time.Minute {
					t.Errorf("%s: TTL %v, want 30m", name, ttl)
				}
				if used := rdb.MemoryUsage(ctx, key, 0).Val(); used > int64(size)*5/4+2048 {
					t.Errorf("%s: %d bytes of Redis memory for %d", name, used, size)
				}
				_, got, err := strS.Acquire(ctx, k, fp("A"), long)
				if err != nil || got == nil || got.Status != 201 || !bytes.Equal(got.Body, rec.Body) || got.Trace != trace {
					t.Errorf("%s: replay %v, %v", name, got != nil, err)
				}
			}
		}
	}
}
