package claim_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// backend is a Redis the store tests run against, with a way to let time pass.
type backend struct {
	name    string
	rdb     *redis.Client
	advance func(t *testing.T, d time.Duration)
}

// backends returns miniredis (fast, virtual clock) and a real redis-server
// (the semantics that matter: Lua, PX expiry, NOSCRIPT).
func backends(t *testing.T) []backend {
	mr := miniredis.RunT(t)
	mrc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = mrc.Close() })
	srv := redistest.Start(t)
	// FastForward expires keys; TIME (used for takeover age) follows SetTime.
	virt := time.Now()
	mr.SetTime(virt)
	return []backend{
		{"miniredis", mrc, func(_ *testing.T, d time.Duration) {
			virt = virt.Add(d)
			mr.SetTime(virt)
			mr.FastForward(d)
		}},
		{"redis-server", srv.Client(), func(_ *testing.T, d time.Duration) { time.Sleep(d) }},
	}
}

var ctx = context.Background()

func fp(s string) claim.Fingerprint {
	var f claim.Fingerprint
	copy(f[:], s)
	return f
}

func TestAcquireLifecycle(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey([]string{"Bearer a"}, "k1")

			lease, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease == nil || rec != nil {
				t.Fatalf("first Acquire = %v, %v, %v; want a lease", lease, rec, err)
			}
			if lease.TakenOver {
				t.Errorf("fresh claim reported as takeover")
			}
			if _, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrInFlight) {
				t.Errorf("duplicate while in flight: got %v, want ErrInFlight", err)
			}
			if _, _, err := s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("other fingerprint while in flight: got %v, want ErrMismatch", err)
			}

			body := []byte{0, 1, 2, 0xff, '\r', '\n', 0}
			want := &claim.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body}
			if err := lease.Complete(ctx, want, time.Hour); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			_, got, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || got == nil {
				t.Fatalf("Acquire after completion = %v, %v; want a record", got, err)
			}
			if got.Status != 201 || !bytes.Equal(got.Body, body) || got.Header["Content-Type"][0] != "application/octet-stream" {
				t.Errorf("got %+v, want %+v", got, want)
			}
			if _, _, err := s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("other fingerprint after completion: got %v, want ErrMismatch", err)
			}
			// Completing again with the same lease is a no-op success (a
			// client resending the script after a lost reply); releasing a
			// completed claim is refused.
			if err := lease.Complete(ctx, &claim.Record{Status: 500}, time.Hour); err != nil {
				t.Errorf("second Complete: got %v, want nil", err)
			}
			if _, got, _ := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); got == nil || got.Status != 201 {
				t.Errorf("second Complete overwrote the record: %+v", got)
			}
			if err := lease.Release(ctx); !errors.Is(err, claim.ErrLost) {
				t.Errorf("Release after Complete: got %v, want ErrLost", err)
			}
		})
	}
}

func TestScopeSeparatesKeys(t *testing.T) {
	a := claim.NewKey([]string{"Bearer alice"}, "k")
	b := claim.NewKey([]string{"Bearer bob"}, "k")
	none := claim.NewKey([]string{""}, "k")
	split1 := claim.NewKey([]string{"ab", "c"}, "k")
	split2 := claim.NewKey([]string{"a", "bc"}, "k")
	noScope := claim.NewKey(nil, "k")
	if a == b || a == none || split1 == split2 || noScope == none {
		t.Fatalf("scopes collide: %v %v %v %v %v %v", a, b, none, split1, split2, noScope)
	}
	if claim.NewKey([]string{"Bearer alice"}, "k") != a {
		t.Fatalf("NewKey is not deterministic")
	}
}

func TestReleaseLetsRetryExecute(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "rel")
			lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			lease2, _, err := s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease2 == nil {
				t.Fatalf("Acquire after release = %v, %v; want a lease (even for another fingerprint)", lease2, err)
			}
			if lease2.TakenOver {
				t.Errorf("claim after an explicit release reported as takeover")
			}
		})
	}
}

// TestFencing: a claim whose lock expired and was taken over can neither
// overwrite nor release the record of the request that took over.
func TestFencing(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "fence")
			old, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			be.advance(t, 250*time.Millisecond) // Redis expires the lock (PX)

			taker, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || taker == nil {
				t.Fatalf("Acquire after lock expiry = %v, %v; want a lease", taker, err)
			}
			if !taker.TakenOver || taker.TakeoverAge < 100*time.Millisecond {
				t.Errorf("TakenOver=%v age=%v, want a takeover older than the 100ms lock", taker.TakenOver, taker.TakeoverAge)
			}
			if err := old.Release(ctx); !errors.Is(err, claim.ErrLost) {
				t.Errorf("stale Release: got %v, want ErrLost", err)
			}
			if err := old.Complete(ctx, &claim.Record{Status: 200, Body: []byte("stale")}, time.Hour); !errors.Is(err, claim.ErrLost) {
				t.Errorf("stale Complete: got %v, want ErrLost", err)
			}
			// The new owner is untouched: still in flight, then completes.
			if _, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrInFlight) {
				t.Errorf("after stale writes: got %v, want ErrInFlight", err)
			}
			if err := taker.Complete(ctx, &claim.Record{Status: 200, Body: []byte("fresh")}, time.Hour); err != nil {
				t.Fatalf("Complete by new owner: %v", err)
			}
			_, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || string(rec.Body) != "fresh" {
				t.Errorf("replay = %v, %v; want the new owner's record", rec, err)
			}
			// Even a stale Complete after the new owner completed must not overwrite.
			if err := old.Complete(ctx, &claim.Record{Status: 200, Body: []byte("stale")}, time.Hour); !errors.Is(err, claim.ErrLost) {
				t.Errorf("stale Complete after completion: got %v, want ErrLost", err)
			}
		})
	}
}

func TestRecordExpiresAfterTTL(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "ttl")
			lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Complete(ctx, &claim.Record{Status: 200}, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if _, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || rec == nil {
				t.Fatalf("before TTL: got %v, %v; want a record", rec, err)
			}
			be.advance(t, 400*time.Millisecond)
			lease, _, err = s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease == nil {
				t.Fatalf("after TTL: got %v, %v; want a fresh lease", lease, err)
			}
		})
	}
}

// TestNoScript: after SCRIPT FLUSH (a restarted or newly promoted Redis),
// EVALSHA answers NOSCRIPT and the store falls back to EVAL.
func TestNoScript(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	var calls []string
	var mu sync.Mutex
	s := claim.NewStore(rdb, "test:", func(ev claim.Event) {
		script, result := string(ev.Op), ev.Result
		mu.Lock()
		calls = append(calls, script+":"+result)
		mu.Unlock()
	})
	for i := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		key := claim.NewKey(nil, fmt.Sprint("noscript", i))
		lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 200}, time.Hour); err != nil {
			t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 6 || calls[0] != "claim:claimed" || calls[1] != "complete:ok" {
		t.Errorf("observed %v, want 3× claim:claimed, complete:ok", calls)
	}
}

// TestConcurrentAcquire: many clients racing on one key, one lease.
func TestConcurrentAcquire(t *testing.T) {
	srv := redistest.Start(t)
	const n = 50
	for round := range 5 {
		key := claim.NewKey(nil, fmt.Sprint("race", round))
		var leases, inflight atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			// Separate clients, separate connections: real concurrency at Redis.
			s := claim.NewStore(redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1}), "test:", nil)
			wg.Go(func() {
				<-start
				lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				switch {
				case err == nil && lease != nil:
					leases.Add(1)
				case errors.Is(err, claim.ErrInFlight):
					inflight.Add(1)
				default:
					t.Errorf("Acquire: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if leases.Load() != 1 || inflight.Load() != n-1 {
			t.Fatalf("round %d: %d leases, %d in flight; want 1 and %d", round, leases.Load(), inflight.Load(), n-1)
		}
	}
}

func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	s := claim.NewStore(srv.Client(), "test:", nil)
	srv.Kill()
	_, _, err := s.Acquire(ctx, claim.NewKey(nil, "down"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err == nil || errors.Is(err, claim.ErrInFlight) || errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("Acquire with Redis down: got %v, want a connection error", err)
	}
	srv.Restart()
	if _, _, err := s.Acquire(ctx, claim.NewKey(nil, "down"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
}

// TestKeysShareHashTag: the record key carries the key hash as its Cluster hash tag, and
// neither contains the raw key or scope.
func TestKeysShareHashTag(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	s := claim.NewStore(rdb, "pfx:", nil)
	if _, _, err := s.Acquire(ctx, claim.NewKey([]string{"Bearer secret-token"}, "my-raw-key"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	keys := mr.Keys()
	if len(keys) != 1 {
		t.Fatalf("keys %v, want one record", keys)
	}
	tag := func(k string) string {
		i, j := bytes.IndexByte([]byte(k), '{'), bytes.IndexByte([]byte(k), '}')
		if i < 0 || j < i {
			t.Fatalf("key %q has no hash tag", k)
		}
		return k[i : j+1]
	}
	if len(tag(keys[0])) != 66 {
		t.Errorf("key %q: want a hash tag of the 64-hex key hash", keys[0])
	}
	for _, k := range keys {
		if !bytes.HasPrefix([]byte(k), []byte("pfx:")) {
			t.Errorf("key %q lacks the prefix", k)
		}
		for _, secret := range []string{"my-raw-key", "secret-token"} {
			if bytes.Contains([]byte(k), []byte(secret)) {
				t.Errorf("key %q contains %q in clear", k, secret)
			}
			if v := fmt.Sprint(recordFields(t, rdb, k)); bytes.Contains([]byte(v), []byte(secret)) {
				t.Errorf("record %q contains %q in clear", k, secret)
			}
		}
	}
}

// TestAutoPipeline: the store on go-redis's automatic pipeliner (the
// default in idemproxy): one lease among racing claims, NOSCRIPT fallback
// inside a batch, and a prompt error when Redis is gone.
func TestAutoPipeline(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialerRetries: 1}) // as idemproxy sets them
	t.Cleanup(func() { _ = rdb.Close() })
	ap, err := rdb.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	s := claim.NewStore(ap, "test:", nil)
	for round := range 5 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		key := claim.NewKey(nil, fmt.Sprint("ap", round))
		var leases, inflight atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 50 {
			wg.Go(func() {
				<-start
				lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				switch {
				case err == nil && lease != nil:
					leases.Add(1)
					if err := lease.Complete(ctx, &claim.Record{Status: 200}, time.Hour); err != nil {
						t.Errorf("Complete: %v", err)
					}
				case errors.Is(err, claim.ErrInFlight):
					inflight.Add(1)
				case err == nil:
					// replayed: the winner completed already
				default:
					t.Errorf("Acquire: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if leases.Load() != 1 {
			t.Fatalf("round %d: %d leases, want 1", round, leases.Load())
		}
	}
	srv.Kill()
	began := time.Now()
	if _, _, err := s.Acquire(ctx, claim.NewKey(nil, "down"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err == nil {
		t.Fatalf("Acquire with Redis down succeeded")
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("Acquire with Redis down took %v", took)
	}
}

// TestCompleteAfterExpiry: a claim that expired with nobody taking over is
// recorded all the same (the upstream did execute), with the claim's
// fingerprint: the retry replays it, and another body is still a mismatch.
func TestCompleteAfterExpiry(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			var results []string
			s := claim.NewStore(be.rdb, "test:", func(ev claim.Event) {
				script, result := string(ev.Op), ev.Result
				if script == "complete" {
					results = append(results, result)
				}
			}, claim.Upstream("http://a"))
			key := claim.NewKey(nil, "expired")
			lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			be.advance(t, 250*time.Millisecond)
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("late")}, time.Hour); err != nil {
				t.Fatalf("Complete after expiry: %v, want the answer recorded", err)
			}
			if !lease.Recreated || len(results) != 1 || results[0] != "late" {
				t.Errorf("Recreated %v, observed %v; want true, [late]", lease.Recreated, results)
			}
			// A resend of the same completion (reply lost) is still ok.
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("late")}, time.Hour); err != nil {
				t.Errorf("resent Complete: %v", err)
			}
			if _, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || rec == nil || string(rec.Body) != "late" {
				t.Fatalf("retry after a recreated record: %v %v, want the replay", rec, err)
			}
			if _, _, err := s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("other fingerprint: %v, want ErrMismatch", err)
			}
			other := claim.NewStore(be.rdb, "test:", nil, claim.Upstream("http://b"))
			if _, _, err := other.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrOtherUpstream) {
				t.Errorf("other upstream: %v, want ErrOtherUpstream", err)
			}
		})
	}
}

// TestCompleteAfterTakeover: when the expired claim was taken over, the
// late completion writes nothing and reports ErrLost (the key ran twice).
func TestCompleteAfterTakeover(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "takenover")
			old, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			be.advance(t, 250*time.Millisecond)
			if _, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatalf("takeover: %v", err)
			}
			if err := old.Complete(ctx, &claim.Record{Status: 201}, time.Hour); !errors.Is(err, claim.ErrLost) || old.Recreated {
				t.Errorf("late Complete: %v (recreated %v), want ErrLost", err, old.Recreated)
			}
			if _, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrInFlight) {
				t.Errorf("after the late completion: %v, want the takeover still in flight", err)
			}
		})
	}
}

// TestUpstreamBinding: stores bound to different upstreams never replay or
// re-execute each other's keys; a store without an upstream (and a record
// written before the field existed) matches any.
func TestUpstreamBinding(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			a := claim.NewStore(be.rdb, "test:", nil, claim.Upstream("http://service-a"))
			b := claim.NewStore(be.rdb, "test:", nil, claim.Upstream("http://service-b"))
			key := claim.NewKey(nil, "shared")
			lease, _, err := a.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrOtherUpstream) || !errors.Is(err, claim.ErrMismatch) {
				t.Errorf("in flight, other upstream: %v, want ErrOtherUpstream", err)
			}
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("a")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, rec, err := b.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrOtherUpstream) || rec != nil {
				t.Errorf("completed, other upstream: %v %v, want ErrOtherUpstream and no record", rec, err)
			}
			if _, rec, err := a.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || string(rec.Body) != "a" {
				t.Errorf("same upstream: %v %v, want the replay", rec, err)
			}
			// A record without an upstream (an older version wrote it) is replayed.
			plain := claim.NewStore(be.rdb, "test:", nil)
			old := claim.NewKey(nil, "old")
			l2, _, err := plain.Acquire(ctx, old, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := l2.Complete(ctx, &claim.Record{Status: 200, Body: []byte("old")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, rec, err := b.Acquire(ctx, old, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || string(rec.Body) != "old" {
				t.Errorf("record without upstream: %v %v, want the replay", rec, err)
			}
		})
	}
}

// TestUnavailable: only an unreachable or failing-over Redis counts as an
// outage; a Redis that refuses (OOM) does not.
func TestUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	s := claim.NewStore(rdb, "test:", nil)
	_, _, err := s.Acquire(ctx, claim.NewKey(nil, "oom"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err == nil {
		t.Fatal("claim succeeded with maxmemory 1 byte")
	}
	if claim.Unavailable(err) {
		t.Errorf("OOM reply %v counted as unavailable", err)
	}
	srv.Kill()
	_, _, err = s.Acquire(ctx, claim.NewKey(nil, "down"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err == nil || !claim.Unavailable(err) {
		t.Errorf("Redis down: %v, want an unavailable error", err)
	}
	for _, e := range []error{claim.ErrInFlight, claim.ErrMismatch, claim.ErrBadRecord, nil} {
		if claim.Unavailable(e) {
			t.Errorf("Unavailable(%v) = true", e)
		}
	}
	if !claim.Unavailable(fmt.Errorf("claim: %w", claim.ErrNotReplicated)) {
		t.Errorf("ErrNotReplicated not counted as unavailable")
	}
}

// TestReplayCache: a replayed record is then answered from memory (even
// with Redis gone), mismatches are still refused, and nothing outlives the
// record's TTL in Redis.
func TestReplayCache(t *testing.T) {
	srv := redistest.Start(t)
	var hits atomic.Int64
	s := claim.NewStore(srv.Client(), "test:", func(ev claim.Event) {
		script, result := string(ev.Op), ev.Result
		if script == "cache" && result == "hit" {
			hits.Add(1)
		}
	}, claim.ReplayCache(1<<20, time.Minute))
	key := claim.NewKey(nil, "cached")
	lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("first")}, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || string(rec.Body) != "first" {
		t.Fatalf("replay from Redis: %v %v", rec, err)
	}
	srv.Kill()
	if _, rec, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || string(rec.Body) != "first" {
		t.Fatalf("replay from the cache with Redis down: %v %v", rec, err)
	}
	if _, _, err := s.Acquire(ctx, key, fp("B"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); !errors.Is(err, claim.ErrMismatch) {
		t.Errorf("other fingerprint from the cache: %v, want ErrMismatch", err)
	}
	if hits.Load() != 1 { // the replay; a mismatch is not a hit
		t.Errorf("cache hits %d, want 1", hits.Load())
	}
	srv.Restart()
	time.Sleep(500 * time.Millisecond) // past the record's 400ms TTL
	if lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || lease == nil {
		t.Errorf("after the TTL: %v %v, want a fresh claim (not a cached replay)", lease, err)
	}
}

// Key.String (key_hash of spans, errors and idemproxy keys): one allocation,
// the string's, and the same text as hex.EncodeToString.
func TestKeyStringAllocatesOnce(t *testing.T) {
	k := claim.NewKey([]string{"scope"}, "order-1")
	if got, want := k.String(), hex.EncodeToString(k[:]); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = k.String() }); n != 1 {
		t.Errorf("Key.String allocates %v times, want 1", n)
	}
}
