package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysPurgeEmptyStateIsUsageError: `--state ""` (a script's unset
// variable) is a usage error, never a purge without a check. (Found by
// review: it deleted whatever was there.)
func TestKeysPurgeEmptyStateIsUsageError(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "idem:", nil)
	for _, args := range [][]string{{"--state", ""}, {"--state="}} {
		k := claim.NewKey(nil, "empty-state-"+strings.Join(args, ""))
		lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{1}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
		if err != nil || lease == nil {
			t.Fatalf("claim: %v %v", lease, err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := keysRun(t, env, append([]string{"purge", k.String()}, args...)...)
		n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result()
		if code != 2 || n != 1 {
			t.Errorf("keys purge %q of a completed record: exit %d, record left %d\nstdout %s\nstderr %s\nwant a usage error (exit 2) and the record kept",
				args, code, n, out, errOut)
		}
	}
}
