package main

import (
	"crypto/sha256"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/bench/leastdesign"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Review 79: -script onehash prices leastdesign's two scripts and nothing
// else. TestIterationModes cannot tell it from -script scripts (idemproxy's
// Store also leaves a hash with a 24 h TTL and the answer in field rec, and
// refuses the key again), so a onehash branch that fell through to the Store
// passed it. This pins the scripts (by SHA), the five commands inside them,
// the record's two fields, and the refusal of a key another claim holds in
// flight (not only of a completed one).
func TestReview79OnehashModeRunsLeastDesign(t *testing.T) {
	ctx, rdb, ap := startRedis(t)
	for _, c := range [][]any{{"SCRIPT", "FLUSH"}, {"FLUSHALL"}, {"CONFIG", "RESETSTAT"}} {
		if err := rdb.Do(ctx, c...).Err(); err != nil {
			t.Fatal(c, err)
		}
	}
	iter, err := iteration(ap, "onehash", "idem:")
	if err != nil {
		t.Fatal(err)
	}
	if err := iter(ctx, "k1"); err != nil {
		t.Fatalf("first iteration: %v", err)
	}
	// The scripts that ran are leastdesign's, the text ceilingproxy runs.
	ok, err := rdb.ScriptExists(ctx, leastdesign.ClaimHash.Hash(), leastdesign.CompleteHash.Hash()).Result()
	if err != nil || len(ok) != 2 || !ok[0] || !ok[1] {
		t.Errorf("leastdesign's scripts loaded: %v (%v), want both", ok, err)
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cmdstat_hsetnx:calls=1,", "cmdstat_pexpire:calls=2,", "cmdstat_hget:calls=1,", "cmdstat_hset:calls=1,"} {
		if !strings.Contains(stats, want) {
			t.Errorf("want %s in the commands of one iteration:\n%s", want, stats)
		}
	}
	for _, not := range []string{"cmdstat_time:", "cmdstat_hmget:"} {
		if strings.Contains(stats, not) {
			t.Errorf("%s ran: not onehash's first request:\n%s", not, stats)
		}
	}
	rk := claim.RecordKey("idem:", claim.NewKey(nil, "k1"))
	h, err := rdb.HGetAll(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256([]byte(requestBody))
	if len(h) != 2 || len(h["c"]) != 16+sha256.Size || h["c"][16:] != string(fp[:]) || h["rec"] == "" {
		fields := make([]string, 0, len(h))
		for k := range h {
			fields = append(fields, k)
		}
		slices.Sort(fields)
		t.Errorf("record fields %q, want c (token and fingerprint) and rec only", fields)
	}
	// A key claimed by another request and still in flight is refused too.
	rk2 := claim.RecordKey("idem:", claim.NewKey(nil, "k2"))
	v, err := leastdesign.ClaimHash.Run(ctx, rdb, []string{rk2}, "0123456789abcdef", fp[:], 60000).StringSlice()
	if err != nil || len(v) != 1 || v[0] != "claimed" {
		t.Fatalf("pre-claim: %q %v", v, err)
	}
	if err := iter(ctx, "k2"); err == nil || !strings.Contains(err.Error(), "inflight") {
		t.Errorf("iteration on a key in flight under another token: %v, want refused (inflight)", err)
	}
}

// Review 79: iteration is the only gate between a mode name and what it
// runs; a name it does not know must not run idemproxy's scripts under
// that name.
func TestReview79IterationRefusesUnknownMode(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	defer rdb.Close()
	if _, err := iteration(rdb, "onehsah", "idem:"); err == nil {
		t.Errorf("iteration accepted an unknown mode (it runs idemproxy's scripts under that name)")
	}
}
