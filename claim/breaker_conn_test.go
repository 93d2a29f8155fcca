package claim_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// waitPausedCommand waits until a client other than admin has a command
// waiting in its query buffer: the claim held by CLIENT PAUSE.
func waitPausedCommand(t *testing.T, admin *redis.Client) {
	t.Helper()
	pending := regexp.MustCompile(`qbuf=[1-9]`)
	testutil.Eventually(t, 2*time.Second, "a claim waits in CLIENT PAUSE", func() bool {
		list, err := admin.ClientList(context.Background()).Result()
		return err == nil && pending.MatchString(list)
	})
}

// TestBreakerStaysClosedWhenOneConnectionIsKilled: a Redis that answers
// closes one of the proxy's connections under a command (CLIENT KILL, as
// Sentinel sends to every instance it reconfigures, a client-output-buffer
// limit, an operator, a load balancer's reset). The server is reachable the
// whole time: a fresh connection is one dial away, and go-redis's own retry
// (MaxRetries) takes it. That is not an outage, so the claims that follow
// must go to Redis as usual, not fail with ErrStoreDown for the next probe
// interval (503s with FAIL_MODE=closed; with FAIL_MODE=open, keyed requests
// forwarded and executed without any guarantee while Redis is fine).
func TestBreakerStaysClosedWhenOneConnectionIsKilled(t *testing.T) {
	srv := redistest.Start(t)
	s, b, _ := breakerClient(t, srv, 2*time.Second)
	if _, errs := acquireAll(s, 2, "warm"); errors.Join(errs...) != nil {
		t.Fatalf("claims while Redis answers: %v", errors.Join(errs...))
	}

	// One claim in flight on a connection that the server then closes: the
	// pause holds the claim's script (a write) until the kill.
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	inflight := make(chan error, 1)
	go func() {
		_, _, err := s.Acquire(ctx, claim.NewKey(nil, "in-flight"), claim.Fingerprint{},
			claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		inflight <- err
	}()
	waitPausedCommand(t, admin)
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	err := <-inflight
	t.Logf("the claim whose connection was killed: %v", err)

	// Redis answers; nothing is down.
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis does not answer: %v", err)
	}
	_, errs := acquireAll(s, 4, "after-kill")
	if err := errors.Join(errs...); err != nil {
		t.Errorf("claims right after one killed connection, Redis answering: %v (Breaker open: %v)", err, b.Open())
	}
}

// killOneConnection has Redis close the connection of one claim in flight
// (CLIENT PAUSE holds the claim's script, CLIENT KILL closes it), while Redis
// itself goes on answering.
func killOneConnection(t *testing.T, srv *redistest.Server, s *claim.Store) {
	t.Helper()
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	inflight := make(chan struct{})
	go func() {
		defer close(inflight)
		_, _, _ = s.Acquire(ctx, claim.NewKey(nil, "victim-of-the-kill"), claim.Fingerprint{},
			claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	}()
	waitPausedCommand(t, admin)
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	<-inflight
}

// TestReleaseAfterOneKilledConnectionFreesTheKey: a request whose upstream
// answered 5xx (or, on a derived-key route, 401/403) releases its claim so
// that the retry executes. If Redis has just closed one connection under
// another command, Redis still answers, and the release must still happen:
// Release tries twice back to back, so a Breaker opened by that one
// connection fails both attempts at once and the key stays in flight for
// its lock TTL (the sender's retries get 409), or with ON_UNKNOWN=hold
// becomes "unknown" for the key's TTL, until an operator purges it.
func TestReleaseAfterOneKilledConnectionFreesTheKey(t *testing.T) {
	srv := redistest.Start(t)
	s, _, _ := breakerClient(t, srv, 2*time.Second)
	ctx := context.Background()
	k := claim.NewKey(nil, "answered-5xx")
	lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	killOneConnection(t, srv, s)
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release with Redis answering, after one killed connection: %v", err)
	}
	if _, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Errorf("the retry of a released request: %v, want it claimed again", err)
	}
}
