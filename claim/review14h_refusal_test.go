package claim_test

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview14hStringClaimRefusedWrite (passes: evidence, not a finding):
// claim.lua's pcall'd SET NX, refused by a Redis that answers (NOREPLICAS
// under min-replicas-to-write, READONLY on a demoted master, OOM under
// noeviction), over no record or a foreign hash without st. The refusal is
// reported (no lease, no replay), classified by claim.Unavailable as the hash
// form's is (NOREPLICAS and READONLY an outage, OOM not), and nothing is
// written or deleted: the foreign hash stays a hash. Over a completed record
// the refused SET NX (the fast path writes first) does not stand: the record
// is read and replayed, as a Redis that refuses writes still answers reads.
func TestReview14hStringClaimRefusedWrite(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, tc := range []struct {
		name          string
		unavailable   bool
		refuse, allow func() error
	}{
		{"NOREPLICAS", true,
			func() error { return rdb.ConfigSet(ctx, "min-replicas-to-write", "1").Err() },
			func() error { return rdb.ConfigSet(ctx, "min-replicas-to-write", "0").Err() }},
		{"READONLY", true,
			// Its master is a port nobody listens on: it keeps its data, refuses writes.
			func() error { return rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(t)).Err() },
			func() error { return rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() }},
		{"OOM", false,
			func() error {
				if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return rdb.ConfigSet(ctx, "maxmemory", "1").Err()
			},
			func() error { return rdb.ConfigSet(ctx, "maxmemory", "0").Err() }},
	} {
		for _, pre := range []string{"none", "foreign hash", "completed"} {
			t.Run(tc.name+"/"+pre, func(t *testing.T) {
				k := claim.NewKey(nil, tc.name+"/"+pre)
				rk := claim.RecordKey("refused:", k)
				s := claim.NewStore(rdb, "refused:", nil, claim.StringRecords(true))
				switch pre {
				case "completed":
					l, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
						t.Fatal(err)
					}
				case "foreign hash":
					if err := rdb.HSet(ctx, rk, "x", "y").Err(); err != nil {
						t.Fatal(err)
					}
				}
				typ0, val0 := rdb.Type(ctx, rk).Val(), rdb.Dump(ctx, rk).Val()
				if err := tc.refuse(); err != nil {
					t.Fatal(err)
				}
				l, r, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if err := tc.allow(); err != nil {
					t.Fatal(err)
				}
				if pre == "completed" {
					if l != nil || err != nil || r == nil || r.Status != 201 || string(r.Body) != "done" {
						t.Errorf("string claim of a completed key, writes refused by %s: lease %v, record %+v, err %v; want its replay",
							tc.name, l != nil, r, err)
					}
				} else if l != nil || r != nil || err == nil || claim.Unavailable(err) != tc.unavailable {
					t.Errorf("string claim refused by %s: lease %v, record %v, err %v (unavailable %v); want an error, unavailable %v",
						tc.name, l != nil, r != nil, err, claim.Unavailable(err), tc.unavailable)
				}
				if typ, val := rdb.Type(ctx, rk).Val(), rdb.Dump(ctx, rk).Val(); typ != typ0 || val != val0 {
					t.Errorf("after the refusal: record %s %q (was %s %q)", typ, val, typ0, val0)
				}
			})
		}
	}
}
