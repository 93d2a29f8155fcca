package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestPurgeIfInFlightSparesTakeover: `keys purge --state in_flight` deletes
// an abandoned claim only. An operator sees one (in flight, its lock
// expired); before the purge, a retry takes the key over: the record is a
// live claim, still in flight, whose request is executing. PurgeIf must not
// delete it, or the next retry executes beside the running one. (Found by
// review: the state alone was compared.)
func TestPurgeIfInFlightSparesTakeover(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, str := range []bool{false, true} {
		s := claim.NewStore(rdb, "t:", nil, claim.StringRecords(str))
		in := claim.NewInspector(rdb, "t:")
		k := claim.NewKey(nil, "abandoned-"+map[bool]string{false: "hash", true: "string"}[str])
		short := claim.Terms{LockTTL: 50 * time.Millisecond, TTL: time.Hour}
		if l, _, err := s.Acquire(ctx, k, fp("f"), short); err != nil || l == nil {
			t.Fatalf("first claim: %v %v", l, err)
		}
		time.Sleep(120 * time.Millisecond) // its request died; the lock expired
		seen, err := in.Get(ctx, k)
		if err != nil || seen.State != claim.StateInFlight || !seen.LockExpiresAt.Before(time.Now()) {
			t.Fatalf("operator's look: %+v %v", seen, err)
		}
		// A retry takes the key over: a live claim, executing now.
		live, _, err := s.Acquire(ctx, k, fp("f"), watchTerms)
		if err != nil || live == nil {
			t.Fatalf("takeover: %v %v", live, err)
		}
		now, _ := in.Get(ctx, k)
		_, deleted, err := in.PurgeIf(ctx, k, claim.StateInFlight)
		if !deleted && !errors.Is(err, claim.ErrClaimLive) {
			t.Errorf("string=%v: PurgeIf(in_flight) of a live claim: %v, want ErrClaimLive", str, err)
		}
		if deleted {
			third, _, _ := s.Acquire(ctx, k, fp("f"), watchTerms)
			t.Errorf("string=%v: PurgeIf(in_flight) deleted a live claim taken over after the operator looked "+
				"(seen claimed_at %v lock_expires_at %v; deleted claimed_at %v lock_expires_at %v, err %v); "+
				"the next retry claims it again (lease %v) and executes beside the running request",
				str, seen.ClaimedAt, seen.LockExpiresAt, now.ClaimedAt, now.LockExpiresAt, err, third != nil)
		}
	}
}
