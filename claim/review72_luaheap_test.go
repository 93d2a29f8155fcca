package claim_test

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview72HashPathLuaHeap: review14g's budget (string records keep at
// most twice the Lua heap of hash records after recording a large answer)
// on setString's hash path: a string replica completing a claim that a
// hash replica held (mixed RECORD_FORMAT rollout, ON_UNKNOWN=hold, a slow
// upstream) writes SET head..rec, one more copy of the answer in Lua.
func TestReview72HashPathLuaHeap(t *testing.T) {
	const size = 8 << 20
	heap := map[string]int64{}
	for _, path := range []string{"hash", "string", "string-over-hash"} {
		srv := redistest.Start(t)
		rdb := srv.Client()
		s := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(path != "hash"))
		terms := claim.Terms{LockTTL: 200 * time.Millisecond, TTL: time.Hour}
		k := claim.NewKey(nil, "large answer")
		lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: %v, %v", path, lease, err)
		}
		time.Sleep(300 * time.Millisecond)
		if path == "string-over-hash" {
			hs := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(false))
			hold := terms
			hold.Hold = true
			if _, _, err := hs.Acquire(ctx, k, fp("A"), hold); err == nil {
				t.Fatal("hold: no error")
			}
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: make([]byte, size)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		heap[path] = infoMemory(t, rdb, "used_memory_lua")
	}
	t.Logf("Lua heap after recording an %d MiB answer (late): %v", size>>20, heap)
	for _, p := range []string{"string", "string-over-hash"} {
		if heap[p] > 2*heap["hash"] {
			t.Errorf("Lua heap after recording an %d MiB answer on the %s path: %.1f MB, hash records %.1f MB (%.1fx)",
				size>>20, p, float64(heap[p])/1e6, float64(heap["hash"])/1e6, float64(heap[p])/float64(heap["hash"]))
		}
	}
}
