package claim_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

type review72Events struct {
	mu sync.Mutex
	ev []claim.Event
}

func (o *review72Events) Observe(e claim.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ev = append(o.ev, e)
}

// TestReview72BitopRefusedKeepsTheRecord: BITOP is the only command of the
// large-record write outside @string/@keyspace/@hash (it is @bitmap). A
// Redis user granted by data type (+@string +@hash +@keyspace +@scripting
// ...) is refused it after the two SETRANGE have written the record. As
// first written (ebd6177) the script then failed with NOPERM and kept those
// writes; Complete's retry found the record completed and answered ok, with
// the claim's TTL instead of the completion's and an error event. Now the
// refusal is ignored: the record is complete and replayed, with its TTL, at
// the size SETRANGE left (up to twice the answer: README "Redis version").
func TestReview72BitopRefusedKeepsTheRecord(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "idem", "on", ">pw", "~*", "&*", "resetchannels",
		"+@string", "+@hash", "+@keyspace", "+@scripting", "+@connection", "+time", "+wait", "+config|get").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "idem", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	obs := &review72Events{}
	s := claim.NewStore(rdb, "acl:", obs.Observe, claim.StringRecords(true))
	k := claim.NewKey(nil, "acl")
	key := claim.RecordKey("acl:", k)
	terms := claim.Terms{LockTTL: time.Minute, TTL: 2 * time.Hour}
	l, _, err := s.Acquire(ctx, k, fp("A"), terms)
	if err != nil || l == nil {
		t.Fatalf("claim: %v", err)
	}
	rec := &claim.Record{Status: 201, Body: bytes.Repeat([]byte("b"), 100<<10)}
	cerr := l.Complete(ctx, rec, time.Hour)
	ttl := admin.PTTL(ctx, key).Val()
	obs.mu.Lock()
	events := fmt.Sprint(obs.ev)
	obs.mu.Unlock()
	if cerr != nil || strings.Contains(events, "error") {
		t.Errorf("Complete: %v, events %s; want it recorded at the first attempt", cerr, events)
	}
	if ttl > time.Hour || ttl < 59*time.Minute {
		t.Errorf("the record expires in %v; want the completion's 1h", ttl)
	}
	if _, got, err := s.Acquire(ctx, k, fp("A"), terms); err != nil || got == nil || !bytes.Equal(got.Body, rec.Body) {
		t.Errorf("replay: %v, %v; want the recorded answer", got != nil, err)
	}
}
