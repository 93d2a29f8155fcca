package claim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview14gStringReplicaReadsHashRecordWithoutWriting: with
// RECORD_FORMAT=string, claim.lua reads the record with MGET, and when MGET
// finds no string it tries SET NX before it looks for a hash. A hash record
// (every record written before the switch, and by any hash replica during
// the rollout, for one TTL after) is therefore only read after a write
// command. Redis refuses a script's first write, before it looks at the
// key, when it refuses writes at all: min-replicas-to-write not met
// (NOREPLICAS), out of memory under noeviction (OOM), a demoted master
// (READONLY), a failed save (MISCONF). A hash replica replays the recorded
// answer (its claim only reads); a string replica gets an error, and
// NOREPLICAS/READONLY count as an outage (claim.Unavailable): with
// FAIL_MODE=open the completed key is forwarded and executes again.
func TestReview14gStringReplicaReadsHashRecordWithoutWriting(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg, reset [2]string
	}{
		{"min-replicas-to-write (NOREPLICAS)", [2]string{"min-replicas-to-write", "1"}, [2]string{"min-replicas-to-write", "0"}},
		{"maxmemory under noeviction (OOM)", [2]string{"maxmemory", "1"}, [2]string{"maxmemory", "0"}},
		{"a demoted master (READONLY)", [2]string{"REPLICAOF", ""}, [2]string{"REPLICAOF", "NO ONE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, "maxmemory-policy noeviction")
			rdb := srv.Client()
			hash := claim.NewStore(rdb, "wf:", nil, claim.StringRecords(false))
			str := claim.NewStore(rdb, "wf:", nil, claim.StringRecords(true))
			terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}

			// A payment recorded by a hash replica, another still in flight.
			done := claim.NewKey(nil, "paid")
			l, _, err := hash.Acquire(ctx, done, fp("A"), terms)
			if err != nil || l == nil {
				t.Fatalf("hash replica claims: %v, %v", l, err)
			}
			if err := l.Complete(ctx, &claim.Record{Status: 201, Body: []byte("paid once")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			busy := claim.NewKey(nil, "busy")
			if l, _, err := hash.Acquire(ctx, busy, fp("A"), terms); err != nil || l == nil {
				t.Fatalf("hash replica claims: %v, %v", l, err)
			}

			if tc.cfg[0] == "REPLICAOF" {
				// Its master is a port nobody listens on: it keeps its
				// data (no sync happens) and refuses writes, as an old
				// master does after a failover until it resyncs.
				if err := rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(t)).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() })
			} else {
				if err := rdb.ConfigSet(ctx, tc.cfg[0], tc.cfg[1]).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rdb.ConfigSet(ctx, tc.reset[0], tc.reset[1]).Err() })
			}

			// Control: the hash replica still answers from the record.
			if _, rec, err := hash.Acquire(ctx, done, fp("A"), terms); err != nil || rec == nil || string(rec.Body) != "paid once" {
				t.Fatalf("control, hash replica: %v, %v; want the replay", rec, err)
			}
			if _, _, err := hash.Acquire(ctx, busy, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
				t.Fatalf("control, hash replica on the in-flight key: %v, want ErrInFlight", err)
			}

			_, rec, err := str.Acquire(ctx, done, fp("A"), terms)
			if err != nil || rec == nil || string(rec.Body) != "paid once" {
				t.Errorf("string replica, completed hash record: record %v, err %v (claim.Unavailable=%v; true means FAIL_MODE=open forwards the completed key again); want the replay the hash replica gives",
					rec, err, claim.Unavailable(err))
			}
			_, _, err = str.Acquire(ctx, busy, fp("A"), terms)
			if !errors.Is(err, claim.ErrInFlight) {
				t.Errorf("string replica, in-flight hash record: %v (claim.Unavailable=%v); want ErrInFlight as the hash replica answers",
					err, claim.Unavailable(err))
			}
		})
	}
}
