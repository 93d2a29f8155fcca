package claim_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview70RefusedLargeWriteKeepsTheClaim: Redis does not roll back a
// script's earlier writes when a later command errors. SETRANGE checks
// offset+length against proto-max-bulk-len (its minimum is 1mb; the default
// MAX_STORED_RESPONSE_BYTES is 1 MiB), so an answer's encoding that Redis
// accepted as an argument can be refused as a value once the record's head
// is added. d4f17d9 deleted the in-flight claim before that SETRANGE: the
// key was then free, and the client's retry executed a second time. Now
// the refused SETRANGE is the script's first write: the claim stays in
// flight (409, then its lock's expiry, as for any completion Redis refuses).
func TestReview70RefusedLargeWriteKeepsTheClaim(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	s := claim.NewStore(rdb, "bulk70:", nil, claim.StringRecords(true))
	k := claim.NewKey(nil, "near proto-max-bulk-len")
	lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
	if err != nil || lease == nil {
		t.Fatalf("claim: %v, %v", lease, err)
	}
	if err := rdb.ConfigSet(ctx, "proto-max-bulk-len", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.ConfigSet(ctx, "proto-max-bulk-len", "512mb").Err() })
	// An answer whose encoding is 40 bytes under 1 MiB: a valid argument.
	rec := &claim.Record{Status: 201}
	for n := 1<<20 - 60; ; n++ {
		rec.Body = bytes.Repeat([]byte("p"), n)
		if len(rec.Encode()) >= 1<<20-40 {
			break
		}
	}
	cerr := lease.CompleteOnce(ctx, rec, time.Hour) // one attempt: the retries repeat it
	t.Logf("completion of a %d-byte encoding: %v", len(rec.Encode()), cerr)
	if err := rdb.ConfigSet(ctx, "proto-max-bulk-len", "512mb").Err(); err != nil {
		t.Fatal(err)
	}
	if cerr != nil {
		if n := rdb.Exists(ctx, claim.RecordKey("bulk70:", k)).Val(); n == 0 {
			t.Errorf("the completion failed (%v) and left no key at all: the in-flight claim was deleted", cerr)
		}
	}
	l2, got, err := s.Acquire(ctx, k, fp("A"), terms)
	t.Logf("the client's retry: lease %v, record %v, err %v", l2 != nil, got != nil, err)
	if l2 != nil {
		t.Errorf("the client's retry got a new lease (the request executes a second time); want it held (in flight) or replayed (record %v, err %v)", got != nil, err)
	}
}
