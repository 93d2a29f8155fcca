package claim_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

var holdTerms = claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour, Hold: true}

// unknownStatus returns the status of an ErrUnknown, and whether this
// request entered the state; it fails the test for anything else.
// Use: unknownStatus(t)(s.Acquire(...)).
func unknownStatus(t *testing.T) func(*claim.Lease, *claim.Record, error) (int, bool) {
	return func(lease *claim.Lease, rec *claim.Record, err error) (int, bool) {
		t.Helper()
		var u *claim.UnknownError
		if lease != nil || rec != nil || !errors.As(err, &u) || !errors.Is(err, claim.ErrUnknown) {
			t.Fatalf("got lease %v, record %v, err %v; want ErrUnknown", lease, rec, err)
		}
		return u.Status, u.Entered
	}
}

// TestHoldLockExpired is case (c) of ON_UNKNOWN=hold: a claim whose lock
// expired (its proxy died) is never taken over; the claim script itself
// turns it unknown, and it stays so past the lock TTL. A different
// fingerprint still gets a mismatch, and the original proxy, slow rather
// than dead, may still record its real answer (its token matches): the
// real answer wins over unknown.
func TestHoldLockExpired(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			var results []string
			s := claim.NewStore(be.rdb, "test:", func(ev claim.Event) {
				if ev.Op == claim.OpComplete {
					results = append(results, ev.Result)
				}
			})
			key := claim.NewKey(nil, "held")
			// A lock long enough that a stalled test goroutine still finds it running.
			terms := holdTerms
			terms.LockTTL = time.Second
			orig, _, err := s.Acquire(ctx, key, fp("A"), terms)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Acquire(ctx, key, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
				t.Fatalf("before the lock expires: %v, want ErrInFlight", err)
			}
			be.advance(t, terms.LockTTL+250*time.Millisecond)
			if status, entered := unknownStatus(t)(s.Acquire(ctx, key, fp("A"), terms)); status != 504 || !entered {
				t.Errorf("first request after the lock expired: status %d entered %v, want 504 true", status, entered)
			}
			// Unknown for the key's TTL: asked of Redis, which no stall blurs (review64).
			if pttl, err := be.rdb.PTTL(ctx, claim.RecordKey("test:", key)).Result(); err != nil || pttl < terms.TTL/2 {
				t.Errorf("the unknown record expires in %v (%v; TTL %v, lock TTL %v): once it does, a retry executes the key again", pttl, err, terms.TTL, terms.LockTTL)
			}
			be.advance(t, terms.LockTTL+250*time.Millisecond) // past the lock TTL again: still no execution
			if status, entered := unknownStatus(t)(s.Acquire(ctx, key, fp("A"), terms)); status != 504 || entered {
				t.Errorf("later request: status %d entered %v, want 504 false", status, entered)
			}
			// A route without hold does not take an unknown key over either.
			expire := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour}
			unknownStatus(t)(s.Acquire(ctx, key, fp("A"), expire))
			if _, _, err := s.Acquire(ctx, key, fp("B"), terms); !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("other fingerprint: %v, want ErrMismatch", err)
			}
			if err := orig.Complete(ctx, &claim.Record{Status: 201, Body: []byte("real")}, time.Hour); err != nil {
				t.Fatalf("late completion by the original claimant: %v", err)
			}
			if !orig.Recreated || len(results) != 1 || results[0] != "late" {
				t.Errorf("Recreated %v, observed %v; want true, [late]", orig.Recreated, results)
			}
			if _, rec, err := s.Acquire(ctx, key, fp("A"), terms); err != nil || rec == nil || string(rec.Body) != "real" {
				t.Errorf("after the late completion: %v %v, want the real answer replayed", rec, err)
			}
		})
	}
}

// TestHoldRecorded is cases (a) and (b): the proxy records the outcome as
// unknown with the status it answered; retries get that status, never a
// lease, until the record is purged; then exactly one request executes.
func TestHoldRecorded(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "timedout")
			lease, _, err := s.Acquire(ctx, key, fp("A"), holdTerms)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Hold(ctx, 502, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := lease.Hold(ctx, 502, time.Hour); err != nil { // resent after a lost reply
				t.Fatalf("resent Hold: %v", err)
			}
			be.advance(t, 250*time.Millisecond)
			if status, entered := unknownStatus(t)(s.Acquire(ctx, key, fp("A"), holdTerms)); status != 502 || entered {
				t.Errorf("retry: status %d entered %v, want 502 false", status, entered)
			}
			// The purge (idemproxy keys purge deletes the record).
			if err := be.rdb.Del(ctx, claim.RecordKey("test:", key)).Err(); err != nil {
				t.Fatal(err)
			}
			next, _, err := s.Acquire(ctx, key, fp("A"), holdTerms)
			if err != nil || next == nil {
				t.Fatalf("after purge: %v %v, want a lease", next, err)
			}
			// The purged claimant cannot overwrite the new claim.
			if err := lease.Hold(ctx, 502, time.Hour); !errors.Is(err, claim.ErrLost) {
				t.Errorf("stale Hold after purge and a new claim: %v, want ErrLost", err)
			}
		})
	}
}

// TestHoldNeverDowngradesACompletion: Hold after Complete by the same lease
// changes nothing; Hold on a vanished claim records unknown all the same.
func TestHoldNeverDowngradesACompletion(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "done")
			lease, _, err := s.Acquire(ctx, key, fp("A"), holdTerms)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Complete(ctx, &claim.Record{Status: 200}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := lease.Hold(ctx, 504, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, rec, err := s.Acquire(ctx, key, fp("A"), holdTerms); err != nil || rec == nil || rec.Status != 200 {
				t.Errorf("after Hold on a completed key: %v %v, want the replay of 200", rec, err)
			}

			gone := claim.NewKey(nil, "gone")
			lease, _, err = s.Acquire(ctx, gone, fp("A"), holdTerms)
			if err != nil {
				t.Fatal(err)
			}
			_ = be.rdb.Del(ctx, claim.RecordKey("test:", gone)) // lost in a failover
			if err := lease.Hold(ctx, 504, time.Hour); err != nil || !lease.Recreated {
				t.Fatalf("Hold on a vanished claim: %v (recreated %v)", err, lease.Recreated)
			}
			unknownStatus(t)(s.Acquire(ctx, gone, fp("A"), holdTerms))
			if _, _, err := s.Acquire(ctx, gone, fp("B"), holdTerms); !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("other fingerprint on a recreated unknown: %v, want ErrMismatch", err)
			}
		})
	}
}

// TestExpireModeTakesOverAnyFingerprint: without hold, an expired lock frees
// the key as it did when the lock was the record's own expiry: any request
// takes it over, whatever its fingerprint.
func TestExpireModeTakesOverAnyFingerprint(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "expire")
			terms := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour}
			if _, _, err := s.Acquire(ctx, key, fp("A"), terms); err != nil {
				t.Fatal(err)
			}
			be.advance(t, 250*time.Millisecond)
			lease, _, err := s.Acquire(ctx, key, fp("B"), terms)
			if err != nil || lease == nil || !lease.TakenOver {
				t.Fatalf("after the lock expired: %v %v, want a takeover", lease, err)
			}
		})
	}
}

// TestHoldRace: many requests find one expired claim at once, against a
// real Redis. The transition is inside the claim script, so none of them
// executes and exactly one reports having entered the state.
func TestHoldRace(t *testing.T) {
	srv := redistest.Start(t)
	s := claim.NewStore(srv.Client(), "test:", nil)
	key := claim.NewKey(nil, "race")
	if _, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: 50 * time.Millisecond, TTL: time.Hour, Hold: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the lock expire on Redis's clock
	const n = 50
	var (
		wg                      sync.WaitGroup
		mu                      sync.Mutex
		leases, entered, others int
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, _, err := s.Acquire(ctx, key, fp("A"), holdTerms)
			var u *claim.UnknownError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case lease != nil:
				leases++
			case errors.As(err, &u) && u.Entered:
				entered++
			case errors.As(err, &u):
			default:
				others++
			}
		}()
	}
	wg.Wait()
	if leases != 0 || entered != 1 || others != 0 {
		t.Errorf("%d concurrent requests: %d leases, %d entered unknown, %d other results; want 0, 1, 0", n, leases, entered, others)
	}
}
