package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview72LargeRecordThroughAOFAndReplica: the large-record write is
// replicated as its effects (SETRANGE, SETRANGE, BITOP, PEXPIREAT) and
// logged so in the AOF. A replica (here with a smaller proto-max-bulk-len
// than its master) and a reload of the AOF both end with the same exact
// record, its size and its TTL.
func TestReview72LargeRecordThroughAOFAndReplica(t *testing.T) {
	m := redistest.Start(t, "appendonly yes", "appendfsync always", "enable-debug-command yes")
	r := redistest.Start(t, fmt.Sprintf("replicaof 127.0.0.1 %d", m.Port()), "proto-max-bulk-len 1mb")
	mc, rc := m.Client(), r.Client()
	redistest.WaitReplicated(t, m, r, 10*time.Second)
	s := claim.NewStore(mc, "aof:", nil, claim.StringRecords(true))
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	k := claim.NewKey(nil, "aof")
	key := claim.RecordKey("aof:", k)
	l, _, err := s.Acquire(ctx, k, fp("A"), terms)
	if err != nil || l == nil {
		t.Fatal(err)
	}
	rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("a"), 1536<<10)}
	if err := l.Complete(ctx, rec, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	want := mc.Get(ctx, key).Val()
	redistest.WaitReplicated(t, m, r, 10*time.Second)
	check := func(where string, got string, ttl time.Duration, mu int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: the record differs (%d bytes, want %d)", where, len(got), len(want))
		}
		if ttl < 29*time.Minute || ttl > 30*time.Minute {
			t.Errorf("%s: TTL %v, want the completion's 30m", where, ttl)
		}
		if mu > int64(len(want))*5/4+200 {
			t.Errorf("%s: MEMORY USAGE %d for %d bytes", where, mu, len(want))
		}
		t.Logf("%s: %d bytes, MEMORY USAGE %d, TTL %v", where, len(got), mu, ttl)
	}
	check("replica", rc.Get(ctx, key).Val(), rc.PTTL(ctx, key).Val(), rc.MemoryUsage(ctx, key, 0).Val())
	if err := mc.Do(ctx, "DEBUG", "LOADAOF").Err(); err != nil {
		t.Fatalf("DEBUG LOADAOF: %v", err)
	}
	check("master after AOF reload", mc.Get(ctx, key).Val(), mc.PTTL(ctx, key).Val(), mc.MemoryUsage(ctx, key, 0).Val())
}
