package claim_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestLargeCompletionDuringSlotMigration: while a Redis Cluster
// slot is being migrated (redis-cli --cluster reshard/rebalance: the source
// MIGRATING, the target IMPORTING, keys moved by MIGRATE), a command whose
// keys are only partly on the node is refused with TRYAGAIN, on the source
// and (after ASK) on the target alike, and a script's command on a key that
// is not there is redirected. 0db3b01 built a large string record in a
// scratch key that never exists: every completion of an answer over 64 KiB
// was refused for as long as its slot migrated. It is now written in the
// record key itself, and served as a small one is; so is the claim of a
// retry.
func TestLargeCompletionDuringSlotMigration(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	for _, format := range []string{"string", "hash"} {
		for _, size := range []int{1 << 10, 100 << 10} {
			name := fmt.Sprintf("%s/%dKiB", format, size>>10)
			t.Run(name, func(t *testing.T) {
				prefix := "migcomplete:"
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

// TestLargeCompletionAfterKeyMigrated: TestLargeCompletionDuringSlotMigration completes
// while the slot is MIGRATING but the key is still on the source. Here the
// key has been MIGRATEd already: the source answers ASK, and the script
// runs on the IMPORTING target after ASKING, where BITOP's two keys (the
// same one) are both present. Also the hash path (a hash replica held the
// claim) on either side, and what the master's replica keeps (effects
// replication runs BITOP there too).
func TestLargeCompletionAfterKeyMigrated(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, prior := range []string{"string", "hashheld"} {
		for _, moved := range []bool{false, true} {
			name := fmt.Sprintf("%s/moved=%v", prior, moved)
			t.Run(name, func(t *testing.T) {
				prefix := "migmoved:"
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
				raw, ttl, mu := readAsking(t, holder, key, "ASKING")
				if prior == "hashheld" {
					if !bytes.Equal(raw, rec.Encode()) {
						t.Errorf("the hash record's answer differs from the completion's")
					}
				} else {
					checkStringRecord(t, raw, rec.Encode(), "c", "")
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
					rraw, rttl, rmu := readAsking(t, r, key, "READONLY")
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

// readAsking reads key's value, PTTL and MEMORY USAGE on node n,
// each command after flag (ASKING for an importing node, READONLY for a
// replica).
func readAsking(t *testing.T, n *redistest.Server, key, flag string) ([]byte, time.Duration, int64) {
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

// TestStringDuplicateCommands: with RECORD_FORMAT=string the claim writes
// first (TIME, SET NX PX), so a duplicate that reaches Redis runs those two
// before it reads the record (README "Record format": the README once said one command more than before 2026-12-01; a replay runs 4
// where MGET and PTTL were 2). Counted with INFO commandstats.
func TestStringDuplicateCommands(t *testing.T) {
	t.Parallel()
	checkDuplicateCommands(t, "s", func(rdb *redis.Client, key, st string, now int64) {
		v := encString(st, otherToken, dupFP, dupUpstream, fmt.Sprint(now), fmt.Sprint(now+60000), "", "", "ANSWER")
		if err := rdb.Set(ctx, key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}, map[string]int64{"time": 1, "set": 1, "get": 1, "pttl": 1}, map[string]int64{"time": 1, "set": 1, "get": 1}, map[string]int64{"time": 1, "set": 1, "get": 1})
}

// checkDuplicateCommands writes a record in each duplicate's state with
// write, runs claim.lua as a duplicate of it in form ("s" strings, "" hashes)
// and compares what Redis counted with the replay's, the 409's and the
// 422's commands. The duplicate must change neither the record nor its TTL.
func checkDuplicateCommands(t *testing.T, form string, write func(rdb *redis.Client, key, st string, now int64), replay, inflight, mismatch map[string]int64) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	cur := redis.NewScript(scripts.Claim)
	for _, dup := range []struct {
		name string
		st   string
		fp   string
		want map[string]int64
	}{
		{"replay of a completed key", "c", dupFP, replay},
		{"in flight", "i", dupFP, inflight},
		{"another fingerprint (422)", "c", strings.Repeat("g", 32), mismatch},
	} {
		t.Run(dup.name, func(t *testing.T) {
			key := "dupcmd" + form + ":{" + dup.name + "}"
			write(rdb, key, dup.st, rdb.Time(ctx).Val().UnixMilli())
			before := rdb.Dump(ctx, key).Val()
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := cur.Run(ctx, rdb, []string{key}, dupToken, dup.fp, 30000, 600000, dupUpstream, "", form, "").Err(); err != nil {
				t.Fatal(err)
			}
			got := commandStats(t, rdb.Info(ctx, "commandstats").Val())
			delete(got, "evalsha")
			delete(got, "eval")
			if !reflect.DeepEqual(got, dup.want) {
				t.Errorf("%s, form %q: %v; want %v", dup.name, form, got, dup.want)
			}
			if after := rdb.Dump(ctx, key).Val(); after != before {
				t.Errorf("%s, form %q: the duplicate changed the record", dup.name, form)
			}
			if ttl := rdb.PTTL(ctx, key).Val(); ttl < 59*time.Minute {
				t.Errorf("%s, form %q: the duplicate changed the record's TTL to %v", dup.name, form, ttl)
			}
		})
	}
}

// TestPurgeDuringSlotMigration: while Redis Cluster migrates a
// slot, a command naming a key that is not there is refused (TRYAGAIN).
// Purge and PurgeIf named the record and the pre-2026-11-23 claim mark,
// which is never there, in one DEL (and one WATCH): the operator's way out
// of an unknown key failed for as long as its slot migrated. They name the
// record only.
func TestPurgeDuringSlotMigration(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "migpurge:"
	s := claim.NewStore(rdb, prefix, nil)
	in := claim.NewInspector(rdb, prefix)
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour, Hold: true}
	for _, how := range []string{"Purge", "PurgeIf(unknown)"} {
		t.Run(how, func(t *testing.T) {
			k := claim.NewKey(nil, how)
			l, _, err := s.Acquire(ctx, k, fp("A"), terms)
			if err != nil || l == nil {
				t.Fatalf("claim: %v", err)
			}
			if err := l.Hold(ctx, 504, time.Hour); err != nil {
				t.Fatal(err)
			}
			_, _, slot := migratingSlot(t, cl, claim.RecordKey(prefix, k))
			if how == "Purge" {
				_, err = in.Purge(ctx, k)
			} else {
				_, _, err = in.PurgeIf(ctx, k, claim.StateUnknown)
			}
			if err != nil {
				t.Errorf("%s of an unknown key while slot %d migrates: %v; a one-key DEL is served", how, slot, err)
			}
		})
	}
}

// TestClaimTimesOnRedisClock (passes: evidence, not a finding):
// the claim record's at and ld, a takeover's age and a hold's ct come from
// Redis TIME, in both forms: miniredis's clock is set two years back, so a
// proxy clock (or a stale now) would show.
func TestClaimTimesOnRedisClock(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	virt := time.Now().Add(-2 * 365 * 24 * time.Hour).Truncate(time.Millisecond)
	mr.SetTime(virt)
	vms := virt.UnixMilli()
	for _, str := range []bool{true, false} {
		s := claim.NewStore(rdb, fmt.Sprintf("clock%v:", str), nil, claim.StringRecords(str))
		in := claim.NewInspector(rdb, fmt.Sprintf("clock%v:", str))
		k := claim.NewKey(nil, "clock")
		if _, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Second, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		e, err := in.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if e.ClaimedAt.UnixMilli() != vms || e.LockExpiresAt.UnixMilli() != vms+1000 {
			t.Errorf("string %v: claimed at %v, lock until %v; want Redis's %v and +1s", str, e.ClaimedAt, e.LockExpiresAt, virt)
		}
		mr.SetTime(virt.Add(5 * time.Second))
		l, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Second, TTL: time.Hour})
		if err != nil || l == nil || !l.TakenOver || l.TakeoverAge != 5*time.Second {
			t.Errorf("string %v: takeover %v age %v err %v; want age 5s on Redis's clock", str, l != nil && l.TakenOver, l.TakeoverAge, err)
		}
		mr.SetTime(virt.Add(10 * time.Second))
		_, _, err = s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Second, TTL: time.Hour, Hold: true})
		if err == nil {
			t.Fatalf("string %v: hold of an expired lock: no error", str)
		}
		e, err = in.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if e.State != claim.StateUnknown || e.CompletedAt.UnixMilli() != vms+10000 || e.ClaimedAt.UnixMilli() != vms+5000 {
			t.Errorf("string %v: held: %+v; want unknown, ct at Redis's +10s, at +5s", str, e)
		}
		mr.SetTime(virt)
	}
}

// TestClaimStatesDuringSlotMigration (passes: evidence, not a
// finding): while the key's slot migrates, claim.lua (one key, write first)
// serves an in-flight duplicate, a takeover after the lock and a hold after
// the lock, with the record on the source (claimed before the migration
// began) or on the target (claimed during it: ASK), in both record forms.
func TestClaimStatesDuringSlotMigration(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, where := range []string{"source", "target"} {
		for _, str := range []bool{true, false} {
			for _, hold := range []bool{false, true} {
				name := fmt.Sprintf("%s/string=%v/hold=%v", where, str, hold)
				t.Run(name, func(t *testing.T) {
					prefix := "migstates:"
					s := claim.NewStore(rdb, prefix, nil, claim.StringRecords(str))
					// A lock long enough to outlast setting up the migration
					// on a loaded machine; the test then waits out what is left.
					terms := claim.Terms{LockTTL: time.Second, TTL: time.Hour, Hold: hold}
					k := claim.NewKey(nil, name)
					key := claim.RecordKey(prefix, k)
					var claimedBy time.Time // the lock began before this
					first := func() {
						if l, _, err := s.Acquire(ctx, k, fp("A"), terms); err != nil || l == nil {
							t.Fatalf("first claim (%s): %v", where, err)
						}
						claimedBy = time.Now()
					}
					if where == "source" {
						first()
					}
					_, _, slot := migratingSlot(t, cl, key)
					if where == "target" {
						first()
					}
					if _, _, err := s.Acquire(ctx, k, fp("A"), terms); err != claim.ErrInFlight {
						t.Errorf("in-flight duplicate while slot %d migrates: %v", slot, err)
					}
					time.Sleep(time.Until(claimedBy.Add(terms.LockTTL + 100*time.Millisecond)))
					l, _, err := s.Acquire(ctx, k, fp("A"), terms)
					if hold {
						if _, ok := err.(*claim.UnknownError); !ok {
							t.Errorf("hold after the lock while slot %d migrates: lease %v err %v", slot, l != nil, err)
						}
					} else if err != nil || l == nil || !l.TakenOver {
						t.Errorf("takeover while slot %d migrates: lease %v err %v", slot, l != nil, err)
					}
				})
			}
		}
	}
}

// TestDuplicatePropagatesNothing (passes: evidence, not a finding):
// with REDIS_WAIT_REPLICAS, WAIT follows the script on its connection and
// counts that connection's last propagated write. A duplicate's SET NX that
// finds the key (replay, in flight, mismatch) propagates nothing: the
// master's replication offset does not move, so WAIT after a duplicate is
// what it was when the claim read before it wrote. And a replay with
// WaitReplicas still replays.
func TestDuplicatePropagatesNothing(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t, fmt.Sprintf("replicaof 127.0.0.1 %d", master.Port()))
	mc := master.Client()
	redistest.WaitReplicated(t, master, replica, 10*time.Second)
	offset := func() string {
		for _, l := range strings.Split(mc.Info(ctx, "replication").Val(), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "master_repl_offset:"); ok {
				return v
			}
		}
		t.Fatal("no master_repl_offset")
		return ""
	}
	s := claim.NewStore(mc, "dupwait:", nil, claim.StringRecords(true), claim.WaitReplicas(1, 2*time.Second))
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	done, busy := claim.NewKey(nil, "done"), claim.NewKey(nil, "busy")
	l, _, err := s.Acquire(ctx, done, fp("A"), terms)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, &claim.Record{Status: 201, Body: []byte("x")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Acquire(ctx, busy, fp("A"), terms); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past a replica ping (REPLCONF) the offset would count
	for _, tc := range []struct {
		k  claim.Key
		fp string
	}{{done, "A"}, {busy, "A"}, {done, "B"}} {
		o0 := offset()
		l, r, err := s.Acquire(ctx, tc.k, fp(tc.fp), terms)
		if o1 := offset(); o1 != o0 {
			t.Errorf("a duplicate moved the replication offset %s -> %s", o0, o1)
		}
		if tc.k == done && tc.fp == "A" && (l != nil || r == nil || err != nil) {
			t.Errorf("replay with WaitReplicas: lease %v record %v err %v", l != nil, r, err)
		}
	}
}

// encString encodes a string record as the scripts do.
func encString(st, tok, fp, up, at, ld, ct, tr, rec string) string {
	return "R2" + string([]byte{byte(len(st)), byte(len(tok)), byte(len(fp)), byte(len(up)), byte(len(at)),
		byte(len(ld)), byte(len(ct)), byte(len(tr))}) + st + tok + fp + up + at + ld + ct + tr + rec
}

const (
	dupToken    = "tokentokentoken1" // the caller's token (16 bytes)
	otherToken  = "othertokenother2"
	dupUpstream = "upstreamupstream"
)

var dupFP = strings.Repeat("f", 32)
