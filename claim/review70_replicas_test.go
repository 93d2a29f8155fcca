package claim_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReview70LargeRecordReplicasAndAOF (passes: evidence, not a finding):
// Redis replicates a script's effects (MULTI, DEL, SETRANGE, SETRANGE,
// PEXPIREAT, EXEC). On Cluster, with WAIT 1, the replica of the key's master
// holds the same record with its TTL, and it takes its size there too; a
// standalone Redis with AOF restarted (the AOF replayed) holds it as well.
func TestReview70LargeRecordReplicasAndAOF(t *testing.T) {
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := claim.NewStore(rdb, "r70:", nil, claim.StringRecords(true), claim.WaitReplicas(1, 5*time.Second))
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	for _, size := range []int{100 << 10, 1536 << 10} {
		for _, lost := range []bool{false, true} {
			name := fmt.Sprintf("%d/lost=%v", size, lost)
			k := claim.NewKey(nil, name)
			key := claim.RecordKey("r70:", k)
			l, _, err := s.Acquire(ctx, k, fp("A"), terms)
			if err != nil || l == nil {
				t.Fatalf("%s: claim %v", name, err)
			}
			if lost {
				rdb.Del(ctx, key)
			}
			rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("r"), size)}
			if err := l.Complete(ctx, rec, time.Hour); err != nil {
				t.Fatalf("%s: complete %v", name, err)
			}
			m := cl.NodeForKey(key)
			r := cl.ReplicaOf(m)
			redistest.WaitReplicated(t, m, r, 10*time.Second)
			mc := m.Client()
			rc := redis.NewClient(&redis.Options{Addr: r.Addr(), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
				return cn.ReadOnly(ctx).Err()
			}})
			defer rc.Close()
			mv, rv := mc.Get(ctx, key).Val(), rc.Get(ctx, key).Val()
			if mv != rv || len(mv) < size {
				t.Errorf("%s: replica holds %d bytes, master %d", name, len(rv), len(mv))
			}
			if ttl := rc.PTTL(ctx, key).Val(); ttl <= 59*time.Minute {
				t.Errorf("%s: replica TTL %v", name, ttl)
			}
			if used := rc.MemoryUsage(ctx, key, 0).Val(); used > int64(size)*5/4 {
				t.Errorf("%s: %d bytes on the replica for %d", name, used, size)
			}
		}
	}

	srv := redistest.Start(t, "appendonly yes", "appendfsync always")
	sc := srv.Client()
	s2 := claim.NewStore(sc, "aof70:", nil, claim.StringRecords(true))
	k := claim.NewKey(nil, "aof")
	key := claim.RecordKey("aof70:", k)
	l, _, err := s2.Acquire(ctx, k, fp("A"), terms)
	if err != nil || l == nil {
		t.Fatal(err)
	}
	rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("a"), 300<<10)}
	if err := l.Complete(ctx, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	before := sc.Get(ctx, key).Val()
	srv.Kill()
	srv.Restart()
	sc = srv.Client()
	if after := sc.Get(ctx, key).Val(); after != before {
		t.Errorf("after the AOF is replayed: %d bytes, was %d", len(after), len(before))
	}
	if ttl := sc.PTTL(ctx, key).Val(); ttl <= 59*time.Minute {
		t.Errorf("after the AOF is replayed: TTL %v", ttl)
	}
	if used := sc.MemoryUsage(ctx, key, 0).Val(); used > int64(300<<10)*5/4 {
		t.Errorf("after the AOF is replayed: %d bytes", used)
	}
}
