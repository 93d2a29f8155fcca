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

// TestReview71LargeCompletionDuringSlotMigration: while a Redis Cluster
// slot is being migrated (redis-cli --cluster reshard/rebalance: the source
// MIGRATING, the target IMPORTING, keys moved by MIGRATE), a command whose
// keys are only partly on the node is refused with TRYAGAIN, on the source
// and (after ASK) on the target alike, and a script's command on a key that
// is not there is redirected. 0db3b01 built a large string record in a
// scratch key that never exists: every completion of an answer over 64 KiB
// was refused for as long as its slot migrated. It is now written in the
// record key itself, and served as a small one is; so is the claim of a
// retry.
func TestReview71LargeCompletionDuringSlotMigration(t *testing.T) {
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	for _, format := range []string{"string", "hash"} {
		for _, size := range []int{1 << 10, 100 << 10} {
			name := fmt.Sprintf("%s/%dKiB", format, size>>10)
			t.Run(name, func(t *testing.T) {
				prefix := "r71mig:"
				s := claim.NewStore(rdb, prefix, nil, claim.StringRecords(format == "string"))
				k := claim.NewKey(nil, name)
				key := claim.RecordKey(prefix, k)
				l, _, err := s.Acquire(ctx, k, fp("A"), terms)
				if err != nil || l == nil {
					t.Fatalf("claim: %v", err)
				}
				_, _, slot := migratingSlot(t, cl, key)
				rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("m"), size)}
				if err := l.CompleteOnce(ctx, rec, time.Hour); err != nil {
					t.Errorf("completion of a %d-byte answer (%s records) while slot %d migrates: %v; a one-key completion is served",
						size, format, slot, err)
				}
				// claim.lua declares the record key only (it declared the
				// claim mark of old versions too, which is never there: a
				// request that found a record during the migration got
				// TRYAGAIN, and 503), so the retry is replayed.
				l2, got, err := s.Acquire(ctx, k, fp("A"), terms)
				if err != nil || l2 != nil || got == nil || len(got.Body) != size {
					t.Errorf("a retry of the key (%s records) while slot %d migrates: lease %v, record %v, err %v; want its replay",
						format, slot, l2 != nil, got != nil, err)
				}
			})
		}
	}
}

// migratingSlot puts key's slot in the middle of a move, as a resharding
// does (its master MIGRATING, another IMPORTING), until the test ends, and
// returns the two masters and the slot.
func migratingSlot(t *testing.T, cl *redistest.Cluster, key string) (src, dst *redistest.Server, slot int) {
	t.Helper()
	slot = cl.KeySlot(key)
	src = cl.NodeForKey(key)
	for _, m := range cl.Masters() {
		if m != src {
			dst = m
			break
		}
	}
	sc, dc := src.Client(), dst.Client()
	t.Cleanup(func() {
		sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
		dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
		_ = sc.Close()
		_ = dc.Close()
	})
	srcID, dstID := sc.ClusterMyID(ctx).Val(), dc.ClusterMyID(ctx).Val()
	if err := dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	return src, dst, slot
}
