package claim_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

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

// TestMain runs the tests that call t.Parallel up to 8 at a time, not
// GOMAXPROCS (2 on the project's machines): they spend their time waiting
// on lock TTLs, upstream and read deadlines and probe periods, not on the
// CPU. The tests that measure the heap, count allocations or goroutines, or
// set GOMAXPROCS do not call t.Parallel, so they run before them, alone.
// An explicit -parallel wins.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}

func fp(s string) claim.Fingerprint {
	var f claim.Fingerprint
	copy(f[:], s)
	return f
}

func TestAcquireLifecycle(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// recordFields reads the record at key whole, in either form: a hash's
// fields, or a string record decoded here, independently of the scripts'
// codec ('R2', the lengths of st, tok, fp, up, at, ld, ct and tr in one byte
// each, those fields, then rec). Empty fields are left out, as the scripts read
// them. nil: no such key.
func recordFields(t *testing.T, rdb redis.Cmdable, key string) map[string]string {
	t.Helper()
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		t.Fatalf("TYPE %s: %v", key, err)
	}
	out := map[string]string{}
	switch typ {
	case "none":
		return nil
	case "hash":
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		for f, v := range h {
			if v != "" {
				out[f] = v
			}
		}
		return out
	case "string":
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		f, ok := decodeStringRecord(v)
		if !ok {
			t.Fatalf("%s: %q is not a string record", key, v)
		}
		return f
	}
	t.Fatalf("%s is a Redis %s, not a record", key, typ)
	return nil
}

func decodeStringRecord(v string) (map[string]string, bool) {
	if len(v) < 10 || v[:2] != "R2" {
		return nil, false
	}
	out, p := map[string]string{}, 10
	for i, f := range []string{"st", "tok", "fp", "up", "at", "ld", "ct", "tr"} {
		n := int(v[2+i])
		if p+n > len(v) {
			return nil, false
		}
		if n > 0 {
			out[f] = v[p : p+n]
		}
		p += n
	}
	if p < len(v) {
		out["rec"] = v[p:]
	}
	return out, true
}

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
	t.Parallel()
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
			// Unknown for the key's TTL: asked of Redis, which no stall blurs.
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestMaxReplay: a completed record larger than Terms.MaxReplay is not sent
// with the claim's reply, only its size (Redis's output shows it); read
// again with a bound of that size it comes whole. Both record formats.
func TestMaxReplay(t *testing.T) {
	t.Parallel()
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

// TestWaitReplicas: with WaitReplicas, claims and completions are
// acknowledged by a replica; with the replica gone, a claim is refused
// (ErrNotReplicated) and released rather than left in flight.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.Start(t, "replicaof 127.0.0.1 "+strconv.Itoa(master.Port()))
	mc, rc := master.Client(), replica.Client()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Synced on the replica's side, and online (acknowledging) on the master's.
		info, err := rc.Info(ctx, "replication").Result()
		minfo, merr := mc.Info(ctx, "replication").Result()
		if err == nil && merr == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(minfo, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not sync within 10s: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}

	s := claim.NewStore(mc, "test:", nil, claim.WaitReplicas(1, 3*time.Second))
	key := claim.NewKey(nil, "replicated")
	lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatalf("Acquire with a live replica: %v", err)
	}
	// The claim is on the replica the moment Acquire returns.
	if n, err := rc.Exists(ctx, "test:{"+hexKey(key)+"}").Result(); err != nil || n != 1 {
		t.Errorf("replica has the claim: %d, %v; want 1", n, err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201}, time.Hour); err != nil {
		t.Fatalf("Complete with a live replica: %v", err)
	}
	if st := recordFields(t, rc, "test:{"+hexKey(key)+"}")["st"]; st != "c" {
		t.Errorf("replica's record state %q; want c", st)
	}

	// NOSCRIPT goes through the pipelined path too.
	if err := mc.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Acquire(ctx, claim.NewKey(nil, "after-flush"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
	}

	replica.Kill()
	s = claim.NewStore(mc, "test:", nil, claim.WaitReplicas(1, 500*time.Millisecond))
	start := time.Now()
	lone := claim.NewKey(nil, "unreplicated")
	_, _, err = s.Acquire(ctx, lone, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if !errors.Is(err, claim.ErrNotReplicated) {
		t.Fatalf("Acquire without replica: got %v, want ErrNotReplicated", err)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("gave up after %v, before the 500ms WAIT timeout", took)
	}
	// Released, not left in flight: a store without WaitReplicas claims it.
	if lease, _, err := claim.NewStore(mc, "test:", nil).Acquire(ctx, lone, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || lease == nil {
		t.Errorf("after ErrNotReplicated: got %v, %v; want the key free", lease, err)
	}
}

func hexKey(k claim.Key) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 0, 2*len(k))
	for _, c := range k {
		b = append(b, digits[c>>4], digits[c&15])
	}
	return string(b)
}

// The execution's trace is stored beside the record (field tr) and comes
// back with every replay, from Redis and from the replay cache; without a
// trace nothing is written. With Tracing, each script run is a child span of
// the caller's.
func TestRecordTrace(t *testing.T) {
	t.Parallel()
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			s := claim.NewStore(be.rdb, "trace:"+be.name+":", nil, claim.ReplayCache(1<<20, time.Minute), claim.Tracing(tp))
			terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
			for i, want := range []string{tr, ""} {
				key := claim.NewKey(nil, "k"+string(rune('0'+i)))
				parent, span := tp.Tracer("test").Start(ctx, "request")
				lease, _, err := s.Acquire(parent, key, claim.Fingerprint{1}, terms)
				if err != nil {
					t.Fatal(err)
				}
				if err := lease.Complete(parent, &claim.Record{Status: 201, Trace: want}, time.Hour); err != nil {
					t.Fatal(err)
				}
				span.End()
				got, ok := recordFields(t, be.rdb, claim.RecordKey("trace:"+be.name+":", key))["tr"]
				if want == "" && ok {
					t.Errorf("field tr: got %q, want none written", got)
				}
				if want != "" && got != want {
					t.Errorf("field tr: got %q, want %q", got, want)
				}
				for j, from := range []string{"Redis", "the replay cache"} {
					_, r, err := s.Acquire(ctx, key, claim.Fingerprint{1}, terms)
					if err != nil || r == nil || r.Trace != want {
						t.Fatalf("replay %d (from %s): got %+v, %v; want Trace %q", j, from, r, err, want)
					}
				}
			}
			var claims, completes int
			for _, sp := range rec.Ended() {
				attrs := attribute.NewSet(sp.Attributes()...)
				switch sp.Name() {
				case "redis claim":
					claims++
				case "redis complete":
					completes++
					if !sp.Parent().IsValid() {
						t.Errorf("redis complete: no parent; want the caller's span")
					}
					if v, _ := attrs.Value("idempotency.script.result"); v.AsString() != "ok" {
						t.Errorf("redis complete result: got %q, want ok", v.AsString())
					}
				}
				if v, _ := attrs.Value("db.system.name"); sp.Name() != "request" && v.AsString() != "redis" {
					t.Errorf("%s: db.system.name %q, want redis", sp.Name(), v.AsString())
				}
			}
			// Two claims, two replays from Redis; the cached replays run no script.
			if claims != 4 || completes != 2 {
				t.Errorf("spans: got %d redis claim and %d redis complete, want 4 and 2", claims, completes)
			}
		})
	}
}

// oldClaimLua is scripts/claim.lua as of 632c74b, the version before the
// lock deadline moved into the record: what a replica not yet upgraded
// runs during a rolling upgrade.
const oldClaimLua = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'rec', 'tok', 'up')
if cur[1] then
  if cur[5] and cur[5] ~= '' and ARGV[5] ~= '' and cur[5] ~= ARGV[5] then
    return {'otherupstream'}
  end
  if cur[2] ~= ARGV[2] then
    return {'mismatch'}
  end
  if cur[1] == 'c' then
    return {'replay', cur[3], tostring(redis.call('PTTL', KEYS[1]))}
  end
  if cur[4] == ARGV[1] then
    return {'claimed'}
  end
  return {'inflight'}
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local prev = redis.call('GET', KEYS[2])
redis.call('HSET', KEYS[1], 'st', 'i', 'tok', ARGV[1], 'fp', ARGV[2], 'at', now, 'up', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], now, 'PX', ARGV[4])
if prev then
  return {'takeover', string.format('%d', tonumber(now) - tonumber(prev))}
end
return {'claimed'}
`

// oldClaim claims key as a replica of the previous version does: an
// in-flight record that expires with its lock (PEXPIRE), and a ":m" claim
// mark that remembers the claim for the key's TTL.
func oldClaim(t *testing.T, be backend, key claim.Key, f claim.Fingerprint, lock, ttl time.Duration) {
	t.Helper()
	rec := claim.RecordKey("test:", key)
	v, err := redis.NewScript(oldClaimLua).Run(ctx, be.rdb, []string{rec, rec + ":m"},
		"old-replica-token", f[:], lock.Milliseconds(), ttl.Milliseconds(), "").StringSlice()
	if err != nil || len(v) == 0 || v[0] != "claimed" {
		t.Fatalf("old claim.lua: %v %v", v, err)
	}
}

// TestOldVersionClaimAfterMarkDropped: a replica of a version before
// 2026-11-23 claimed a key and died mid-request. Its record expires with its
// lock, and its ":m" claim mark, which versions from 2026-11-23 to 2026-11
// read for one release, is no longer read (README, "Upgrading and rolling
// back": upgrade from those versions through one that reads it). While its
// lock lives the key is in flight, with either ON_UNKNOWN; after it, the
// next request claims the key as a new one (no takeover, not held as
// unknown), and the mark is left as it was, to expire with its TTL.
func TestOldVersionClaimAfterMarkDropped(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		for _, hold := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/hold=%v", be.name, hold), func(t *testing.T) {
				s := claim.NewStore(be.rdb, "test:", nil)
				key := claim.NewKey(nil, fmt.Sprintf("old-inflight-%v", hold))
				rec := claim.RecordKey("test:", key)
				// A lock long enough that a stalled test goroutine still finds it running.
				terms := claim.Terms{LockTTL: time.Second, TTL: time.Hour, Hold: hold}
				oldClaim(t, be, key, fp("A"), terms.LockTTL, terms.TTL)
				if _, _, err := s.Acquire(ctx, key, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
					t.Fatalf("within the old claim's lock: %v, want ErrInFlight", err)
				}
				mark := be.rdb.Get(ctx, rec+":m").Val()
				be.advance(t, terms.LockTTL+250*time.Millisecond) // past the old lock: its record is gone, its mark is not
				lease, _, err := s.Acquire(ctx, key, fp("A"), terms)
				if err != nil || lease == nil || lease.TakenOver {
					t.Fatalf("after the old claim's lock: lease %v, err %v; want a new claim (the mark is not read)", lease, err)
				}
				if got := be.rdb.Get(ctx, rec+":m").Val(); got != mark || mark == "" {
					t.Errorf("the old mark: %q after the claim, %q before; want it left as it was", got, mark)
				}
			})
		}
	}
}
