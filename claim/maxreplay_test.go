package claim_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestMaxReplay: a completed record larger than Terms.MaxReplay is not sent
// with the claim's reply, only its size (Redis's output shows it); read
// again with a bound of that size it comes whole. Both record formats.
func TestMaxReplay(t *testing.T) {
	for _, be := range backends(t) {
		for _, format := range []string{"hash", "string"} {
			t.Run(be.name+"/"+format, func(t *testing.T) {
				s := claim.NewStore(be.rdb, "test:", nil, claim.StringRecords(format == "string"))
				key := claim.NewKey(nil, "large-"+format)
				terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
				lease, _, err := s.Acquire(ctx, key, fp("A"), terms)
				if err != nil || lease == nil {
					t.Fatalf("claim: %v %v", lease, err)
				}
				body := bytes.Repeat([]byte("x"), 64<<10)
				if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: body}, time.Hour); err != nil {
					t.Fatal(err)
				}

				small := terms
				small.MaxReplay = 1024
				out := netOutput(t, be.rdb)
				_, rec, err := s.Acquire(ctx, key, fp("A"), small)
				var large *claim.LargeRecordError
				if !errors.As(err, &large) || rec != nil {
					t.Fatalf("MaxReplay 1024: rec %v err %v, want a LargeRecordError", rec != nil, err)
				}
				if large.Size <= int64(len(body)) || large.Size > int64(len(body))+1024 {
					t.Errorf("LargeRecordError.Size %d, want the encoded record's (a little over %d)", large.Size, len(body))
				}
				if sent := netOutput(t, be.rdb) - out; out >= 0 && sent > 4096 {
					t.Errorf("Redis sent %d bytes for a claim bounded to 1024: the record came anyway", sent)
				}
				if _, _, err := s.Acquire(ctx, key, fp("B"), small); !errors.Is(err, claim.ErrMismatch) {
					t.Errorf("another fingerprint: %v, want ErrMismatch (the bound tells nothing of the record)", err)
				}

				exact := terms
				exact.MaxReplay = large.Size
				if _, rec, err := s.Acquire(ctx, key, fp("A"), exact); err != nil || rec == nil || !bytes.Equal(rec.Body, body) || rec.Status != 201 {
					t.Fatalf("MaxReplay = the size: rec %v err %v, want the record", rec != nil, err)
				}
				if _, rec, err := s.Acquire(ctx, key, fp("A"), terms); err != nil || rec == nil || !bytes.Equal(rec.Body, body) {
					t.Fatalf("MaxReplay 0 (any): rec %v err %v, want the record", rec != nil, err)
				}
			})
		}
	}
}

// netOutput is Redis's total_net_output_bytes, or -1 where INFO does not
// report it (miniredis).
func netOutput(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	n, err := redistest.OutputBytes(ctx, rdb)
	if err != nil {
		return -1
	}
	return n
}
