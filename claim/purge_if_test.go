package claim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestPurgeIfState: PurgeIf deletes a record only in the state asked for,
// and reports the state it found otherwise, deleting nothing.
func TestPurgeIfState(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")
	// What PurgeIf announces to the replicas' replay caches, in order.
	sub := rdb.Subscribe(ctx, claim.PurgeChannel("t:"))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}

	done := claim.NewKey(nil, "done")
	completed(t, s, done)
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateInFlight); !errors.Is(err, claim.ErrStateDiffers) || deleted || st != claim.StateCompleted {
		t.Errorf("completed, --state in_flight: %q %v %v; want completed, nothing deleted, ErrStateDiffers", st, deleted, err)
	}
	if _, rec, err := s.Acquire(ctx, done, fp("f"), watchTerms); rec == nil || err != nil {
		t.Fatalf("after the refused purge the record must still replay: %v %v", rec, err)
	}
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateCompleted); err != nil || !deleted || st != claim.StateCompleted {
		t.Errorf("completed, --state completed: %q %v %v; want it deleted", st, deleted, err)
	}
	if st, deleted, err := in.PurgeIf(ctx, done, claim.StateCompleted); !errors.Is(err, claim.ErrStateDiffers) || deleted || st != "" {
		t.Errorf("no record: %q %v %v; want \"\", nothing deleted, ErrStateDiffers", st, deleted, err)
	}

	flying := claim.NewKey(nil, "flying")
	// A lock long enough that a stalled test goroutine still finds it live.
	const flyingLock = time.Second
	if lease, _, err := s.Acquire(ctx, flying, fp("f"), claim.Terms{LockTTL: flyingLock, TTL: time.Hour}); lease == nil || err != nil {
		t.Fatalf("claim: %v %v", lease, err)
	}
	lockEnded := time.Now().Add(flyingLock + 100*time.Millisecond) // on any clock of this host
	// Live: its lock runs. Refused.
	if st, deleted, err := in.PurgeIf(ctx, flying, claim.StateInFlight); !errors.Is(err, claim.ErrClaimLive) || deleted || st != claim.StateInFlight {
		t.Errorf("in flight with its lock running, --state in_flight: %q %v %v; want ErrClaimLive, nothing deleted", st, deleted, err)
	}
	// Abandoned once the lock expired on Redis's clock (a refusal until
	// then deletes and announces nothing).
	var (
		st      claim.State
		deleted bool
		err     error
	)
	for {
		called := time.Now()
		st, deleted, err = in.PurgeIf(ctx, flying, claim.StateInFlight)
		if !errors.Is(err, claim.ErrClaimLive) {
			break
		}
		// Refused after the lock ended: no stall explains that (review64).
		if called.After(lockEnded) {
			t.Fatalf("PurgeIf called %v after the claim's %v lock ended: %v; want the abandoned claim deleted", called.Sub(lockEnded), flyingLock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || !deleted || st != claim.StateInFlight {
		t.Errorf("abandoned, --state in_flight: %q %v %v; want it deleted", st, deleted, err)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("t:", flying)).Result(); n != 0 {
		t.Errorf("the purged in-flight record is still there")
	}
	// Announced: the two deletions; not the refusals, the one that found no
	// record included (keys forget announces again; Announce).
	want := []string{done.String(), flying.String()}
	var got []string
	for range want {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := sub.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			break
		}
		got = append(got, m.Payload)
	}
	if !slices.Equal(got, want) {
		t.Errorf("announced %q, want %q (done and flying deleted)", got, want)
	}
}

// TestPurgeIfRacesCompletion: an operator purges an abandoned key (its lock
// expired) with --state in_flight while its late request completes after
// all. Whatever the order, a completion that succeeded leaves a record:
// either the purge came first (the completion then records all the same,
// Recreated) or it found the key completed and deleted nothing. A purge
// that read "in flight" and then deleted the completed record would make
// the next retry execute again.
func TestPurgeIfRacesCompletion(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")
	deadline := time.Now().Add(20 * time.Second)
	outcomes := map[string]int{}
	for i := 0; i < 300 && time.Now().Before(deadline); i++ {
		k := claim.NewKey(nil, fmt.Sprintf("race-%d", i))
		lease, _, err := s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: 2 * time.Millisecond, TTL: time.Hour})
		if err != nil || lease == nil {
			t.Fatalf("claim %d: %v %v", i, lease, err)
		}
		time.Sleep(3 * time.Millisecond) // past the lock (Redis's clock; purges refused on a live one retry below)
		// Staggered by up to 1 ms either way, so that every interleaving
		// comes up: completion first, purge first, and the completion
		// landing between the purge's read and its delete.
		stagger := time.Duration(rand.IntN(1000)) * time.Microsecond
		completeErr := make(chan error, 1)
		go func() {
			if i%2 == 0 {
				time.Sleep(stagger)
			}
			completeErr <- lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour)
		}()
		if i%2 == 1 {
			time.Sleep(stagger)
		}
		_, deleted, perr := in.PurgeIf(ctx, k, claim.StateInFlight)
		if errors.Is(perr, claim.ErrClaimLive) {
			outcomes["lock not yet expired"]++
		} else if perr != nil && !errors.Is(perr, claim.ErrStateDiffers) {
			t.Fatalf("purge %d: %v", i, perr)
		}
		if err := <-completeErr; err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		switch {
		case deleted && lease.Recreated:
			outcomes["purge first"]++
		case deleted:
			outcomes["purged a completed record"]++
		default:
			outcomes["completion first"]++
		}
		if n, _ := rdb.Exists(ctx, claim.RecordKey("t:", k)).Result(); n != 1 {
			t.Fatalf("iteration %d: the completion succeeded (recreated %v) and the purge deleted %v, but no record is left: the next retry executes again (outcomes so far %v)",
				i, lease.Recreated, deleted, outcomes)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}
