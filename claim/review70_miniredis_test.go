package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemproxy/idemproxy/claim"
	"github.com/redis/go-redis/v9"
)

// TestReview70MiniredisLargeRecord: the embedded store (miniredis) writes
// and replays a large string record, at and around the 64 KiB switch, on the
// completion's fast path and the "recreated" path, with its TTL.
func TestReview70MiniredisLargeRecord(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	s := claim.NewStore(rdb, "mr70:", nil, claim.StringRecords(true))
	for _, size := range []int{65536 - 9, 65536 - 8, 65536, 65537, 100 << 10} {
		for _, lost := range []bool{false, true} {
			name := fmt.Sprintf("%d/lost=%v", size, lost)
			k := claim.NewKey(nil, name)
			l, _, err := s.Acquire(ctx, k, fp("A"), terms)
			if err != nil || l == nil {
				t.Fatalf("%s: claim %v", name, err)
			}
			if lost {
				mr.Del(claim.RecordKey("mr70:", k))
			}
			rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte{0, 1, 2, 0xff}, size/4+1)[:size]}
			if err := l.Complete(ctx, rec, time.Hour); err != nil {
				t.Fatalf("%s: complete %v", name, err)
			}
			if ttl := mr.TTL(claim.RecordKey("mr70:", k)); ttl != time.Hour {
				t.Errorf("%s: TTL %v, want 1h", name, ttl)
			}
			_, got, err := s.Acquire(ctx, k, fp("A"), terms)
			if err != nil || got == nil || got.Status != 201 || !bytes.Equal(got.Body, rec.Body) {
				t.Errorf("%s: replay %v %v", name, got != nil, err)
			}
		}
	}
}
