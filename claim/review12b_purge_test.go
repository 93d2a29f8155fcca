package claim_test

// review12b: adversarial tests of the purge invalidation and of the
// Inspector (issue 12). Each test fails on the code under review.

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// review12bHookScripter runs after on the reply of every script, before
// the Store sees it: the moment between Redis answering "replay" and the
// Store caching that answer.
type review12bHookScripter struct {
	*redis.Client
	mu    sync.Mutex
	after func(v any)
}

func (h *review12bHookScripter) hook(cmd *redis.Cmd) *redis.Cmd {
	h.mu.Lock()
	f := h.after
	h.mu.Unlock()
	if f != nil && cmd.Err() == nil {
		f(cmd.Val())
	}
	return cmd
}

func (h *review12bHookScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return h.hook(h.Client.EvalSha(ctx, sha, keys, args...))
}

func (h *review12bHookScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return h.hook(h.Client.Eval(ctx, script, keys, args...))
}

// TestReview12bPurgeRacingReplayCachePut: a replay read from Redis just
// before a purge, and put into the replay cache just after the purge's
// announcement was handled, stays cached: the replica replays the purged
// record from memory for up to the cache's maximum age (a minute), not
// "within 1 s". The eviction must also cover puts whose Redis read
// started before it (a generation/epoch check in put).
func TestReview12bPurgeRacingReplayCachePut(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := &review12bHookScripter{Client: rdb}
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

// TestReview12bListNonUTF8Prefix: KEY_PREFIX is any byte string (the
// config refuses only { and }); globEscape walks it rune by rune and
// WriteRune turns every invalid byte into U+FFFD, so SCAN's MATCH never
// matches: keys list prints nothing, exit 0, while get finds the record.
func TestReview12bListNonUTF8Prefix(t *testing.T) {
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

// TestReview12bListOnlyWhatGetAndPurgeReach: parseRecordKey accepts
// upper-case hex (ParseKeyHash takes either case), so a key such as
// t:{ABCD…} — never written by a proxy (RecordKey writes lower case), but
// present in a shared Redis — is listed under a key_hash whose get says
// "no record" and whose purge deletes nothing: the operator cannot act on
// a line keys list printed.
func TestReview12bListOnlyWhatGetAndPurgeReach(t *testing.T) {
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
