package claim_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

func recordKey(prefix string, k claim.Key) string { return prefix + "{" + k.String() + "}" }

// watchConfirmed runs s.WatchPurges until ctx ends and returns once the watch
// has verified its subscription (its own probe came back), which it reports
// as nil: only then does the cache serve. (Redis counting the subscriber
// comes earlier; waiting for that alone left the first replays uncached now
// and then.) The channel gets WatchPurges' error.
func watchConfirmed(t *testing.T, ctx context.Context, s *claim.Store, rdb redis.UniversalClient) <-chan error {
	t.Helper()
	confirmed := make(chan error, 4)
	done := make(chan error, 1)
	go func() {
		done <- s.WatchPurges(ctx, rdb, func(err error) {
			select {
			case confirmed <- err:
			default:
			}
		})
	}()
	select {
	case err := <-confirmed:
		if err != nil {
			t.Fatalf("WatchPurges reported %v, want the confirmation (nil)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no confirmation from WatchPurges within 10s")
	}
	return done
}

func TestParseKeyHash(t *testing.T) {
	k := claim.NewKey([]string{"s"}, "k")
	for _, s := range []string{k.String(), fmt.Sprintf("%X", k[:])} {
		if got, err := claim.ParseKeyHash(s); err != nil || got != k {
			t.Errorf("ParseKeyHash(%q) = %v, %v; want %v", s, got, err, k)
		}
	}
	for _, s := range []string{"", k.String()[:16], k.String() + "0", "g" + k.String()[1:]} {
		if _, err := claim.ParseKeyHash(s); err == nil {
			t.Errorf("ParseKeyHash(%q): no error", s)
		}
	}
}

// TestInspectorGet reads each kind of record: completed (with and without a
// stored body), in flight, unknown (written as the format says), missing,
// and one that does not decode.
func TestInspectorGet(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")

	done := claim.NewKey([]string{"a"}, "done")
	lease, _, err := s.Acquire(ctx, done, fp("f1"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec := &claim.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	if err := lease.Complete(ctx, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	e, err := in.Get(ctx, done)
	if err != nil {
		t.Fatalf("Get completed: %v", err)
	}
	if e.State != claim.StateCompleted || e.Status != 201 || string(e.Record.Body) != `{"id":1}` || e.TTL <= 0 || e.TTL > time.Hour {
		t.Errorf("completed: got state %s status %d body %q ttl %v", e.State, e.Status, e.Record.Body, e.TTL)
	}
	if want := fp("f1"); string(e.Fingerprint) != string(want[:]) {
		t.Errorf("fingerprint %x, want %x", e.Fingerprint, want)
	}

	inflight := claim.NewKey(nil, "inflight")
	if _, _, err := s.Acquire(ctx, inflight, fp("f2"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	e, err = in.Get(ctx, inflight)
	if err != nil || e.State != claim.StateInFlight || e.Status != 0 || e.ClaimedAt.IsZero() || e.Record != nil {
		t.Errorf("in flight: got %+v, %v", e, err)
	}
	if d := time.Since(e.ClaimedAt); d < -time.Second || d > 10*time.Second {
		t.Errorf("claimed_at %v is not about now", e.ClaimedAt)
	}

	unknown := claim.NewKey(nil, "unknown")
	now := time.Now().UnixMilli()
	rdb.HSet(ctx, recordKey("t:", unknown), "st", "u", "tok", "0123456789abcdef", "fp", string(make([]byte, 32)),
		"at", strconv.FormatInt(now-30000, 10), "ct", strconv.FormatInt(now, 10), "up", "", "rec", "504")
	rdb.PExpire(ctx, recordKey("t:", unknown), time.Hour)
	e, err = in.Get(ctx, unknown)
	if err != nil || e.State != claim.StateUnknown || e.Status != 504 || e.CompletedAt.UnixMilli() != now || e.ClaimedAt.UnixMilli() != now-30000 {
		t.Errorf("unknown: got %+v, %v", e, err)
	}

	// The oldest fields only: an unknown record without its status, an
	// in-flight one without its claim time.
	sparse := claim.NewKey(nil, "sparse")
	rdb.HSet(ctx, recordKey("t:", sparse), "st", "u")
	if e, err := in.Get(ctx, sparse); err != nil || e.State != claim.StateUnknown || e.Status != 0 || !e.ClaimedAt.IsZero() || e.TTL != -1 {
		t.Errorf("sparse unknown: got %+v, %v", e, err)
	}
	rdb.HSet(ctx, recordKey("t:", sparse), "st", "i")
	if e, err := in.Get(ctx, sparse); err != nil || e.State != claim.StateInFlight || !e.ClaimedAt.IsZero() {
		t.Errorf("sparse in flight: got %+v, %v", e, err)
	}

	if _, err := in.Get(ctx, claim.NewKey(nil, "never")); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("missing: got %v, want ErrNotFound", err)
	}

	bad := claim.NewKey(nil, "bad")
	rdb.HSet(ctx, recordKey("t:", bad), "st", "c", "rec", "garbage")
	if _, err := in.Get(ctx, bad); !errors.Is(err, claim.ErrBadRecord) {
		t.Errorf("bad record: got %v, want ErrBadRecord", err)
	}
}

// TestInspectorListAndPurge: List walks records only (not claim marks nor
// foreign keys), Purge deletes the record (not an old mark), and reports a
// second purge as nothing there.
func TestInspectorListAndPurge(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "t:", nil)
	in := claim.NewInspector(rdb, "t:")
	want := map[claim.Key]claim.State{}
	for i := range 30 {
		k := claim.NewKey(nil, fmt.Sprint("k", i))
		lease, _, err := s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		want[k] = claim.StateInFlight
		if i%3 == 0 {
			if err := lease.Complete(ctx, &claim.Record{Status: 200 + i}, time.Hour); err != nil {
				t.Fatal(err)
			}
			want[k] = claim.StateCompleted
		}
	}
	rdb.Set(ctx, "t:{"+hex.EncodeToString(make([]byte, 32))+"}", "a string, not a record", 0)
	rdb.Set(ctx, "other:{x}", "not ours", 0)
	got := map[claim.Key]claim.State{}
	err := in.List(ctx, 7, func(e *claim.Entry, k claim.Key, err error) bool {
		if err != nil {
			t.Errorf("List %s: %v", k, err)
			return true
		}
		if e.State == claim.StateCompleted && e.Status < 200 {
			t.Errorf("List %s: completed with status %d", k, e.Status)
		}
		got[k] = e.State
		return true
	})
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List: got %d records (%v), want %d", len(got), err, len(want))
	}
	n := 0
	_ = in.List(ctx, 7, func(*claim.Entry, claim.Key, error) bool { n++; return n < 5 })
	if n != 5 {
		t.Errorf("List stopped after %d records, want 5", n)
	}

	k := claim.NewKey(nil, "k1") // in flight; and a claim mark, as versions before 2026-11-23 wrote (read by nothing)
	if err := rdb.Set(ctx, recordKey("t:", k)+":m", "1700000000000", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if c, _ := rdb.Exists(ctx, recordKey("t:", k), recordKey("t:", k)+":m").Result(); c != 2 {
		t.Fatalf("before purge: %d of record and mark exist, want 2", c)
	}
	if ok, err := in.Purge(ctx, k); !ok || err != nil {
		t.Errorf("Purge: %v, %v; want true", ok, err)
	}
	if c, _ := rdb.Exists(ctx, recordKey("t:", k)).Result(); c != 0 {
		t.Errorf("after purge: the record is left")
	}
	if c, _ := rdb.Exists(ctx, recordKey("t:", k)+":m").Result(); c != 1 {
		t.Errorf("after purge: the old mark is gone; want it left alone (Purge names one key, as a resharding needs)")
	}
	if ok, err := in.Purge(ctx, k); ok || err != nil {
		t.Errorf("second Purge: %v, %v; want false, nil", ok, err)
	}
	if _, _, err := s.Acquire(ctx, k, fp("other"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Errorf("Acquire after purge (another fingerprint): %v, want a fresh claim", err)
	}
}

// TestWatchPurges: a store that watches purges stops replaying a purged
// record from its replay cache within a second; one that does not keeps
// replaying it from memory (which is what the watch is for).
func TestWatchPurges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx, cancel := context.WithCancel(context.Background())
	var hits [2]int
	stores := make([]*claim.Store, 2)
	for i := range stores {
		stores[i] = claim.NewStore(rdb, "t:", func(e claim.Event) {
			if e.Op == claim.OpCacheHit {
				hits[i]++
			}
		}, claim.ReplayCache(1<<20, time.Hour))
	}
	done := watchConfirmed(t, ctx, stores[0], rdb) // stores[1] does not watch

	k := claim.NewKey(nil, "cached")
	lease, _, err := stores[0].Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, s := range stores {
		for range 2 { // the first replay fills the cache, the second hits it
			if _, rec, err := s.Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); rec == nil || err != nil {
				t.Fatalf("store %d: replay: %v %v", i, rec, err)
			}
		}
		if hits[i] != 1 {
			t.Fatalf("store %d: %d cache hits, want 1", i, hits[i])
		}
	}
	if ok, err := claim.NewInspector(rdb, "t:").Purge(ctx, k); !ok || err != nil {
		t.Fatalf("Purge: %v %v", ok, err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		lease, rec, err := stores[0].Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if lease != nil {
			break // executed again: the cache forgot it
		}
		if rec == nil || time.Now().After(deadline) {
			t.Fatalf("the watching store still replays the purged record after 1s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The other store never heard of the purge: its memory still replays.
	if _, rec, err := stores[1].Acquire(ctx, k, fp("f"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); rec == nil || err != nil || hits[1] != 2 {
		t.Errorf("the store without WatchPurges: rec %v err %v hits %d; want a replay from its cache", rec, err, hits[1])
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("WatchPurges: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("WatchPurges did not return after its context ended")
	}
}

// TestWatchPurgesWithoutCache: without a replay cache it subscribes to
// nothing and returns at once.
func TestWatchPurgesWithoutCache(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := claim.NewStore(rdb, "t:", nil)
	if err := s.WatchPurges(context.Background(), rdb, nil); err != nil {
		t.Errorf("WatchPurges: %v", err)
	}
	if n, _ := rdb.PubSubNumSub(context.Background(), claim.PurgeChannel("t:")).Result(); n[claim.PurgeChannel("t:")] != 0 {
		t.Errorf("%d subscribers, want none", n[claim.PurgeChannel("t:")])
	}
}

var _ claim.Subscriber = (*redis.ClusterClient)(nil)

// TestCacheAfterSubscribedWaitsForTheWatch: with CacheAfterSubscribed the
// replay cache serves nothing until WatchPurges holds a confirmed
// subscription (a purge could not reach it before), then serves as usual.
func TestCacheAfterSubscribedWaitsForTheWatch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hits atomic.Int64
	s := claim.NewStore(rdb, "t:", func(e claim.Event) {
		if e.Op == claim.OpCacheHit {
			hits.Add(1)
		}
	}, claim.ReplayCache(1<<20, time.Hour), claim.CacheAfterSubscribed())
	k := claim.NewKey(nil, "gated")
	terms := watchTerms
	completed(t, s, k)
	replay := func() {
		t.Helper()
		if _, rec, err := s.Acquire(ctx, k, fp("f"), terms); rec == nil || err != nil {
			t.Fatalf("replay: %v %v", rec, err)
		}
	}
	for range 3 {
		replay()
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("before WatchPurges: %d cache hits, want 0", n)
	}
	done := watchConfirmed(t, ctx, s, rdb)
	for range 3 {
		replay()
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("subscribed: %d cache hits of 3 replays, want 2 (the first fills the cache)", n)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WatchPurges did not return after its context ended")
	}
}

// hookScripter runs after on the reply of every script, before
// the Store sees it: the moment between Redis answering "replay" and the
// Store caching that answer.
type hookScripter struct {
	*redis.Client
	mu    sync.Mutex
	after func(v any)
}

func (h *hookScripter) hook(cmd *redis.Cmd) *redis.Cmd {
	h.mu.Lock()
	f := h.after
	h.mu.Unlock()
	if f != nil && cmd.Err() == nil {
		f(cmd.Val())
	}
	return cmd
}

func (h *hookScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return h.hook(h.Client.EvalSha(ctx, sha, keys, args...))
}

func (h *hookScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return h.hook(h.Client.Eval(ctx, script, keys, args...))
}

// TestPurgeRacingReplayCachePut: a replay read from Redis just
// before a purge, and put into the replay cache just after the purge's
// announcement was handled, stays cached: the replica replays the purged
// record from memory for up to the cache's maximum age (a minute), not
// "within 1 s". The eviction must also cover puts whose Redis read
// started before it (a generation/epoch check in put).
func TestPurgeRacingReplayCachePut(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := &hookScripter{Client: rdb}
	s := claim.NewStore(hs, "t:", nil, claim.ReplayCache(1<<20, time.Minute))
	done := make(chan error, 1)
	go func() { done <- s.WatchPurges(ctx, rdb, nil) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("WatchPurges did not return")
		}
	}()
	ch := claim.PurgeChannel("t:")
	testutil.Eventually(t, 5*time.Second, "subscribed to "+ch, func() bool {
		n, _ := rdb.PubSubNumSub(ctx, ch).Result()
		return n[ch] == 1
	})
	fp := claim.Fingerprint(sha256.Sum256([]byte("f")))
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	k := claim.NewKey(nil, "raced")
	lease, _, err := s.Acquire(ctx, k, fp, terms)
	if err != nil || lease == nil {
		t.Fatalf("first Acquire: %v %v", lease, err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("first")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	hs.after = func(v any) {
		if arr, ok := v.([]any); ok && len(arr) > 0 && arr[0] == "replay" {
			once.Do(func() {
				// The operator purges now; the replica handles the
				// announcement (well within the contract's second) before
				// this replay's answer is cached.
				if ok, err := claim.NewInspector(rdb, "t:").Purge(context.Background(), k); !ok || err != nil {
					t.Errorf("Purge: %v %v", ok, err)
				}
				time.Sleep(300 * time.Millisecond)
			})
		}
	}
	if _, rec, err := s.Acquire(ctx, k, fp, terms); rec == nil || err != nil {
		t.Fatalf("replay read before the purge: %v %v", rec, err)
	}
	// 300 ms after the purge, and for the next 700 ms, the key must execute.
	lease, rec, err := s.Acquire(ctx, k, fp, terms)
	if err != nil || lease == nil {
		body := ""
		if rec != nil {
			body = string(rec.Body)
		}
		t.Fatalf("Acquire after keys purge: lease %v, replayed %q, err %v; want a fresh claim (the purged record is replayed from the cache for up to a minute)", lease, body, err)
	}
}

// TestListNonUTF8Prefix: KEY_PREFIX is any byte string (the
// config refuses only { and }); globEscape walks it rune by rune and
// WriteRune turns every invalid byte into U+FFFD, so SCAN's MATCH never
// matches: keys list prints nothing, exit 0, while get finds the record.
func TestListNonUTF8Prefix(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, prefix := range []string{"\xffidem:", "idem\xe9:"} { // a raw byte; Latin-1 é
		s := claim.NewStore(rdb, prefix, nil)
		k := claim.NewKey(nil, "listed"+prefix)
		lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201}, time.Hour); err != nil {
			t.Fatal(err)
		}
		in := claim.NewInspector(rdb, prefix)
		if _, err := in.Get(ctx, k); err != nil {
			t.Fatalf("Get under prefix %q: %v", prefix, err)
		}
		var listed []string
		if err := in.List(ctx, 100, func(e *claim.Entry, lk claim.Key, err error) bool {
			listed = append(listed, lk.String())
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(listed, ","), k.String()) {
			t.Errorf("List under KEY_PREFIX=%q: %d records %v; want the record %s that Get finds", prefix, len(listed), listed, k)
		}
	}
}

// TestListOnlyWhatGetAndPurgeReach: parseRecordKey accepts
// upper-case hex (ParseKeyHash takes either case), so a key such as
// t:{ABCD…} — never written by a proxy (RecordKey writes lower case), but
// present in a shared Redis — is listed under a key_hash whose get says
// "no record" and whose purge deletes nothing: the operator cannot act on
// a line keys list printed.
func TestListOnlyWhatGetAndPurgeReach(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	k := claim.NewKey(nil, "upper")
	upper := "t:{" + strings.ToUpper(k.String()) + "}"
	if err := rdb.HSet(ctx, upper, "st", "u", "fp", "x", "rec", "504").Err(); err != nil {
		t.Fatal(err)
	}
	in := claim.NewInspector(rdb, "t:")
	var listed []claim.Key
	if err := in.List(ctx, 100, func(e *claim.Entry, lk claim.Key, err error) bool {
		listed = append(listed, lk)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for _, lk := range listed {
		if _, err := in.Get(ctx, lk); err != nil {
			t.Errorf("List printed key_hash %s, but Get says: %v", lk, err)
		}
		if ok, err := in.Purge(ctx, lk); !ok || err != nil {
			t.Errorf("List printed key_hash %s, but Purge deletes nothing (%v, %v); %s stays", lk, ok, err, upper)
		}
	}
}
