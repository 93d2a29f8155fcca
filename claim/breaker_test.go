package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"regexp"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// guarded returns a client of srv guarded by a Breaker, whose probe goes
// through a client of its own, as the proxy sets them up.
func guarded(t *testing.T, srv *redistest.Server, readTimeout time.Duration, notify func(bool, error)) (*redis.Client, *claim.Breaker) {
	t.Helper()
	opt := &redis.Options{Addr: srv.Addr(), ReadTimeout: readTimeout, WriteTimeout: readTimeout,
		DialTimeout: readTimeout, MaxRetries: 1, DialerRetries: 1}
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
	b := claim.NewBreaker(func(ctx context.Context) error { return probe.Ping(ctx).Err() }, 50*time.Millisecond, 200*time.Millisecond, notify)
	opt.Limiter = b
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { b.Close(); _ = rdb.Close(); _ = probe.Close() })
	return rdb, b
}

// breakerClient is what the proxy runs against a standalone Redis: a
// guarded client and its autopipeliner, whose scripts a Store runs.
func breakerClient(t *testing.T, srv *redistest.Server, readTimeout time.Duration) (*claim.Store, *claim.Breaker, *atomic.Int32) {
	t.Helper()
	var changes atomic.Int32
	rdb, b := guarded(t, srv, readTimeout, func(bool, error) { changes.Add(1) })
	ap, err := rdb.AutoPipelineWithOptions(claim.AutoPipelineOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	return claim.NewStore(ap, "idem:", nil), b, &changes
}

// acquireAll claims n new keys at once and returns how long the slowest
// took and the errors.
func acquireAll(s *claim.Store, n int, tag string) (time.Duration, []error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.Acquire(context.Background(), claim.NewKey(nil, fmt.Sprint(tag, i)), claim.Fingerprint{},
				claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		}()
	}
	wg.Wait()
	return time.Since(start), errs
}

// TestBreakerFailsFastWhileRedisStalls: a Redis that stops answering (a
// partition: connections stay open, nothing comes back) makes the first
// claims wait out one read timeout; from then on every claim fails at once
// as unavailable, and claims go back to Redis once it answers a probe.
// Without the Breaker, claims queued behind the autopipeliner's one
// ordered batch stream waited out a read timeout per batch, one after the
// other: tens of seconds for a 503 or a fail-open forward.
func TestBreakerFailsFastWhileRedisStalls(t *testing.T) {
	srv := redistest.Start(t)
	const readTimeout = time.Second
	s, b, changes := breakerClient(t, srv, readTimeout)
	if _, errs := acquireAll(s, 4, "up"); errors.Join(errs...) != nil {
		t.Fatalf("claims while Redis answers: %v", errors.Join(errs...))
	}

	srv.Pause()
	took, errs := acquireAll(s, 50, "stalled")
	for _, err := range errs {
		if err == nil || !claim.Unavailable(err) {
			t.Fatalf("claim against a stalled Redis: %v, want an unavailable error", err)
		}
	}
	// The read timeout, once for the batch under way and once for the one
	// queued behind it at most, plus the retry the Breaker cuts short.
	if took > 3*readTimeout {
		t.Errorf("50 claims against a stalled Redis took %v to fail, want about one read timeout (%v)", took, readTimeout)
	}
	testutil.Eventually(t, 5*time.Second, "the Breaker opens once its probe times out too", b.Open)
	took, errs = acquireAll(s, 50, "known-down")
	if took > readTimeout/2 {
		t.Errorf("claims while the Breaker is open took %v, want at once, far below a read timeout (%v)", took, readTimeout)
	}
	for _, err := range errs {
		if !errors.Is(err, claim.ErrStoreDown) || !claim.Unavailable(err) {
			t.Fatalf("claim while the Breaker is open: %v, want ErrStoreDown (unavailable)", err)
		}
	}

	srv.Resume()
	testutil.Eventually(t, 5*time.Second, "the Breaker closes once Redis answers", func() bool { return !b.Open() })
	if _, errs := acquireAll(s, 4, "back"); errors.Join(errs...) != nil {
		t.Errorf("claims after Redis came back: %v", errors.Join(errs...))
	}
	if n := changes.Load(); n != 2 {
		t.Errorf("%d state changes told, want 2 (open, then closed)", n)
	}
}

// TestBreakerOpensOnRefusedConnections: a Redis that is gone (connections
// refused) opens the Breaker too, and it closes when Redis is back.
func TestBreakerOpensOnRefusedConnections(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, b, _ := breakerClient(t, srv, time.Second)
	srv.Kill()
	if _, errs := acquireAll(s, 3, "gone"); !claim.Unavailable(errs[0]) {
		t.Fatalf("claim against a killed Redis: %v", errs[0])
	}
	testutil.Eventually(t, 5*time.Second, "the Breaker opens once its probe is refused too", b.Open)
	srv.Restart()
	testutil.Eventually(t, 5*time.Second, "the Breaker closes once Redis is back", func() bool { return !b.Open() })
	if _, errs := acquireAll(s, 3, "restarted"); errors.Join(errs...) != nil {
		t.Errorf("claims after a restart: %v", errors.Join(errs...))
	}
}

// TestBreakerIgnoresAnswersAndCallers: an error reply of the server came
// back at once and is no outage, nor is a caller that gave up: neither
// opens the Breaker.
func TestBreakerIgnoresAnswersAndCallers(t *testing.T) {
	srv := redistest.Start(t)
	rdb, b := guarded(t, srv, time.Second, nil)
	ctx := context.Background()
	if err := rdb.Do(ctx, "NOSUCHCOMMAND").Err(); err == nil {
		t.Fatal("an unknown command succeeded")
	}
	if err := rdb.Eval(ctx, "return redis.error_reply('LOADING Redis is loading')", nil).Err(); err == nil {
		t.Fatal("the error reply was lost")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_ = rdb.Get(cctx, "x").Err()
	if b.Open() {
		t.Fatal("Breaker opened on an error reply or a cancelled caller")
	}
	if err := rdb.Set(ctx, "x", "1", 0).Err(); err != nil {
		t.Errorf("command after them: %v", err)
	}
}

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
