package main

// Review of issue 13: the execution's trace id is kept with the record
// (field tr) so an operator can go from a key to the execution's trace, but
// `idemproxy keys get` (the tool the runbook sends them to) does not show it.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestReview13KeysGetShowsExecutionTrace(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "idem:", nil)
	k := claim.NewKey([]string{""}, "traced")
	lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v %v", lease, err)
	}
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte(`{}`), Trace: tr}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := rdb.HGet(ctx, "idem:{"+k.String()+"}", "tr").Val(); got != tr {
		t.Fatalf("field tr: got %q, want %q", got, tr)
	}
	out := keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "get", k.String())
	if !strings.Contains(out, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("keys get: the execution's trace id is not shown; got\n%s", out)
	}
}
