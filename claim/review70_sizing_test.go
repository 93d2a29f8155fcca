package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// review70PerRecord writes n records of a body of size bytes (status 201,
// two headers, as the README's "Sizing" table says) through claim.Store
// with KEY_PREFIX idem: and returns INFO used_memory per record.
func review70PerRecord(t *testing.T, rdb *redis.Client, str bool, size, n int) float64 {
	t.Helper()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s := claim.NewStore(rdb, "idem:", nil, claim.StringRecords(str))
	rec := &claim.Record{Status: 201, Header: map[string][]string{
		"Content-Type": {"application/json"}, "X-Request-Id": {"0123456789abcdef0123456789abcdef"}},
		Body: bytes.Repeat([]byte("x"), size)}
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	// warm: a few records first so that script caches and client buffers are in place
	for i := 0; i < 10; i++ {
		k := claim.NewKey(nil, fmt.Sprintf("warm-%d", i))
		l, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || l == nil {
			t.Fatal(err)
		}
		if err := l.Complete(ctx, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	m0 := infoMemory(t, rdb, "used_memory")
	for i := 0; i < n; i++ {
		k := claim.NewKey(nil, fmt.Sprintf("k-%d-%d", size, i))
		l, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || l == nil {
			t.Fatal(err)
		}
		if err := l.Complete(ctx, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	m1 := infoMemory(t, rdb, "used_memory")
	return float64(m1-m0) / float64(n)
}

// TestReview70ReadmeSizingTable (passes: evidence, not a finding): the
// README's "Sizing" table (KB = 1000 bytes), re-measured on the
// redis-server on PATH through claim.Store with KEY_PREFIX idem:, a 201 with
// two headers, INFO used_memory over the records written: within 10 % (60 bytes for the smallest).
func TestReview70ReadmeSizingTable(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, row := range []struct {
		body, hash, str int
	}{{0, 900, 400}, {200, 1100, 600}, {1000, 2100, 1500}, {10000, 11000, 10400}, {100000, 116000, 115000}} {
		n := 1000
		if row.body >= 100000 {
			n = 100
		}
		h := review70PerRecord(t, rdb, false, row.body, n)
		s := review70PerRecord(t, rdb, true, row.body, n)
		t.Logf("body %6d: hash %7.0f B (README %d), string %7.0f B (README %d)", row.body, h, row.hash, s, row.str)
		for _, c := range [][2]float64{{h, float64(row.hash)}, {s, float64(row.str)}} {
			// The README rounds to 0.1 KB: 10 %, or 60 bytes for the smallest.
			if tol := max(c[1]*0.1, 60); c[0] < c[1]-tol || c[0] > c[1]+tol {
				t.Errorf("body %d: measured %.0f B per record, README says %.0f", row.body, c[0], c[1])
			}
		}
	}
}
