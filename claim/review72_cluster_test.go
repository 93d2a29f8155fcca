package claim_test

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReview72LargeCompletionAfterKeyMigrated: review71's test completes
// while the slot is MIGRATING but the key is still on the source. Here the
// key has been MIGRATEd already: the source answers ASK, and the script
// runs on the IMPORTING target after ASKING, where BITOP's two keys (the
// same one) are both present. Also the hash path (a hash replica held the
// claim) on either side, and what the master's replica keeps (effects
// replication runs BITOP there too).
func TestReview72LargeCompletionAfterKeyMigrated(t *testing.T) {
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, prior := range []string{"string", "hashheld"} {
		for _, moved := range []bool{false, true} {
			name := fmt.Sprintf("%s/moved=%v", prior, moved)
			t.Run(name, func(t *testing.T) {
				prefix := "r72mig:"
				terms := claim.Terms{LockTTL: 300 * time.Millisecond, TTL: time.Hour}
				s := claim.NewStore(rdb, prefix, nil, claim.StringRecords(true))
				k := claim.NewKey(nil, name)
				key := claim.RecordKey(prefix, k)
				l, _, err := s.Acquire(ctx, k, fp("A"), terms)
				if err != nil || l == nil {
					t.Fatalf("claim: %v", err)
				}
				if prior == "hashheld" {
					time.Sleep(400 * time.Millisecond)
					hs := claim.NewStore(rdb, prefix, nil, claim.StringRecords(false))
					hold := terms
					hold.Hold = true
					if _, _, err := hs.Acquire(ctx, k, fp("A"), hold); err == nil {
						t.Fatal("hold: no error")
					}
				}
				src, dst, _ := migratingSlot(t, cl, key)
				holder := src
				if moved {
					sc := src.Client()
					defer sc.Close()
					if err := sc.Do(ctx, "MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port()), key, 0, 5000).Err(); err != nil {
						t.Fatalf("MIGRATE: %v", err)
					}
					holder = dst
				}
				rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("m"), 300<<10)}
				if err := l.CompleteOnce(ctx, rec, time.Hour); err != nil {
					t.Fatalf("completion (%s): %v", name, err)
				}
				raw, ttl, mu := review72ReadAsking(t, holder, key, "ASKING")
				if prior == "hashheld" {
					if !bytes.Equal(raw, rec.Encode()) {
						t.Errorf("the hash record's answer differs from the completion's")
					}
				} else {
					review72CheckString(t, raw, rec.Encode(), "c", "")
				}
				if ttl < 59*time.Minute {
					t.Errorf("TTL %v", ttl)
				}
				if mu > int64(len(raw))*5/4+200 {
					t.Errorf("master: memory usage %d for %d bytes", mu, len(raw))
				}
				// (The target's replica does not know the slot is imported: it
				// answers MOVED even to READONLY, so only the source's is read.)
				if r := cl.ReplicaOf(holder); r != nil && !moved {
					redistest.WaitReplicated(t, holder, r, 10*time.Second)
					rraw, rttl, rmu := review72ReadAsking(t, r, key, "READONLY")
					if !bytes.Equal(rraw, raw) {
						t.Errorf("replica's record differs")
					}
					if rmu > int64(len(raw))*5/4+200 {
						t.Errorf("replica: memory usage %d for %d bytes", rmu, len(raw))
					}
					if rttl < 59*time.Minute {
						t.Errorf("replica TTL %v", rttl)
					}
					t.Logf("%s: master %d bytes, MEMORY USAGE master %d replica %d", name, len(raw), mu, rmu)
				}
			})
		}
	}
}

// review72ReadAsking reads key's value, PTTL and MEMORY USAGE on node n,
// each command after flag (ASKING for an importing node, READONLY for a
// replica).
func review72ReadAsking(t *testing.T, n *redistest.Server, key, flag string) ([]byte, time.Duration, int64) {
	t.Helper()
	c := n.Client()
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	do := func(args ...any) *redis.Cmd {
		pipe := conn.Pipeline()
		pipe.Do(ctx, flag)
		cmd := pipe.Do(ctx, args...)
		_, _ = pipe.Exec(ctx)
		return cmd
	}
	// A large answer over a hash claim keeps the record a hash: its answer
	// is then the field rec.
	get := []any{"GET", key}
	if typ, _ := do("TYPE", key).Text(); typ == "hash" {
		get = []any{"HGET", key, "rec"}
	}
	v, err := do(get...).Text()
	if err != nil {
		t.Fatalf("%v on %v: %v", get, n, err)
	}
	ttl, _ := do("PTTL", key).Int64()
	mu, _ := do("MEMORY", "USAGE", key, "SAMPLES", "0").Int64()
	return []byte(v), time.Duration(ttl) * time.Millisecond, mu
}
