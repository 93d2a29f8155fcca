package claim_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// infoMemory is the integer field of Redis's INFO memory: used_memory (what
// maxmemory bounds), or used_memory_lua (Redis's Lua heap; Redis 7 also
// calls it used_memory_vm_eval), which is not part of used_memory, so
// maxmemory does not bound it, and is in the RSS.
func infoMemory(t *testing.T, rdb *redis.Client, field string) int64 {
	t.Helper()
	for _, l := range strings.Split(rdb.Info(ctx, "memory").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO memory", field)
	return 0
}

// TestReview14gStringFormLuaHeap: a string record is built and taken apart
// in Lua: complete.lua concatenates the whole answer into a new string
// (enc: table.concat) beside ARGV, claim.lua's replay copies it out of the
// value (dec: string.sub(v, p)). A hash record's answer goes through Lua
// once (ARGV, HMGET). So the Lua heap that Redis keeps after recording or
// replaying a large answer is about three times the answer with string
// records, once with hashes: with MAX_STORED_RESPONSE_BYTES at its 64 MiB
// bound, ~190 MB of Redis RSS outside maxmemory instead of ~64 MB. Redis
// sizing (and a container memory limit) has to know; the README's "Record
// format" says nothing of it.
func TestReview14gStringFormLuaHeap(t *testing.T) {
	const size = 8 << 20
	heap := map[string][2]int64{}
	for _, f := range forms {
		srv := redistest.Start(t)
		rdb := srv.Client()
		s := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(f.str))
		terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
		k := claim.NewKey(nil, "large answer")
		lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: %v, %v", f.name, lease, err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: make([]byte, size)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		afterComplete := infoMemory(t, rdb, "used_memory_lua")
		if _, rec, err := s.Acquire(ctx, k, fp("A"), terms); err != nil || rec == nil || len(rec.Body) != size {
			t.Fatalf("%s: replay: %v", f.name, err)
		}
		heap[f.name] = [2]int64{afterComplete, infoMemory(t, rdb, "used_memory_lua")}
	}
	t.Logf("Lua heap after recording / replaying an %d MiB answer: hash %v, string %v", size>>20, heap["hash"], heap["string"])
	for i, what := range []string{"recording", "replaying"} {
		if h, s := heap["hash"][i], heap["string"][i]; s > 2*h {
			t.Errorf("Lua heap after %s an %d MiB answer: %.1f MB with string records, %.1f MB with hashes (%.1fx)",
				what, size>>20, float64(s)/1e6, float64(h)/1e6, float64(s)/float64(h))
		}
	}
}
